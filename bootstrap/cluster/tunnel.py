"""A local port forwarded over SSH to a server's API port, for VMs that expose only SSH.

kubectl-level calls and Helm use `https://127.0.0.1:<local port>`; k3s puts 127.0.0.1 in
its serving certificate, so TLS verification still holds through the tunnel.
"""

from __future__ import annotations

import select
import socket
import threading
import paramiko

from bootstrap.errors import BootstrapError
from bootstrap.hosts import sshlink
from bootstrap.inventory.model import Inventory, Node
from bootstrap.statedir import StateDir

API_PORT = 6443


class TunnelError(BootstrapError):
    pass


def connect_ssh(inventory: Inventory, node: Node, state: StateDir) -> paramiko.SSHClient:
    """A paramiko client on the node, through ssh.jump when it has one (first-contact keys
    are pinned: callers hold the cluster lock)."""
    state.ensure()
    try:
        return sshlink.connect(inventory, node, state.known_hosts)
    except sshlink.SshUnreachable as exc:
        raise TunnelError(f"cannot reach {node.name} over SSH: {exc.message}", exc.hint) from None


class Tunnel:
    """`with Tunnel(...) as port:` forwards 127.0.0.1:port to the server's 127.0.0.1:6443."""

    def __init__(self, inventory: Inventory, node: Node, state: StateDir, remote_port: int = API_PORT,
                 local_port: int = 0, client: paramiko.SSHClient | None = None):
        """`client`: an SSH connection to the node that is already open (the hosts' session
        has one): its transport carries the forwarded channels, and it stays open."""
        self.inventory, self.node, self.state = inventory, node, state
        self.remote_port, self.local_port = remote_port, local_port
        self._client: paramiko.SSHClient | None = client
        self._borrowed = client is not None
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self.port = 0

    def __enter__(self) -> int:
        if not self._borrowed:
            self._client = connect_ssh(self.inventory, self.node, self.state)
            from bootstrap.hosts.session import detect_dead_peer

            detect_dead_peer(self._client.get_transport().sock)
            for transport in self._client.jumps.transports() if self._client.jumps else ():
                detect_dead_peer(transport.sock)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.bind(("127.0.0.1", self.local_port))
        except OSError as exc:
            self._listener.close()
            self._close_client()
            raise TunnelError(f"cannot listen on 127.0.0.1:{self.local_port}: {exc.strerror}",
                              "choose another --port") from None
        self._listener.listen(32)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="tunnel-accept", daemon=True).start()
        return self.port

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._listener:
            self._listener.close()
        self._close_client()

    def _close_client(self) -> None:
        if self._client and not self._borrowed:
            self._client.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                local, _ = self._listener.accept()
            except OSError:
                return
            # The channel is opened in the connection's own thread: opening one costs a round
            # trip, and connections that arrive together (parallel requests, Helm's) must not
            # wait for each other's.
            threading.Thread(target=self._forward, args=(local,), daemon=True).start()

    def _forward(self, local: socket.socket) -> None:
        try:
            channel = self._client.get_transport().open_channel(
                "direct-tcpip", ("127.0.0.1", self.remote_port), local.getpeername())
        except (paramiko.SSHException, OSError, EOFError):
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
        except (OSError, EOFError, paramiko.SSHException):
            # The SSH connection was cut under a live request: the request's own caller sees
            # its connection reset and reports it; this thread must end quietly, since an
            # uncaught exception here prints a traceback to the operator's terminal.
            pass
        finally:
            channel.close()
            local.close()
