"""A machine re-created under the same name (a spot VM replaced, a host reinstalled) must
lose its old Node before it joins, in `up` as in `rebuild`.

k3s keeps `<name>.node-password.k3s` in kube-system and refuses a new machine's node
password while it exists (k3s-io/k3s pkg/nodepassword/nodepassword.go verifyHash, answered
403 by pkg/nodepassword/validate.go; the agent then retries for ever: "Node password
rejected, duplicate hostname ...", pkg/agent/config/config.go). A server's new etcd member
is refused while the old one is listed ("duplicate node name found", pkg/etcd/etcd.go,
join). Both go with the Node: the secret is owned by it (pkg/nodepassword/controller.go)
and a server's member is removed first through k3s's removal annotation
(bootstrap.cluster.node_removal). So the Node is deleted through the API, before the join.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.cluster.node_status import is_server, node_ready
from bootstrap.errors import BootstrapError
from bootstrap.rules.lost_nodes import fresh, replaced_machines


def cluster_nodes(inventory, state, connect=connect_to_cluster):
    """({name: Node}, None) through any server that answers, or (None, why not)."""
    from bootstrap.cluster.client import ClusterError, get

    try:
        with connect(inventory, state) as cluster:
            nodes = get(cluster, "/api/v1/nodes") or {}
            return {n["metadata"]["name"]: n for n in nodes.get("items", [])}, None
    except (ClusterError, BootstrapError) as exc:
        return None, exc.message
    except Exception as exc:  # the client's own errors (ApiException, urllib3): the cause, not a verdict
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def remove_nodes(inventory, state, names: list[str], servers: list[str], connect=connect_to_cluster) -> None:
    """Each Node and its node-password secret; `servers` leave etcd first."""
    from bootstrap.cluster.node_removal import remove_node

    if not names:
        return
    with connect(inventory, state) as cluster:
        for name in names:
            remove_node(cluster, name, etcd_member=name in servers)


@dataclass
class Replaced:
    names: list[str] = field(default_factory=list)  # inventory hosts that are new machines
    servers: list[str] = field(default_factory=list)  # of `names`: etcd members
    join_via: object = None  # a healthy server to join when the first server is replaced


def find_replaced(inventory, state, facts, console, connect=connect_to_cluster) -> Replaced:
    """Read only. Asked only of a cluster that exists (the state folder has its kubeconfig)
    and only when a host has no k3s: a converged `up` costs no API call."""
    if not (state.path / "kubeconfig").exists() or not any(fresh(facts.get(n.name)) for n in inventory.nodes):
        return Replaced()
    nodes, error = cluster_nodes(inventory, state, connect)
    if nodes is None:
        console.say(f"cannot ask the cluster whether a host without k3s replaces one of its machines ({error}); "
                    "a machine re-created under an old name is refused by k3s until its Node is gone: "
                    "`bootstrap rebuild INVENTORY` removes it")
        return Replaced()
    names = replaced_machines(inventory, nodes, facts)
    found = Replaced(names, [n for n in names if is_server(nodes[n])])
    first = inventory.servers[0]
    if first.name in names:
        # It must join a healthy server, not start a cluster of its own (cluster-init).
        found.join_via = next((s for s in inventory.servers if s.name not in names and s.name in facts
                               and s.name in nodes and node_ready(nodes[s.name])), None)
    return found


def clear_replaced(inventory, state, replaced: Replaced, console, connect=connect_to_cluster) -> None:
    if not replaced.names:
        return
    remove_nodes(inventory, state, replaced.names, replaced.servers, connect)
    for name in replaced.names:
        console.say(f"{name}: a new machine under this name: its old Node and node-password secret were "
                    "removed so it can join")
