"""Repair (`bootstrap rebuild`): bring the cluster back after spot loss, touching nothing healthy.

1. facts from whatever answers; the API through any server that answers;
2. the API does not answer: only when no server's k3s answers at the connection level
   (SSH, service, API port; never judged from an HTTP status) and `--restore` says so
   (after saying what is lost, and asking): restore the first inventory server from the
   newest (or the named) snapshot, with the old token (the other servers lose their old
   etcd data and join it, as k3s's restore procedure says), and point everything at it;
3. lost nodes (NotReady, machine gone) and replaced machines (a new machine under an old
   name, even while its old Node still says Ready): etcd member removal for servers (the
   annotation, never a force-delete), delete the Node, clear its node-password secret;
4. replacements and repairs joined as `up` would (healthy hosts plan no change);
5. the cluster side and `validate`; a summary of what was lost, replaced and restored.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field

from bootstrap.state import snapshots
from bootstrap.host.plan.rollout import plan_rollout
from bootstrap.host.plan.steps import converge_steps
from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.remote.connections import open_hosts
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.flows.host_phase import fetch_kubeconfig, preflight_and_plan, probe
from bootstrap.flows.run import Run
from bootstrap.progress import report_host_failures
from bootstrap.errors import BootstrapError, HostsFailed, UsageError
from bootstrap.flows.replaced_machines import cluster_nodes, remove_nodes
from bootstrap.state.lock import cluster_lock
from bootstrap.checks.lost_nodes import classify, quorum_after, replaced_machines, stale_after_restore
from bootstrap.cluster.liveness import servers_liveness


def control_plane_lost(inventory, state, facts, api_error: str, console, port_check=None) -> list:
    """Restore is only for a control plane that is really gone: no server's k3s answers at
    the connection level (SSH, service, API port). Anything else is an error with its cause."""
    liveness = servers_liveness(inventory, state, facts, port_check)
    alive = [s for s in liveness if s.answers]
    if alive:
        raise HostsFailed(
            f"the Kubernetes API did not answer ({api_error}), but k3s answers on "
            f"{', '.join(s.node for s in alive)}: the control plane is not lost; nothing was changed",
            "if the saved kubeconfig is stale, `bootstrap kubeconfig INVENTORY` fetches it again; "
            "otherwise fix the API error above and run rebuild again")
    console.say_lines(f"{server.node}: {server.reason}" for server in liveness)
    return liveness


def choose_snapshot(state, name: str | None):
    if name:
        found = snapshots.find(state, name)
        if found is None:
            names = [s.name for s in snapshots.local_snapshots(state)]
            raise UsageError(f"no snapshot named {name} of this cluster in {state.path}/snapshots",
                             f"snapshots are: {', '.join(names) or 'none'}")
        return found
    return snapshots.newest(state)


def confirm_restore(inventory, target: str, snapshot, assume_yes: bool, console) -> None:
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.taken))
    console.warn(f"restore: the control plane of {inventory.cluster} is restored onto {target} from {snapshot.name}, "
                 f"taken {taken} ({snapshot.age()} ago). Lost: everything the cluster recorded after it (objects "
                 f"created or changed, Helm releases upgraded, nodes joined since); {target}'s own datastore is "
                 "reset and the other servers' etcd data is deleted (they join the restored one).")
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("refusing to restore the control plane without confirmation", "add --yes to confirm")
    console.ask("Type the cluster name to restore: ")
    if sys.stdin.readline().strip() != inventory.cluster:
        raise UsageError("not confirmed; nothing was changed")


def split_before_agents(steps):
    """(the restore and the servers, the agents and what follows): the restored cluster's
    Nodes are put right between the two."""
    at = next(i for i, step in enumerate(steps) if step.name == "join agents")
    return steps[:at], steps[at:]


def clear_after_restore(inventory, state, facts, connect) -> list[str]:
    """The snapshot brought back Node objects of machines that are gone (still Ready until
    the node controller's grace period runs out), and of agents whose machine was replaced
    since: their node-password secrets would refuse the new machines. Servers have just
    started on what they are now and stay. The old servers' etcd members went with the
    reset: plain Node deletes."""
    nodes = cluster_nodes(inventory, state, connect)[0] or {}
    agents = {n.name for n in inventory.agents}
    replaced = [n for n in replaced_machines(inventory, nodes, facts) if n in agents]
    gone = sorted(set(stale_after_restore(inventory, nodes, facts)) | set(replaced))
    remove_nodes(inventory, state, gone, [], connect)
    return gone


@dataclass(frozen=True)
class RepairOptions:
    restore: bool = False  # --restore: allowed to restore a lost control plane
    snapshot: str | None = None  # --snapshot NAME
    assume_yes: bool = False  # --yes
    validate: bool = True


@dataclass
class RepairReport:
    """What a rebuild did, said in its last lines."""

    lost: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    restored: str | None = None
    to_do: list[str] = field(default_factory=list)  # what the operator does next


def repair(inventory, state, options: RepairOptions, console, *, open_session=open_hosts,
           connect=connect_to_cluster, api_port_accepts=None) -> None:
    """`open_session(inventory, nodes, command, console)`: the hosts; `connect(inventory, state)`:
    the cluster; `api_port_accepts(inventory, node, state)`: (accepts, reason) of a server's API
    port (None: bootstrap.cluster.liveness asks it). The real ones unless a test gives fakes."""
    require_the_token(state)
    run = Run(inventory, state, console, connect=connect)
    report = RepairReport()
    with cluster_lock(state, "rebuild"), contextlib.ExitStack() as stack:
        run.open_hosts(stack, open_session, inventory.nodes, "rebuild")
        probe(run)
        nodes, api_error = cluster_nodes(inventory, state, run.connect)
        lost = classify(inventory, nodes, run.facts)
        if nodes is None:
            restore = restore_target(run, lost, api_error, options, api_port_accepts, report)
        else:
            restore = remove_lost_nodes(run, lost, report)
        leave_out_unreachable(run, lost, report)
        preflight_and_plan(run, create_token=False, tolerate_unreachable=True,
                           join_via=healthy_server_to_join(run, nodes, lost), converging=True)
        refuse_an_upgrade(run)
        join_replacements(run, lost, restore, report)
        end_with_failures(run, lost)
        # Only the nodes that answered are waited for: a lost machine cannot become Ready.
        with console.phase("cluster side"):
            cluster_phase(run, validate=options.validate,
                          wait_for=[n.name for n in inventory.nodes if n.name not in lost.unreachable])
    say_done(run, lost, report)


def require_the_token(state) -> None:
    if not (state.path / "token").exists():
        raise BootstrapError(f"no join token in {state.path}: rebuild needs the state folder `up` wrote",
                             "restore the state folder, or set state_dir in the inventory to it")


def restore_target(run: Run, lost, api_error: str, options: RepairOptions, api_port_accepts, report: RepairReport):
    """No server's API answers: (the server to restore onto, the snapshot's path), once the
    control plane is really lost, `--restore` says so and the operator confirmed."""
    inventory = run.inventory
    control_plane_lost(inventory, run.state, run.facts, api_error, run.console, api_port_accepts)
    snapshot = choose_snapshot(run.state, options.snapshot)
    if lost.restore_on is None or snapshot is None:
        raise HostsFailed("no server's k3s answers and the control plane cannot be restored: "
                          + ("the first server in the inventory does not answer either"
                             if lost.restore_on is None else f"no snapshot in {run.state.path}/snapshots"),
                          "add a replacement server (first in the inventory) and keep snapshots "
                          "(`bootstrap snapshot`)")
    if not options.restore:
        raise HostsFailed(
            "no server's k3s answers: the control plane is lost; nothing was changed",
            f"to restore it onto {lost.restore_on} from {snapshot.name} (taken {snapshot.age()} ago; "
            f"everything recorded after it is lost), run: bootstrap rebuild {inventory.source} --restore")
    confirm_restore(inventory, lost.restore_on, snapshot, options.assume_yes, run.console)
    report.restored = f"{lost.restore_on} from {snapshot.name}"
    return lost.restore_on, snapshot.path


def remove_lost_nodes(run: Run, lost, report: RepairReport) -> None:
    """The API answers: the lost nodes leave the cluster (servers leave etcd first). Nothing
    to restore."""
    if lost.lost_servers and not quorum_after(run.inventory, lost.lost_servers):
        raise HostsFailed(f"servers {', '.join(lost.lost_servers)} are lost and etcd has no quorum",
                          "restore from a snapshot onto a new first server")
    remove_nodes(run.inventory, run.state, lost.lost, lost.lost_servers, run.connect)
    report.lost = lost.lost
    return None


def leave_out_unreachable(run: Run, lost, report: RepairReport) -> None:
    """Expected (a lost spot machine) but said now, with its cause: a replacement whose host
    key changed is refused, and the fix is --replace. The session goes on without them."""
    for name in lost.unreachable:
        why = run.failures.pop(name, None)
        run.console.say(f"{name}: left out of this rebuild: "
                        + (why.render().split(": ", 1)[1] if why else "it does not answer over SSH"))
        report.to_do.append(next_step_for_unreachable(run.inventory, name, why))
    run.session.nodes = [n for n in run.inventory.nodes if n.name in run.facts]


def healthy_server_to_join(run: Run, nodes, lost):
    """Replacing the first server of an HA cluster: it must join a healthy server, not
    start a new cluster of its own (cluster-init)."""
    if nodes is None or run.topology.first_server in lost.healthy:
        return None
    return next((s for s in run.inventory.servers if s.name in lost.healthy), None)


def refuse_an_upgrade(run: Run) -> None:
    """Restarting running nodes on a new k3s belongs to a rolling upgrade, not to a repair:
    nothing has been changed on the hosts yet."""
    rollout = plan_rollout(run.inventory, run.facts, run.plans, run.topology.target_version)
    if rollout:
        raise BootstrapError(
            f"the inventory asks for k3s {rollout.target or '(the k3s.airgap binary)'}, and "
            f"{', '.join(rollout.nodes)} run another release",
            "rebuild with the k3s.version the cluster runs now, then upgrade with `bootstrap up`")


def join_replacements(run: Run, lost, restore, report: RepairReport) -> None:
    """The steps of the hosts whose plan changes (replacements, repairs); after a restore,
    the restored cluster's stale Nodes are cleared between the servers and the agents."""
    changed = {name for name, p in run.plans.items() if p.changed}
    if changed:
        for name in lost.unreachable:
            run.fail(name, "does not answer over SSH")
        steps = converge_steps(run.inventory, run.plans, set(run.failures), restore=restore)
        servers_part, agents_part = split_before_agents(steps) if restore else (steps, [])
        run.session.execute(servers_part)
        fetch_kubeconfig(run.session, run.inventory, run.state)
        if restore:
            report.lost = clear_after_restore(run.inventory, run.state, run.facts, run.connect)
            run.session.execute(agents_part)
    report.replaced = sorted(changed & set(lost.join))


