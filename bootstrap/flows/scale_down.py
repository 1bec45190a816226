"""Scale-down (`bootstrap scale-down`): drain the chosen nodes, stop k3s on them, remove them
from the cluster, then uninstall.

k3s joins its cluster again whenever it starts, a deleted node and a removed etcd member
alike (k3s-io/k3s#5404; the embedded etcd of a removed server writes a tombstone and k3s,
restarted by systemd, moves its database aside and joins as a new member: k3s-io/k3s
pkg/daemons/executor/embed.go and pkg/etcd/etcd.go; the release notes of v1.22.7+k3s1 in
k3s-io/docs, k3s-io/k3s#4023: "ensure that the k3s service is stopped before using kubectl
delete"). Our units restart k3s (Restart=always), so a node leaves in this order: drained,
k3s stopped and disabled on its host, its etcd member and Node removed, k3s uninstalled. A
node whose host does not answer, or whose k3s does not stop, stays in the cluster, cordoned.

Refuses to remove the last server or to break etcd quorum. Ends by printing the inventory
edit to make, so the next `up` does not bring the node back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

from pyinfra.api import StringCommand

from bootstrap.cluster.client import connect as connect_to_cluster, get
from bootstrap.cluster.node_removal import remove_node
from bootstrap.console_text import printable
from bootstrap.errors import HostsFailed, UsageError
from bootstrap.flows.run import Run
from bootstrap.flows.uninstall import uninstall
from bootstrap.host.parts import k3s_service
from bootstrap.host.plan.steps import Step
from bootstrap.remote.connections import open_hosts
from bootstrap.inventory.model import Role
from bootstrap.state.lock import cluster_lock
from bootstrap.progress import end_run, report_host_failures
from bootstrap.checks.lost_nodes import quorum_after
from bootstrap.cluster.drain import cordon, drain, gpu_pods_on
from bootstrap.consent import ask_for_cluster_name

STOP_STEP = "stop k3s"


@dataclass
class ScaleDownOptions:
    nodes: list[str] = field(default_factory=list)  # by name, or
    idle: bool = False                               # every GPU agent without GPU pods
    drain_timeout: int = 300
    force: bool = False                              # delete pods a disruption budget protects
    purge_drivers: bool = False
    assume_yes: bool = False                         # --yes: do not ask before removing idle nodes
    keep: int = 0                                    # --keep N: idle GPU nodes that stay


def scale_down(inventory, state, options: ScaleDownOptions, console, *, connect=connect_to_cluster,
               open_session=open_hosts) -> None:
    """Its phases: choose the nodes, drain them, stop k3s and remove them from the cluster,
    uninstall; then the inventory edit to make. `connect(inventory, state)`: the cluster;
    `open_session(inventory, nodes, command, console)`: the hosts (fakes in tests)."""
    if not options.nodes and not options.idle:
        raise UsageError("name the nodes to remove with --node NAME (repeatable), or use --idle")
    run = Run(inventory, state, console, connect=connect)
    removed, blocked = [], {}
    with cluster_lock(state, "scale-down"):
        named = named_nodes(inventory, options.nodes) if options.nodes else None
        if named:
            refuse_losing_the_control_plane(inventory, named)
        with connect(staying(inventory, named), state) as cluster:
            nodes = choose(inventory, cluster, named, options, console)
            if not nodes:
                return
            drained, blocked = drain_all(cluster, nodes, options, console)
            if drained:
                removed = leave_and_uninstall(run, cluster, drained, options, open_session)
    say_what_to_edit(inventory, removed, console)
    end_scale_down(run, blocked)


def staying(inventory, named):
    """The API through a server that stays: a leaving server's k3s stops mid-way."""
    leaving = {n.name for n in named or () if n.role == Role.SERVER}
    return replace(inventory, nodes=tuple(n for n in inventory.nodes if n.name not in leaving))


def choose(inventory, cluster, named, options: ScaleDownOptions, console) -> list:
    """The named nodes, or the idle GPU agents less the kept ones (asked about first)."""
    nodes = named if named is not None else idle_gpu_agents(inventory, cluster)
    kept = []
    if named is None and options.keep:
        kept, nodes = nodes[:options.keep], nodes[options.keep:]  # the last ones go
        if kept:
            console.say(f"keeping {len(kept)} idle GPU node(s) (--keep {options.keep}): "
                        + ", ".join(n.name for n in kept))
    if not nodes:
        if kept:
            console.say("nothing to remove: every idle GPU node is kept")
        else:
            console.say("nothing to remove: no idle GPU node" if options.idle else "nothing to remove")
        return []
    if named is None:
        refuse_while_gpu_pods_wait(cluster, nodes)
        confirm_idle_removal(inventory, nodes, options.assume_yes)
    return nodes


def say_what_to_edit(inventory, removed: list, console) -> None:
    if removed:
        console.say("now remove from " + inventory.source + ": "
                    + ", ".join(f"the node named {n.name}" for n in removed))
        for node in removed:
            console.say(f"  - {{name: {node.name}, address: {node.address}, role: {node.role}}}")


