"""Does any server's k3s answer? Asked at the connection level, through SSH on each server.

An HTTP status says nothing about whether the control plane is lost: a stale kubeconfig
gives 401, RBAC 403, an overloaded API 5xx, while etcd is fine. Restoring a snapshot
over a live control plane throws away everything written since. So the only evidence
that counts is, per server: does SSH answer, is k3s's service active, and does the API
port on the server's own loopback accept a connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.remote.tunnel import API_PORT, connect_ssh
from bootstrap.errors import BootstrapError
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.k3s_service import unit_name
from bootstrap.remote.sshlink import SSH_ERRORS
from bootstrap.inventory.model import Inventory, Node, Role
from bootstrap.state.folder import StateDir

SERVER_UNIT = unit_name(Role.SERVER)


@dataclass(frozen=True)
class ServerLiveness:
    node: str
    answers: bool
    reason: str  # what was seen, for people


def service_verdict(node: Node, facts: HostFacts | None) -> ServerLiveness | None:
    """Pure: a verdict from the facts alone when they settle it, else None (ask the port)."""
    if facts is None:
        return ServerLiveness(node.name, False, "does not answer over SSH")
    unit = facts.k3s.unit(SERVER_UNIT) if facts.k3s else None
    if unit is None:
        return ServerLiveness(node.name, False, "has no k3s service")
    if not unit.active:
        return ServerLiveness(node.name, False, f"k3s is not running ({unit.active_state})")
    return None


def api_port_accepts(inventory: Inventory, node: Node, state: StateDir) -> tuple[bool, str]:
    """Open a direct-tcpip channel to the server's 127.0.0.1:6443: sshd opens it only when
    the TCP connection on the server succeeds."""
    try:
        client = connect_ssh(inventory, node, state)
    except BootstrapError as exc:
        return False, exc.message
    try:
        channel = client.get_transport().open_channel("direct-tcpip", ("127.0.0.1", API_PORT),
                                                      ("127.0.0.1", 0), timeout=10)
        channel.close()
        return True, f"k3s is running and its API port {API_PORT} accepts connections"
    except SSH_ERRORS as exc:
        return False, f"k3s is running but its API port {API_PORT} refuses connections ({exc or 'refused'})"
    finally:
        client.close()


def servers_liveness(inventory: Inventory, state: StateDir, facts: dict[str, HostFacts],
                     port_check=None) -> list[ServerLiveness]:
    """`port_check(inventory, node, state) -> (accepts, reason)`: api_port_accepts (tests: a fake)."""
    port_check = port_check or api_port_accepts
    found = []
    for server in inventory.servers:
        verdict = service_verdict(server, facts.get(server.name))
        if verdict is None:
            answers, reason = port_check(inventory, server, state)
            verdict = ServerLiveness(server.name, answers, reason)
        found.append(verdict)
    return found
