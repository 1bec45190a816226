"""Rolling k3s upgrade: one node (or batch of agents) at a time, through the API and SSH.

For each server in turn: replace the binary, restart, wait until its Node is Ready on the
new version. For each batch of agents: cordon (marked with an annotation, so a resumed run
knows whose cordon it is), drain through the eviction API as `scale-down` does, replace the
binary, restart, wait Ready on the new version, uncordon. The first failure stops the
rollout there: the nodes after it are untouched, and the error says how to resume or roll
that node back.
"""

from __future__ import annotations

import time

from bootstrap.errors import HostsFailed
from bootstrap.hostparts import k3s_binary
from bootstrap.hostparts.k3s_service import unit_name
from bootstrap.hostplan.rollout import Rollout
from bootstrap.inventory.model import Role

READY_TIMEOUT_S = 300


class RolloutStopped(HostsFailed):
    pass


def node_state(cluster, name: str) -> tuple[bool, str | None]:
    """(Ready, kubelet version) of a Node as the API reports it."""
    from bootstrap.cluster.node_status import node_ready
    from bootstrap.cluster.client import ClusterError, get

    try:
        node = get(cluster, f"/api/v1/nodes/{name}") or {}
    except ClusterError:  # the API restarts with its server: not yet
        return False, None
    return node_ready(node), node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion")


def wait_ready(cluster, name: str, version: str | None, timeout_s: float = READY_TIMEOUT_S) -> None:
    from bootstrap.cluster.client import wait_for

    def check():
        ready, running = node_state(cluster, name)
        check.last = f"Ready={ready}, version {running or '?'}"
        return ready and (version is None or running == version)

    check.last = None
    wait_for(f"node {name} to be Ready on {version or 'the new k3s'}", check, timeout_s, interval_s=1.0)


def settle_earlier_cordons(cluster, rollout: Rollout, console) -> None:
    """A resumed rollout: the node it stopped at (fixed since, and started again just now)
    is waited for and uncordoned before the next batch, so never more than a batch is out."""
    from bootstrap.cluster.client import get
    from bootstrap.cluster.drain import CORDONED_FOR_UPGRADE, cordoned_for_upgrade, uncordon
    from bootstrap.errors import BootstrapError

    for name in cordoned_for_upgrade((get(cluster, "/api/v1/nodes") or {}).get("items", [])):
        if name in rollout.nodes:
            continue
        try:
            wait_ready(cluster, name, rollout.target)
        except BootstrapError as exc:
            stop(rollout, name, [], f"still cordoned from the last rollout and not back: {exc.message}")
        uncordon(cluster, name, CORDONED_FOR_UPGRADE)
        console.say(f"uncordoned {name} (upgraded earlier, Ready again)")


def roll_nodes(session, cluster, plans, rollout: Rollout, names: list[str], console, *, drain: bool,
               drain_timeout: int, force: bool) -> None:
    """Upgrade `names` together (one server, or one batch of agents); raise RolloutStopped."""
    from bootstrap.cluster.drain import CORDONED_FOR_UPGRADE, cordon, uncordon
    from bootstrap.cluster.drain import drain as drain_node
    from bootstrap.deploys import converge
    from bootstrap.errors import BootstrapError
    from bootstrap.hostplan.steps import Step

    done = [n for n in rollout.nodes if rollout.nodes.index(n) < rollout.nodes.index(names[0])]
    if drain:
        for name in names:
            cordon(cluster, name, CORDONED_FOR_UPGRADE)
        for name in names:
            result = drain_node(cluster, name, drain_timeout, force)
            if not result.complete:
                blockers = "; ".join(f"{pod}: {why}" for pod, why in result.blocked.items())
                stop(rollout, name, done, f"drain blocked by {blockers}", drained_only=True)
    step = Step("upgrade k3s", {})
    for name in names:
        plan = plans[name]
        step.commands[name] = converge.placement_commands(plan, keep_previous_binary=True) + [
            converge.wait_for_service(plan.unit, "restart", plan.start_timeout)] + ([converge.prepull_command(plan.prepull)] if plan.prepull else [])
    session.execute([step])
    replaced = [n for n in names if n not in session.failures]
    for name in names:
        failure = session.failures.get(name)
        if failure:
            stop(rollout, name, done + replaced, failure.message)
    for name in names:
        try:
            wait_ready(cluster, name, rollout.target)
        except BootstrapError as exc:
            stop(rollout, name, done, exc.message)
        if drain:
            uncordon(cluster, name, CORDONED_FOR_UPGRADE)
        console.event("upgraded", node=name, version=rollout.target)
        console.say(f"upgraded {name} to {rollout.target or 'the k3s.airgap binary'}")


def stop(rollout: Rollout, name: str, done: list[str], reason: str, drained_only: bool = False):
    after = [n for n in rollout.nodes if n not in done and n != name]
    unit = unit_name(Role.SERVER if name in rollout.servers else Role.AGENT)
    roll_back = f"roll {name} back: on it run `{k3s_binary.roll_back(unit)}`, then `kubectl uncordon {name}`"
    if drained_only:
        roll_back = f"it still runs {rollout.installed.get(name) or 'its old k3s'}: `kubectl uncordon {name}` undoes the cordon"
    raise RolloutStopped(
        f"rolling upgrade stopped at {name}: {reason}. Upgraded: {', '.join(done) or 'none'}; untouched: "
        f"{', '.join(after) or 'none'}",
        f"fix {name} and run `bootstrap up` again to resume from it; or {roll_back}")


def run_rollout(session, inventory, state, plans, rollout: Rollout, phase_between, console, *,
                drain_timeout: int, force: bool) -> None:
    """Servers one at a time, then `phase_between()` (new and reconfigured nodes converge
    as usual), then the agents batch by batch."""
    from bootstrap.cluster.client import connect

    for line in rollout.describe():
        console.say(line)
    started = time.monotonic()
    with connect(inventory, state) as cluster:
        for name in rollout.servers:
            roll_nodes(session, cluster, plans.plans, rollout, [name], console, drain=False,
                       drain_timeout=drain_timeout, force=force)
    phase_between()
    if session.failures:
        for failure in sorted(session.failures.values(), key=lambda f: f.node):
            console.say(f"FAILED {failure.render()}")
        failed = ", ".join(sorted(session.failures))
        raise RolloutStopped(f"rolling upgrade stopped before the agents: {failed} failed (see above); upgraded: "
                             f"{', '.join(rollout.servers) or 'none'}; untouched: "
                             f"{', '.join(n for b in rollout.agent_batches for n in b)}",
                             "fix the failed hosts and run `bootstrap up` again to resume")
    with connect(inventory, state) as cluster:
        settle_earlier_cordons(cluster, rollout, console)
        for batch in rollout.agent_batches:
            roll_nodes(session, cluster, plans.plans, rollout, batch, console, drain=True,
                       drain_timeout=drain_timeout, force=force)
    console.say(f"k3s upgrade: {len(rollout.nodes)} node(s) upgraded ({time.monotonic() - started:.1f}s)")