def end_with_failures(run: Run, lost) -> None:
    failed = {n: f for n, f in run.failures.items() if n not in lost.unreachable}
    if failed:
        report_host_failures(run.console, failed)
        raise HostsFailed(f"{len(failed)} host(s) failed: {', '.join(sorted(failed))}")


def say_done(run: Run, lost, report: RepairReport) -> None:
    healthy = [n for n in lost.healthy if n not in report.replaced]
    run.console.say(f"rebuild done in {run.elapsed():.1f}s: lost {', '.join(report.lost) or 'none'}; "
                    f"joined {', '.join(report.replaced) or 'none'}; restored {report.restored or 'nothing'}; "
                    f"unchanged {', '.join(healthy) or 'none'}"
                    + (f"; not answering {', '.join(lost.unreachable)}" if lost.unreachable else ""))
    run.console.say_lines(report.to_do)  # each names a host's failure: one line each


def next_step_for_unreachable(inventory, name: str, why) -> str:
    """The last word on a node that did not answer: a machine that is gone needs a
    replacement; one that answers with a new host key was replaced (or is not ours)."""
    if why is not None and why.machine_answers and why.hint:
        return f"{name}: {why.hint}"
    return (f"{name} is gone: rent a replacement, put its address in the inventory, run rebuild again "
            f"(or remove {name} from the inventory)")
