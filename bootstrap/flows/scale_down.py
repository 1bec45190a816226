"""Scale-down (`bootstrap scale-down`): drain, delete and uninstall chosen nodes.

Refuses to remove the last server or to break etcd quorum. Ends by printing the inventory
edit to make, so the next `up` does not bring the node back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.errors import HostsFailed, UsageError
from bootstrap.hosts.connections import open_hosts, report_failures
from bootstrap.inventory.model import Role
from bootstrap.lock import cluster_lock
from bootstrap.rules.lost_nodes import quorum_after


@dataclass
class ScaleDownOptions:
    nodes: list[str] = field(default_factory=list)  # by name, or
    idle: bool = False                               # every GPU agent without GPU pods
    drain_timeout: int = 300
    force: bool = False                              # delete pods a disruption budget protects
    purge_drivers: bool = False


def scale_down(inventory, state, options: ScaleDownOptions, console, *, connect=connect_to_cluster,
               open_session=open_hosts) -> None:
    """`connect(inventory, state)`: the cluster; `open_session(inventory, nodes, command,
    console)`: the hosts (fakes in tests)."""
    from bootstrap.cluster.drain import cordon, drain
    from bootstrap.cluster.node_removal import remove_node
    from bootstrap.flows.uninstall import uninstall

    if not options.nodes and not options.idle:
        raise UsageError("name the nodes to remove with --node NAME (repeatable), or use --idle")
    with cluster_lock(state, "scale-down"):
        with connect(inventory, state) as cluster:
            nodes = choose(inventory, options, cluster)
            if not nodes:
                console.say("nothing to remove: no idle GPU node" if options.idle else "nothing to remove")
                return
            refuse_losing_the_control_plane(inventory, nodes)
            blocked = {}
            for node in nodes:
                cordon(cluster, node.name)
                result = drain(cluster, node.name, options.drain_timeout, options.force)
                console.say(f"{node.name}: cordoned; evicted {len(result.evicted)} pod(s)"
                            + (f", deleted {len(result.forced)} after the time-out" if result.forced else ""))
                if not result.complete:
                    blocked[node.name] = result.blocked
                    continue
                remove_node(cluster, node.name, etcd_member=node.role == Role.SERVER)
        if blocked:
            lines = [f"{name}: {pod} ({why})" for name, pods in blocked.items() for pod, why in pods.items()]
            raise HostsFailed("drain blocked; these nodes were left cordoned:\n  " + "\n  ".join(lines),
                              "fix the PodDisruptionBudgets, or re-run with --force to delete the pods")
        removed = [n for n in nodes if n.name not in blocked]
        with open_session(inventory, removed, "scale-down", console) as session:
            uninstall(session, inventory, state, removed, options.purge_drivers, console)
        report_failures(session.failures)
    console.say("now remove from " + inventory.source + ": " + ", ".join(f"the node named {n.name}" for n in removed))
    for node in removed:
        console.say(f"  - {{name: {node.name}, address: {node.address}, role: {node.role}}}")


def choose(inventory, options: ScaleDownOptions, cluster) -> list:
    from bootstrap.cluster.client import get
    from bootstrap.cluster.drain import gpu_pods_on

    if options.idle:
        chosen = []
        for node in inventory.agents:
            labels = (get(cluster, f"/api/v1/nodes/{node.name}") or {}).get("metadata", {}).get("labels", {})
            if labels.get("nvidia.com/gpu.present") == "true" and not gpu_pods_on(cluster, node.name):
                chosen.append(node)
        return chosen
    unknown = [n for n in options.nodes if n not in {x.name for x in inventory.nodes}]
    if unknown:
        raise UsageError(f"no node named {', '.join(unknown)} in {inventory.source}")
    return [inventory.node(n) for n in options.nodes]


def refuse_losing_the_control_plane(inventory, nodes) -> None:
    servers = [n.name for n in nodes if n.role == Role.SERVER]
    if servers and len(servers) >= len(inventory.servers):
        raise UsageError(f"refusing to remove {', '.join(servers)}: the cluster would have no server left",
                         "remove agents, or tear the whole cluster down with `bootstrap down`")
    if servers and not quorum_after(inventory, servers):
        raise UsageError(f"refusing to remove {', '.join(servers)}: etcd would lose quorum",
                         "remove one server at a time, and keep a majority")
