"""A local port forwarded over SSH to a server's API port, for VMs that expose only SSH.

kubectl-level calls and Helm use `https://127.0.0.1:<local port>`; k3s puts 127.0.0.1 in
its serving certificate, so TLS verification still holds through the tunnel.
"""

from __future__ import annotations

from bootstrap.errors import BootstrapError
from bootstrap.remote import sshlink
from bootstrap.inventory.model import Inventory, Node
from bootstrap.state.folder import StateDir

API_PORT = 6443


class TunnelError(BootstrapError):
    pass


def connect_ssh(inventory: Inventory, node: Node, state: StateDir) -> sshlink.NodeClient:
    """A paramiko client on the node, through ssh.jump when it has one (first-contact keys
    are pinned: callers hold the cluster lock)."""
    state.ensure()
    try:
        return sshlink.connect(inventory, node, state.known_hosts)
    except sshlink.SshUnreachable as exc:
        raise TunnelError(f"cannot reach {node.name} over SSH: {exc.message}", exc.hint) from None


class Tunnel:
    """`with Tunnel(...) as port:` forwards 127.0.0.1:port to the server's 127.0.0.1:6443
    (the forwarding itself is bootstrap.remote.sshlink.PortForward)."""

    def __init__(self, inventory: Inventory, node: Node, state: StateDir, remote_port: int = API_PORT,
                 local_port: int = 0, client=None):
        """`client`: an SSH connection to the node that is already open (the hosts' session
        has one): its transport carries the forwarded channels, and it stays open."""
        self.inventory, self.node, self.state = inventory, node, state
        self.remote_port, self.local_port = remote_port, local_port
        self._client = client
        self._borrowed = client is not None
        self._forward: sshlink.PortForward | None = None
        self.port = 0

    def __enter__(self) -> int:
        if not self._borrowed:
            self._client = connect_ssh(self.inventory, self.node, self.state)
            sshlink.watch_for_dead_peers(self._client)
        self._forward = sshlink.PortForward(self._client, self.remote_port, self.local_port)
        try:
            self.port = self._forward.start()
        except OSError as exc:
            self._close_client()
            raise TunnelError(f"cannot listen on 127.0.0.1:{self.local_port}: {exc.strerror}",
                              "choose another --port") from None
        return self.port

    def __exit__(self, *exc) -> None:
        if self._forward:
            self._forward.stop()
        self._close_client()

    def _close_client(self) -> None:
        if self._client and not self._borrowed:
            self._client.close()
