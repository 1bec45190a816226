"""`bootstrap scale-down INVENTORY --node NAME... | --idle`: drain, delete, uninstall.

Refuses to remove the last server or to break etcd quorum. Ends by printing the inventory
edit to make, so the next `up` does not bring the node back.
"""

from __future__ import annotations

from bootstrap import progress
from bootstrap.errors import HostsFailed, UsageError
from bootstrap.inventory.loader import load_inventory
from bootstrap.inventory.model import Role
from bootstrap.lock import cluster_lock
from bootstrap.rules.lost_nodes import quorum_after
from bootstrap.statedir import StateDir


def choose(inventory, args, cluster) -> list:
    from bootstrap.cluster.drain import gpu_pods_on

    if args.idle:
        chosen = []
        for node in inventory.agents:
            labels = ((cluster and _node(cluster, node.name)) or {}).get("metadata", {}).get("labels", {})
            if labels.get("nvidia.com/gpu.present") == "true" and not gpu_pods_on(cluster, node.name):
                chosen.append(node)
        return chosen
    names = args.node or []
    unknown = [n for n in names if n not in {x.name for x in inventory.nodes}]
    if unknown:
        raise UsageError(f"no node named {', '.join(unknown)} in {inventory.source}")
    return [inventory.node(n) for n in names]


def _node(cluster, name):
    from bootstrap.cluster.client import get

    return get(cluster, f"/api/v1/nodes/{name}")


def run(args) -> int:
    from bootstrap.cluster.client import connect
    from bootstrap.cluster.drain import cordon, drain
    from bootstrap.cluster.node_removal import remove_node

    inventory = load_inventory(args.inventory)
    console = progress.console()
    if not args.node and not args.idle:
        raise UsageError("name the nodes to remove with --node NAME (repeatable), or use --idle")
    state = StateDir(inventory)
    with cluster_lock(state, "scale-down"):
        with connect(inventory, state) as cluster:
            nodes = choose(inventory, args, cluster)
            if not nodes:
                console.say("nothing to remove: no idle GPU node" if args.idle else "nothing to remove")
                return 0
            servers = [n.name for n in nodes if n.role == Role.SERVER]
            if servers and len(servers) >= len(inventory.servers):
                raise UsageError(f"refusing to remove {', '.join(servers)}: the cluster would have no server left",
                                 "remove agents, or tear the whole cluster down with `bootstrap down`")
            if servers and not quorum_after(inventory, servers):
                raise UsageError(f"refusing to remove {', '.join(servers)}: etcd would lose quorum",
                                 "remove one server at a time, and keep a majority")
            blocked = {}
            for node in nodes:
                cordon(cluster, node.name)
                result = drain(cluster, node.name, args.timeout, args.force)
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
        uninstall(inventory, state, removed, args.purge_drivers, console)
    console.say("now remove from " + inventory.source + ": " + ", ".join(f"the node named {n.name}" for n in removed))
    for node in removed:
        console.say(f"  - {{name: {node.name}, address: {node.address}, role: {node.role}}}")
    return 0


def uninstall(inventory, state, nodes, purge_drivers: bool, console) -> None:
    """What `down` does, for these hosts only."""
    from bootstrap.hosts.connections import open_hosts, report_failures
    from bootstrap.flows.uninstall import uninstall as remove_from_hosts

    with open_hosts(inventory, nodes, "scale-down") as session:
        remove_from_hosts(session, inventory, state, nodes, purge_drivers, console)
    report_failures(session.failures)
