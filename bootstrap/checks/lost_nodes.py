"""What `rebuild` must do, from the inventory, the cluster's Node objects and which hosts
answer over SSH. Pure; the command carries it out.

- lost: a Node that is not Ready and whose machine is gone (no answer over SSH), and any
  Node whose name now belongs to another machine (a replacement), Ready or not;
- replaced: the inventory's host under a Node's name is another machine than the one that
  registered it: it has no k3s at all, or its /etc/machine-id is not the Node's machineID.
  k3s refuses the newcomer while the old Node is there: an agent's new node password does
  not match the <name>.node-password.k3s secret (k3s-io/k3s pkg/nodepassword/
  nodepassword.go, verifyHash; pkg/nodepassword/validate.go answers 403), a server's etcd
  member name is taken ("duplicate node name found", pkg/etcd/etcd.go, join). Deleting the
  Node removes both (the secret is owned by its Node, pkg/nodepassword/controller.go; the
  member goes with it, pkg/etcd/member_controller.go onRemove);
- replacements: inventory nodes that answer but are not (healthy) cluster members;
- a lost control plane: no server answers; the first server in the inventory is restored
  from the newest snapshot, with the old token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.cluster.node_status import is_server, node_ready
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory


@dataclass
class RebuildPlan:
    lost: list[str] = field(default_factory=list)  # Node objects to remove
    lost_servers: list[str] = field(default_factory=list)  # of `lost`: etcd members to remove first
    join: list[str] = field(default_factory=list)  # inventory nodes to prepare and join
    healthy: list[str] = field(default_factory=list)
    restore_on: str | None = None  # the server to restore the control plane onto
    unreachable: list[str] = field(default_factory=list)  # inventory hosts not answering


def fresh(facts: HostFacts | None) -> bool:
    """No k3s on the host: no binary, config or unit (and its probe did not find one on
    PATH either, so a probe cut short before its k3s section is not read as a new machine)."""
    return facts is not None and facts.k3s is None and "k3s" not in facts.commands


def machine_changed(node: dict, facts: HostFacts | None) -> bool:
    """The host answering under this Node's name is not the machine that registered it."""
    if facts is None:
        return False
    if fresh(facts):
        return True
    registered = node.get("status", {}).get("nodeInfo", {}).get("machineID")
    return bool(registered and facts.machine_id and registered != facts.machine_id)


def replaced_machines(inventory: Inventory, cluster_nodes: dict[str, dict],
                      facts: dict[str, HostFacts]) -> list[str]:
    """Inventory hosts that answer and are another machine than their name's Node: that
    Node (and its node-password secret) must go before the new machine can join."""
    return sorted(n.name for n in inventory.nodes
                  if n.name in cluster_nodes and machine_changed(cluster_nodes[n.name], facts.get(n.name)))


def classify(inventory: Inventory, cluster_nodes: dict[str, dict] | None,
             facts: dict[str, HostFacts]) -> RebuildPlan:
    """`cluster_nodes` is None when no API could be reached (control plane lost)."""
    plan = RebuildPlan(unreachable=[n.name for n in inventory.nodes if n.name not in facts])
    if cluster_nodes is None:
        first = inventory.servers[0]
        plan.restore_on = first.name if first.name in facts else None
        plan.join = [n.name for n in inventory.nodes if n.name in facts]
        return plan
    replaced = set(replaced_machines(inventory, cluster_nodes, facts))
    for name, node in sorted(cluster_nodes.items()):
        in_inventory = any(n.name == name for n in inventory.nodes)
        gone = name not in facts
        # A replaced machine's old Node may still say Ready (its grace period has not run
        # out): it goes all the same, or the new machine cannot join.
        if name in replaced or (not node_ready(node) and (gone or not in_inventory)):
            plan.lost.append(name)
            if is_server(node):
                plan.lost_servers.append(name)
    for node in inventory.nodes:
        if node.name not in facts:
            continue
        member = node.name in cluster_nodes and node.name not in plan.lost
        if member and node_ready(cluster_nodes[node.name]):
            plan.healthy.append(node.name)
        else:
            plan.join.append(node.name)
    return plan


def quorum_after(inventory: Inventory, lost_servers: list[str]) -> bool:
    total = len(inventory.servers)
    return total - len(lost_servers) > total // 2


def stale_after_restore(inventory: Inventory, cluster_nodes: dict[str, dict], facts: dict[str, HostFacts]) -> list[str]:
    """After a restore, the snapshot's Node objects still say Ready for machines that are
    gone (until the node controller's grace period runs out): any node the inventory no
    longer names, or whose host does not answer, is stale."""
    names = {n.name for n in inventory.nodes}
    return sorted(name for name in cluster_nodes if name not in names or name not in facts)