def end_scale_down(run: Run, blocked: dict) -> None:
    if blocked:
        report_host_failures(run.console, run.failures)
        # Pod names and reasons are the API's words: one printable line each.
        lines = [f"{name}: {printable(pod)} ({printable(why)})" for name, pods in blocked.items()
                 for pod, why in pods.items()]
        raise HostsFailed("drain blocked; these nodes were left cordoned:\n  " + "\n  ".join(lines),
                          "fix the PodDisruptionBudgets, or re-run with --force to delete the pods")
    end_run(run.console, run.failures)


def drain_all(cluster, nodes, options: ScaleDownOptions, console):
    """Cordon and drain each node: (the drained ones, {node: {pod: why}} for the blocked)."""
    drained, blocked = [], {}
    for node in nodes:
        cordon(cluster, node.name)
        result = drain(cluster, node.name, options.drain_timeout, options.force)
        console.say(f"{node.name}: cordoned; evicted {len(result.evicted)} pod(s)"
                    + (f", deleted {len(result.forced)} after the time-out" if result.forced else ""))
        if result.complete:
            drained.append(node)
        else:
            blocked[node.name] = result.blocked
    return drained, blocked


def leave_and_uninstall(run: Run, cluster, nodes, options: ScaleDownOptions, open_session) -> list:
    """Once uninstall found every host ours (and before it changes any): stop k3s on each,
    then remove from the cluster the nodes whose k3s stopped; uninstall follows. Returns
    the nodes removed."""
    removed = []
    with contextlib.ExitStack() as hosts:
        session = run.open_hosts(hosts, open_session, nodes, "scale-down")
        uninstall(session, run.inventory, run.state, nodes, options.purge_drivers, run.console,
                  before_teardown=lambda: removed.extend(leave(run, cluster, nodes)))
    return removed


def leave(run: Run, cluster, nodes) -> list:
    """k3s stopped on each node, then the nodes whose k3s stopped removed from the cluster."""
    stop = "\n".join(k3s_service.stop_service(check=True))
    run.session.execute([Step(STOP_STEP, {n.name: [StringCommand(stop)] for n in nodes if not run.failed(n.name)})])
    removed = []
    for node in nodes:
        if run.failed(node.name):
            run.console.say(f"{node.name}: k3s was not stopped there, so it stays in the cluster, cordoned")
            continue
        remove_node(cluster, node.name, etcd_member=node.role == Role.SERVER)
        run.console.say(f"{node.name}: k3s stopped; removed from the cluster")
        removed.append(node)
    return removed


def named_nodes(inventory, names: list[str]) -> list:
    unknown = [n for n in names if n not in {x.name for x in inventory.nodes}]
    if unknown:
        raise UsageError(f"no node named {', '.join(unknown)} in {inventory.source}")
    return [inventory.node(n) for n in names]


def idle_gpu_agents(inventory, cluster) -> list:
    chosen = []
    for node in inventory.agents:
        labels = (get(cluster, f"/api/v1/nodes/{node.name}") or {}).get("metadata", {}).get("labels", {})
        if labels.get("nvidia.com/gpu.present") == "true" and not gpu_pods_on(cluster, node.name):
            chosen.append(node)
    return chosen


def waiting_gpu_pods(cluster) -> list[str]:
    """Pods that ask for a GPU and have no node yet: the capacity idle nodes would give."""
    waiting = []
    for pod in (get(cluster, "/api/v1/pods?fieldSelector=status.phase%3DPending") or {}).get("items", []):
        if pod.get("spec", {}).get("nodeName"):
            continue
        if any(k.startswith("nvidia.com/") for c in pod.get("spec", {}).get("containers", [])
               for k in ((c.get("resources") or {}).get("limits") or {})):
            waiting.append(f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}")
    return sorted(waiting)


def refuse_while_gpu_pods_wait(cluster, nodes) -> None:
    """An idle GPU node is idle only until the scheduler places the next GPU pod: while GPU
    pods wait for capacity, the idle nodes are the capacity they wait for."""
    waiting = waiting_gpu_pods(cluster)
    if waiting:
        shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
        raise UsageError(f"not removing the idle GPU nodes {', '.join(n.name for n in nodes)}: "
                         f"{len(waiting)} GPU pod(s) wait for a GPU ({shown}); nothing was changed",
                         "run it again once they are scheduled, or name the nodes with --node to remove them anyway")


def confirm_idle_removal(inventory, nodes, assume_yes: bool) -> None:
    """--idle picks the nodes itself: say which, and ask (the answer goes to stderr's
    prompt; under --json stdout carries only events)."""
    names = ", ".join(n.name for n in nodes)
    ask_for_cluster_name(inventory, f"Remove {len(nodes)} idle GPU node(s) from {inventory.cluster}: {names}?",
                         f"refusing to remove the idle GPU nodes {names} without confirmation", assume_yes,
                         "add --yes to confirm, or name the nodes with --node")


def refuse_losing_the_control_plane(inventory, nodes) -> None:
    servers = [n.name for n in nodes if n.role == Role.SERVER]
    if servers and len(servers) >= len(inventory.servers):
        raise UsageError(f"refusing to remove {', '.join(servers)}: the cluster would have no server left",
                         "remove agents, or tear the whole cluster down with `bootstrap down`")
    if servers and not quorum_after(inventory, servers):
        raise UsageError(f"refusing to remove {', '.join(servers)}: etcd would lose quorum",
                         "remove one server at a time, and keep a majority")
