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
from collections.abc import Callable
from dataclasses import dataclass

from bootstrap import snapshots
from bootstrap.hostplan.steps import converge_steps
from bootstrap.cluster.client import connect as connect_to_cluster, reusing_ssh
from bootstrap.hosts.connections import open_hosts
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.flows.host_phase import fetch_kubeconfig, gather_and_plan, gather_facts
from bootstrap.errors import BootstrapError, HostsFailed, UsageError
from bootstrap.flows.replaced_machines import cluster_nodes, remove_nodes
from bootstrap.lock import cluster_lock
from bootstrap.rules.lost_nodes import classify, quorum_after, replaced_machines, stale_after_restore



@dataclass(frozen=True)
class Edges:
    """Where repair meets the world: the real one by default (tests give fakes)."""

    open_session: Callable = open_hosts  # (inventory, nodes, command, console) -> context manager of a session
    connect: Callable = connect_to_cluster  # (inventory, state) -> context manager of a Cluster
    api_port_accepts: Callable | None = None  # (inventory, node, state) -> (accepts, reason)


REAL = Edges()


def control_plane_lost(inventory, state, facts, api_error: str, console, port_check=None) -> list:
    """Restore is only for a control plane that is really gone: no server's k3s answers at
    the connection level (SSH, service, API port). Anything else is an error with its cause."""
    from bootstrap.cluster.liveness import servers_liveness

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


def repair(inventory, state, options: RepairOptions, console, edges: Edges = REAL) -> None:
    if not (state.path / "token").exists():
        raise BootstrapError(f"no join token in {state.path}: rebuild needs the state folder `up` wrote",
                             "restore the state folder, or set state_dir in the inventory to it")
    started = time.monotonic()
    report = {"lost": [], "replaced": [], "restored": None}
    with cluster_lock(state, "rebuild"):
        with contextlib.ExitStack() as stack:
            with console.phase("connect"):
                session = stack.enter_context(edges.open_session(inventory, list(inventory.nodes), "rebuild", console))
            # The API tunnel goes over this session's connection to the server (no new one).
            connect = reusing_ssh(edges.connect, session)
            with console.phase("probe"):
                facts = gather_facts(session, inventory)
            nodes, api_error = cluster_nodes(inventory, state, connect)
            plan = classify(inventory, nodes, facts)
            restore = None
            if nodes is None:
                control_plane_lost(inventory, state, facts, api_error, console, edges.api_port_accepts)
                snapshot = choose_snapshot(state, options.snapshot)
                if plan.restore_on is None or snapshot is None:
                    raise HostsFailed("no server's k3s answers and the control plane cannot be restored: "
                                      + ("the first server in the inventory does not answer either"
                                         if plan.restore_on is None else f"no snapshot in {state.path}/snapshots"),
                                      "add a replacement server (first in the inventory) and keep snapshots "
                                      "(`bootstrap snapshot`)")
                if not options.restore:
                    raise HostsFailed(
                        "no server's k3s answers: the control plane is lost; nothing was changed",
                        f"to restore it onto {plan.restore_on} from {snapshot.name} (taken {snapshot.age()} ago; "
                        f"everything recorded after it is lost), run: bootstrap rebuild {inventory.source} --restore")
                confirm_restore(inventory, plan.restore_on, snapshot, options.assume_yes, console)
                restore = (plan.restore_on, snapshot.path)
                report["restored"] = f"{plan.restore_on} from {snapshot.name}"
            else:
                if plan.lost_servers and not quorum_after(inventory, plan.lost_servers):
                    raise HostsFailed(f"servers {', '.join(plan.lost_servers)} are lost and etcd has no quorum",
                                      "restore from a snapshot onto a new first server")
                remove_nodes(inventory, state, plan.lost, plan.lost_servers, connect)
                report["lost"] = plan.lost
            to_do = []  # what the operator does next, said again as the last lines
            for name in plan.unreachable:
                # Expected (a lost spot machine) but said now, with its cause: a replacement
                # whose host key changed is refused, and the fix is --replace.
                why = session.failures.pop(name, None)
                console.say(f"{name}: left out of this rebuild: "
                            + (why.render().split(": ", 1)[1] if why else "it does not answer over SSH"))
                to_do.append(next_step_for_unreachable(inventory, name, why))
            reachable = [n for n in inventory.nodes if n.name in facts]
            session.nodes = reachable
            # Replacing the first server of an HA cluster: it must join a healthy server, not
            # start a new cluster of its own (cluster-init).
            first = inventory.servers[0]
            join_via = None
            if nodes is not None and first.name not in plan.healthy:
                join_via = next((s for s in inventory.servers if s.name in plan.healthy), None)
            with console.phase("preflight and plan"):
                facts, plans = gather_and_plan(session, inventory, state, console, create_token=False, facts=facts,
                                               tolerate_unreachable=True, join_via=join_via, converging=True)
            rollout = plans.rollout(inventory, facts)
            if rollout:
                # Restarting running nodes on a new k3s belongs to a rolling upgrade, not to
                # a repair: nothing has been changed on the hosts yet.
                raise BootstrapError(
                    f"the inventory asks for k3s {rollout.target or '(the k3s.airgap binary)'}, and "
                    f"{', '.join(rollout.nodes)} run another release",
                    "rebuild with the k3s.version the cluster runs now, then upgrade with `bootstrap up`")
            changed = {name for name, p in plans.plans.items() if p.changed}
            if changed:
                for name in plan.unreachable:
                    session.fail(name, "does not answer over SSH")
                steps = converge_steps(inventory, plans.plans, set(session.failures), restore=restore)
                if restore:
                    servers_part, agents_part = split_before_agents(steps)
                    session.execute(servers_part)
                    fetch_kubeconfig(session, inventory, state)
                    report["lost"] = clear_after_restore(inventory, state, facts, connect)
                    session.execute(agents_part)
                else:
                    session.execute(steps)
                    fetch_kubeconfig(session, inventory, state)
            report["replaced"] = sorted(changed & set(plan.join))
            failed = {n: f for n, f in session.failures.items() if n not in plan.unreachable}
            if failed:
                for failure in failed.values():
                    console.say(f"FAILED {failure.render()}")
                raise HostsFailed(f"{len(failed)} host(s) failed: {', '.join(sorted(failed))}")
            # Only the nodes that answered are waited for: a lost machine cannot become Ready.
            with console.phase("cluster side"):
                cluster_phase(inventory, state, facts, console, validate=options.validate, connect=connect,
                              wait_for=[n.name for n in inventory.nodes if n.name not in plan.unreachable])
    healthy = [n for n in plan.healthy if n not in report["replaced"]]
    console.say(f"rebuild done in {time.monotonic() - started:.1f}s: lost {', '.join(report['lost']) or 'none'}; "
          f"joined {', '.join(report['replaced']) or 'none'}; restored {report['restored'] or 'nothing'}; "
          f"unchanged {', '.join(healthy) or 'none'}"
          + (f"; not answering {', '.join(plan.unreachable)}" if plan.unreachable else ""))
    console.say_lines(to_do)  # each names a host's failure: one line each


def next_step_for_unreachable(inventory, name: str, why) -> str:
    """The last word on a node that did not answer: a machine that is gone needs a
    replacement; one that answers with a new host key was replaced (or is not ours)."""
    if why is not None and why.machine_answers and why.hint:
        return f"{name}: {why.hint}"
    return (f"{name} is gone: rent a replacement, put its address in the inventory, run rebuild again "
            f"(or remove {name} from the inventory)")
