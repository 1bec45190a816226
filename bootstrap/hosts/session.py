"""A pyinfra session over the inventory's hosts: parallel connect, per-host failures as data.

pyinfra is driven through its Python API. A host that cannot be reached, refuses its
pinned key or cannot sudo gets one clear line; the other hosts carry on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import UsageError
from bootstrap.hosts import hostkeys
from bootstrap.inventory.model import Inventory, Node
from bootstrap.secrets import resolve
from bootstrap.statedir import StateDir


@dataclass(frozen=True)
class HostFailure:
    node: str
    message: str
    hint: str | None = None

    def render(self) -> str:
        return f"{self.node}: {self.message}" + (f" ({self.hint})" if self.hint else "")


def explain_connect_error(node: Node, address: str, port: int, error: str, inventory: Inventory) -> HostFailure:
    """Turn pyinfra's connect errors into a line that says what to do."""
    text = str(error)
    if "host key" in text.lower():
        return HostFailure(
            node.name,
            f"SSH host key of {hostkeys.known_hosts_entry(address, port)} changed since it was pinned; refusing to connect",
            f"if {node.name} was replaced by a new machine, run: bootstrap forget-host {inventory.source} {node.name}",
        )
    if "Authentication" in text:
        return HostFailure(node.name, f"SSH authentication failed ({text.split('(', 1)[-1].rstrip(')')})",
                           "check ssh.user and ssh.key in the inventory")
    if "resolve" in text:
        return HostFailure(node.name, f"cannot resolve host name {address}")
    if "timed out" in text.lower():
        return HostFailure(node.name, f"SSH to {address}:{port} timed out", "is the machine up and port open?")
    if "refused" in text.lower() or "Could not connect" in text:
        return HostFailure(node.name, f"cannot connect to SSH at {address}:{port} ({_reason(text)})",
                           "is the machine running and sshd up?")
    return HostFailure(node.name, f"SSH error: {_reason(text)}")


def _reason(text: str) -> str:
    # pyinfra wraps errors as "Could not connect (…)"; keep the innermost reason.
    return text.strip().splitlines()[-1] if text.strip() else "unknown error"


def detect_dead_peer(sock, idle_s: int = 10, interval_s: int = 5, probes: int = 3) -> None:
    """A spot VM that vanishes sends no RST: without this an SSH command waits on it for
    the kernel's ~15 minute retransmission limit. TCP keepalives (and a user time-out for
    unacknowledged data) turn a dead host into a failed command within about 25 seconds."""
    import socket

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


