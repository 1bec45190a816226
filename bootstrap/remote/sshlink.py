"""paramiko, where pyinfra has no API: the bastion hop (ssh.jump) under every connection,
pyinfra's included, the direct client the API tunnel and the snapshot use, the API tunnel's
port forwarding, and TCP keepalives that turn a vanished host into a failed command. The
one module of the tool that imports paramiko (bootstrap.remote.pyinfra_link reaches the
client under pyinfra's connection; tests/unit/test_import_cycles.py checks that no other does).

No inventory string ever becomes ssh_config text (where a newline in an address could add
a ProxyCommand that runs on the operator's machine): the bastion is reached with a paramiko
client of our own, its key pinned in the cluster's known_hosts, and a `direct-tcpip`
channel through it is the socket the connection to the node runs over.
"""

from __future__ import annotations

import select
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko
import paramiko.file

from bootstrap.errors import BootstrapError, UsageError
from bootstrap.remote import hostkeys
from bootstrap.inventory.model import Inventory, Node
from bootstrap.state.secrets import resolve, ssh_password


class SshUnreachable(BootstrapError):
    pass


# What a paramiko connection raises when the host is gone or cut it: a host's failure, never a crash.
SSH_ERRORS = (OSError, EOFError, paramiko.SSHException)


@dataclass(frozen=True)
class Endpoint:
    user: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.user}@{hostkeys.known_hosts_entry(self.host, self.port)}"


def parse_jump(jump: str, default_user: str) -> Endpoint:
    """`user@host[:port]`, `[v6]:port` or a bare v6 address; the user defaults to the node's."""
    user, _, hostport = jump.rpartition("@")
    host, port = hostport, 22
    if hostport.startswith("[") and "]" in hostport:
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else 22
    elif hostport.count(":") == 1:
        host, _, text = hostport.partition(":")
        port = int(text) if text.isdigit() else 22
    return Endpoint(user or default_user, host, port)


def key_file(inventory: Inventory, node: Node) -> Path | None:
    """ssh.key, relative to the inventory file."""
    ssh = inventory.ssh_for(node)
    if not ssh.key:
        return None
    key = Path(ssh.key).expanduser()
    if not key.is_absolute():
        key = (Path(inventory.source).parent / key).resolve()
    if not key.exists():
        raise UsageError(f"SSH key {key} (ssh.key for node {node.name}) does not exist",
                         "fix ssh.key in the inventory, or remove it to use your SSH agent")
    return key


def timeout_kwargs(seconds: int) -> dict:
    """paramiko waits 15 s for a banner and 30 s for auth by default; a silent host must cost
    the configured time-out once."""
    return {"timeout": seconds, "banner_timeout": seconds, "auth_timeout": seconds, "channel_timeout": seconds}


def no_answer(address: str, port: int, seconds: int) -> str:
    where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    return f"no SSH answer from {where} in {seconds} s"


SILENT_MARKERS = ("timed out", "error reading ssh protocol banner", "negotiation timed out",
                  "timeout opening channel", "no existing session")


def is_silent(text: str) -> bool:
    """What paramiko says when the port takes the connection (or drops it) and never speaks."""
    return any(marker in text.lower() for marker in SILENT_MARKERS)


def client_kwargs(inventory: Inventory, node: Node) -> dict:
    """Authentication (ssh.key or the agent and default keys) and time-outs for paramiko."""
    ssh = inventory.ssh_for(node)
    key = key_file(inventory, node)
    kwargs: dict = {"username": ssh.user, "allow_agent": key is None, "look_for_keys": key is None,
                    **timeout_kwargs(ssh.connect_timeout)}
    if key:
        kwargs["key_filename"] = str(key)
        kwargs["passphrase"] = resolve(ssh.key_passphrase, f"ssh key passphrase for {node.name}")
    return kwargs


class PinFirstContact(paramiko.MissingHostKeyPolicy):
    """First contact pins the key (as `up` does); a changed key is refused by paramiko itself."""

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        hostkeys.pin(self.known_hosts, hostname, key)


class NodeClient(paramiko.SSHClient):
    """A client that closes its bastion connection with itself."""

    jumps: "Jumps | None" = None

    def close(self) -> None:
        super().close()
        if self.jumps is not None:
            self.jumps.close()