class HostSession:
    """Connect once, run facts and deploys, disconnect. Use as a context manager."""

    def __init__(self, inventory: Inventory, state: StateDir, nodes: list[Node] | None = None,
                 log_file: Path | None = None):
        self.inventory = inventory
        self.state_dir = state
        self.nodes = list(nodes if nodes is not None else inventory.nodes)
        self.failures: dict[str, HostFailure] = {}
        self.log_file = log_file
        self._state = None

    # -- pyinfra plumbing ---------------------------------------------------------------------
    def _host_data(self, node: Node) -> dict:
        ssh = self.inventory.ssh_for(node)
        data: dict = {
            "ssh_hostname": node.address,
            "ssh_port": ssh.port,
            "ssh_user": ssh.user,
            "ssh_known_hosts_file": str(self.state_dir.known_hosts),
            "ssh_strict_host_key_checking": "accept-new",
            "ssh_connect_retries": 2,
            "ssh_allow_agent": True,
            "_sudo": ssh.use_sudo,
        }
        if ssh.key:
            key = Path(ssh.key).expanduser()
            if not key.is_absolute():
                key = (Path(self.inventory.source).parent / key).resolve()
            if not key.exists():
                raise UsageError(f"SSH key {key} (ssh.key for node {node.name}) does not exist",
                                 "fix ssh.key in the inventory, or remove it to use your SSH agent")
            data["ssh_key"] = str(key)
        password = resolve(ssh.password, f"ssh password for {node.name}")
        if password:
            data["ssh_password"] = password
            data["_sudo_password"] = password
        passphrase = resolve(ssh.key_passphrase, f"ssh key passphrase for {node.name}")
        if passphrase:
            data["ssh_key_password"] = passphrase
        if ssh.jump:
            data["ssh_config_file"] = str(self._write_jump_config())
        return data

    def _write_jump_config(self) -> Path:
        """paramiko follows ProxyJump from an ssh_config; write one per cluster with pinned keys."""
        lines = []
        for node in self.inventory.nodes:
            ssh = self.inventory.ssh_for(node)
            if not ssh.jump:
                continue
            lines += [f"Host {node.address}", f"    ProxyJump {ssh.jump}", ""]
        jumps = {self.inventory.ssh_for(n).jump for n in self.inventory.nodes} - {None}
        for jump in sorted(jumps):
            host = jump.split("@")[-1].rsplit(":", 1)[0]
            lines += [f"Host {host}", f"    UserKnownHostsFile {self.state_dir.known_hosts}",
                      "    StrictHostKeyChecking accept-new", ""]
        self.state_dir.ssh_config.write_text("\n".join(lines))
        return self.state_dir.ssh_config

    def __enter__(self) -> "HostSession":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        from pyinfra.api import BaseStateCallback, Config, Inventory as PyInventory, State
        from pyinfra.api.connect import connect_all
        from pyinfra.api.exceptions import PyinfraError
        from pyinfra.api.state import StateStage

        self.state_dir.ensure()
        self._configure_logging()
        names = [(node.name, self._host_data(node)) for node in self.nodes]
        py_inventory = PyInventory((names, {}))
        timeout = max(self.inventory.ssh_for(n).connect_timeout for n in self.nodes) if self.nodes else 10
        config = Config(PARALLEL=min(len(self.nodes), 100) or 1, CONNECT_TIMEOUT=timeout, FAIL_PERCENT=None)
        state = State(py_inventory, config)
        session = self

        class Callbacks(BaseStateCallback):
            def host_connect_error(self, state, host, error):
                node = session.inventory.node(host.name)
                ssh = session.inventory.ssh_for(node)
                session.failures[host.name] = explain_connect_error(node, node.address, ssh.port, error,
                                                                    session.inventory)

        state.add_callback_handler(Callbacks())
        state.set_stage(StateStage.Connect)
        try:
            connect_all(state)
        except PyinfraError:
            pass  # "No hosts remaining!": every host is already in self.failures
        hostkeys.dedupe(self.state_dir.known_hosts)
        for host in state.active_hosts:
            client = getattr(host.connector, "client", None)
            if client is not None and client.get_transport() is not None:
                detect_dead_peer(client.get_transport().sock)
        for host in list(state.inventory):
            if host.name not in self.failures and host not in state.active_hosts:
                self.failures[host.name] = HostFailure(host.name, "could not connect")
        self._state = state

    def close(self) -> None:
        if self._state is not None:
            from pyinfra.api.connect import disconnect_all

            disconnect_all(self._state)
            self._state = None

    def _configure_logging(self) -> None:
        """pyinfra and paramiko log to the run log only, at INFO: pyinfra's DEBUG lines include
        connection kwargs, and paramiko prints tracebacks for errors we report in one line."""
        handler: logging.Handler = logging.NullHandler()
        if self.log_file:
            self.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            handler = logging.FileHandler(self.log_file)
            handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        for name in ("pyinfra", "paramiko"):
            logger = logging.getLogger(name)
            logger.propagate = False
            logger.setLevel(logging.INFO)
            for old in list(logger.handlers):
                logger.removeHandler(old)
            logger.addHandler(handler)

    # -- what callers use ---------------------------------------------------------------------
    @property
    def pyinfra_state(self):
        return self._state

    def active_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.name not in self.failures]

    def fail(self, name: str, message: str, hint: str | None = None) -> None:
        """Record a failure for one host and stop running anything more on it."""
        self.failures.setdefault(name, HostFailure(name, message, hint))
        # Not State.fail_hosts: it raises once no host is left, and the caller still wants
        # to report every host's line before deciding the exit code.
        host = self._state.inventory.get_host(name)
        self._state.failed_hosts.add(host)
        self._state.active_hosts.discard(host)

    def gather(self, fact_cls, **fact_kwargs) -> dict:
        """Run one fact on every active host in parallel: {node name: value}."""
        from pyinfra.api.facts import get_facts

        if not self._state.active_hosts:
            return {}
        results = get_facts(self._state, fact_cls, kwargs={"_sudo": False, **fact_kwargs})
        return {host.name: value for host, value in results.items() if host.name not in self.failures}