def new_client(known_hosts: Path, cls=paramiko.SSHClient) -> paramiko.SSHClient:
    client = cls()
    if known_hosts.exists():
        client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(PinFirstContact(known_hosts))
    return client


def _connect(client: paramiko.SSHClient, host: str, port: int, kwargs: dict, what: str, seconds: int,
             replaced_hint: str | None = None) -> None:
    """client.connect with its failures as one line each."""
    try:
        client.connect(host, port=port, **kwargs)
    except paramiko.BadHostKeyException:
        raise SshUnreachable(f"SSH host key of {what} {hostkeys.known_hosts_entry(host, port)} changed since it "
                             "was pinned; refusing to connect", replaced_hint) from None
    except paramiko.AuthenticationException as exc:
        raise SshUnreachable(f"SSH authentication to {what} {host}:{port} failed ({exc})") from None
    except socket.gaierror:
        raise SshUnreachable(f"cannot resolve host name {host!r} ({what})") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if is_silent(str(exc)) or isinstance(exc, socket.timeout):
            raise SshUnreachable(f"{no_answer(host, port, seconds)} ({what})") from None
        raise SshUnreachable(f"cannot connect to SSH at {what} {host}:{port} ({exc or type(exc).__name__})") from None


class Jumps:
    """Bastion connections of one session, one per bastion and key, shared by its nodes."""

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts
        self._clients: dict[tuple, paramiko.SSHClient] = {}

    def bastion(self, inventory: Inventory, node: Node) -> paramiko.SSHClient:
        ssh = inventory.ssh_for(node)
        endpoint = parse_jump(ssh.jump, ssh.user)
        cache_key = (endpoint, ssh.key)
        if cache_key not in self._clients:
            client = new_client(self.known_hosts)
            _connect(client, endpoint.host, endpoint.port, {**client_kwargs(inventory, node), "username": endpoint.user},
                     "bastion", ssh.connect_timeout)
            self._clients[cache_key] = client
        return self._clients[cache_key]

    def channel(self, inventory: Inventory, node: Node) -> paramiko.Channel:
        """A `direct-tcpip` channel from the bastion to the node's SSH port: the socket the
        node's own SSH connection runs over."""
        ssh = inventory.ssh_for(node)
        transport = self.bastion(inventory, node).get_transport()
        try:
            return transport.open_channel("direct-tcpip", (node.address, ssh.port), ("127.0.0.1", 0),
                                          timeout=ssh.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if is_silent(str(exc)) or isinstance(exc, socket.timeout):
                raise SshUnreachable(f"{no_answer(node.address, ssh.port, ssh.connect_timeout)} "
                                     f"(through bastion {ssh.jump})") from None
            raise SshUnreachable(f"bastion {ssh.jump} cannot reach {node.address}:{ssh.port} "
                                 f"({exc or type(exc).__name__})") from None

    def transports(self) -> list:
        return [c.get_transport() for c in self._clients.values() if c.get_transport() is not None]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def connect(inventory: Inventory, node: Node, known_hosts: Path) -> NodeClient:
    """A paramiko client logged in to the node, through its bastion when it has one;
    closing it closes the bastion connection too."""
    ssh = inventory.ssh_for(node)
    kwargs = client_kwargs(inventory, node)
    password = ssh_password(inventory, node)  # this node's own, never another's
    if password:
        kwargs["password"] = password
    client = new_client(known_hosts, NodeClient)
    if ssh.jump:
        client.jumps = Jumps(known_hosts)
    try:
        if ssh.jump:
            kwargs["sock"] = client.jumps.channel(inventory, node)
        _connect(client, node.address, ssh.port, kwargs, node.name, ssh.connect_timeout,
                 f"if {node.name} was replaced, run: bootstrap rebuild {inventory.source} --replace {node.name} "
                 f"(or first: bootstrap forget-host {inventory.source} {node.name})")
    except BaseException:
        client.close()
        raise
    return client


def detect_dead_peer(sock, idle_s: int = 10, interval_s: int = 5, probes: int = 3) -> None:
    """A spot VM that vanishes sends no RST: without this an SSH command waits on it for
    the kernel's ~15 minute retransmission limit. TCP keepalives (and a user time-out for
    unacknowledged data) turn a dead host into a failed command within about 25 seconds."""
    try:
        if not isinstance(sock, socket.socket):
            return  # a ProxyJump channel: the bastion's connection carries the keepalives
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", probes),
                              ("TCP_USER_TIMEOUT", (idle_s + interval_s * probes) * 1000)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except (AttributeError, OSError):
        pass


def watch_for_dead_peers(client: paramiko.SSHClient) -> None:
    """detect_dead_peer on a client's connection and on its bastion's, if it has one."""
    transport = client.get_transport()
    if transport is not None:
        detect_dead_peer(transport.sock)
    jumps = getattr(client, "jumps", None)  # a NodeClient's bastion connections
    for bastion in jumps.transports() if jumps else ():
        detect_dead_peer(bastion.sock)


def is_open(client) -> bool:
    """Whether a paramiko client's connection is up (it can open channels)."""
    transport = client.get_transport() if client is not None else None
    return transport is not None and transport.is_active()


class PortForward:
    """127.0.0.1:<local port> forwarded over `client`'s connection to the host's
    127.0.0.1:<remote port>, one `direct-tcpip` channel per local connection, each in its
    own thread (greenlet under gevent)."""

    def __init__(self, client: paramiko.SSHClient, remote_port: int, local_port: int = 0):
        self.client, self.remote_port, self.local_port = client, remote_port, local_port
        self._listener: socket.socket | None = None
        self._stop = threading.Event()

    def start(self) -> int:
        """Listen and forward; the local port. OSError when the port cannot be had."""
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.bind(("127.0.0.1", self.local_port))
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(32)
        threading.Thread(target=self._accept, name="tunnel-accept", daemon=True).start()
        return self._listener.getsockname()[1]

    def stop(self) -> None:
        self._stop.set()
        if self._listener:
            self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            # An answer that comes over the channel in pieces (headers, then body) goes on at
            # once: with Nagle a piece waits for the client's delayed ACK (~40 ms a request).
            try:
                local.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # the client left already
                local.close()
                continue
            # The channel is opened in the connection's own thread: opening one costs a round
            # trip, and connections that arrive together (parallel requests, Helm's) must not
            # wait for each other's.
            threading.Thread(target=self._forward, args=(local,), daemon=True).start()

    def _forward(self, local: socket.socket) -> None:
        try:
            channel = self.client.get_transport().open_channel(
                "direct-tcpip", ("127.0.0.1", self.remote_port), local.getpeername())
        except SSH_ERRORS:
            local.close()
            return
        self._pump(local, channel)

    def _pump(self, local: socket.socket, channel) -> None:
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([local, channel], [], [], 1.0)
                if local in readable:
                    data = local.recv(65536)
                    if not data:
                        break
                    channel.sendall(data)
                if channel in readable:
                    data = channel.recv(65536)
                    if not data:
                        break
                    local.sendall(data)
        except SSH_ERRORS:
            # The SSH connection was cut under a live request: the request's own caller sees
            # its connection reset and reports it; this thread must end quietly, since an
            # uncaught exception here prints a traceback to the operator's terminal.
            pass
        finally:
            try:
                channel.close()  # on a cut transport paramiko raises EOFError here too
            except SSH_ERRORS:
                pass
            local.close()


def _lenient_text(data, encoding: str = "utf8") -> str:
    """paramiko.util.u, with bytes that are not UTF-8 replaced (U+FFFD) instead of raising."""
    if isinstance(data, bytes):
        return data.decode(encoding, "replace")
    if isinstance(data, str):
        return data
    raise TypeError(f"Expected unicode or bytes, got {type(data)}")


def decode_remote_output_leniently() -> None:
    """pyinfra reads a command's output line by line from paramiko's text-mode channel
    files, which decode each line as strict UTF-8 (paramiko/file.py, `u(line)`). One byte a
    host prints that is not UTF-8 raised UnicodeDecodeError in pyinfra's reader greenlet:
    the rest of the output was lost, gevent printed the traceback on the operator's terminal,
    and the channel, no longer read, could stall the command until its window drained. A
    host's output is untrusted bytes: they are replaced, as bootstrap.remote_data does.
    (paramiko has no setting for this; the module imports `u` by name, so it is replaced there.)"""
    paramiko.file.u = _lenient_text
