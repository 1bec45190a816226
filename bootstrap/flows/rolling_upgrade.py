"""Rolling k3s upgrade: one node (or batch of agents) at a time, through the API and SSH.

For each server in turn: replace the binary, restart, wait until its Node is Ready on the
new version. For each batch of agents: cordon (marked with an annotation, so a resumed run
knows whose cordon it is), drain through the eviction API as `scale-down` does, replace the
binary, restart, wait Ready on the new version, uncordon. The first failure stops the
rollout there: the nodes after it are untouched, and the error says how to resume or roll
that node back.

Before servers change version, an etcd snapshot is taken (and copied to the state folder):
k3s's roll-back procedure is the old binary *and* a datastore restored from a snapshot
taken before the upgrade, "without a backup, a rollback is impossible" (k3s-io/docs
docs/upgrades/roll-back.md). Swapping the binary back alone is not a rollback once servers
run a newer minor (the datastore was written by it); within a minor it is, and the hint
says which one applies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bootstrap.cluster.client import ClusterError, get, wait_for
from bootstrap.cluster.drain import CORDONED_FOR_UPGRADE, cordon, cordoned_for_upgrade, uncordon
from bootstrap.cluster.drain import drain as drain_node
from bootstrap.deploys import converge
from bootstrap.errors import BootstrapError, HostsFailed
from bootstrap.host.parts import k3s_binary
from bootstrap.host.plan.steps import Step
from bootstrap.progress import report_host_failures
from bootstrap.host.parts.k3s_service import unit_name
from bootstrap.host.plan.rollout import Rollout
from bootstrap.cluster.node_status import node_ready
from bootstrap.inventory.model import Role
from bootstrap.checks.k3s_versions import parse as parse_version
from bootstrap.host.plan import restore
from bootstrap.state import snapshots

READY_TIMEOUT_S = 300


class RolloutStopped(HostsFailed):
    pass


def node_state(cluster, name: str) -> tuple[bool, str | None]:
    """(Ready, kubelet version) of a Node as the API reports it."""
    try:
        node = get(cluster, f"/api/v1/nodes/{name}") or {}
    except ClusterError:  # the API restarts with its server: not yet
        return False, None
    return node_ready(node), node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion")


def wait_ready(cluster, name: str, version: str | None, timeout_s: float = READY_TIMEOUT_S) -> None:
    def check():
        ready, running = node_state(cluster, name)
        check.last = f"Ready={ready}, version {running or '?'}"
        return ready and (version is None or running == version)

    check.last = None
    wait_for(f"node {name} to be Ready on {version or 'the new k3s'}", check, timeout_s, interval_s=1.0)


def settle_earlier_cordons(cluster, rollout: Rollout, console, before=None) -> None:
    """A resumed rollout: the node it stopped at (fixed since, and started again just now)
    is waited for and uncordoned before the next batch, so never more than a batch is out."""
    for name in cordoned_for_upgrade((get(cluster, "/api/v1/nodes") or {}).get("items", [])):
        if name in rollout.nodes:
            continue
        try:
            wait_ready(cluster, name, rollout.target)
        except BootstrapError as exc:
            stop(rollout, name, [], f"still cordoned from the last rollout and not back: {exc.message}", before=before)
        uncordon(cluster, name, CORDONED_FOR_UPGRADE)
        console.say(f"uncordoned {name} (upgraded earlier, Ready again)")


def roll_nodes(run, cluster, rollout: Rollout, names: list[str], *, drain: bool, drain_timeout: int,
               force: bool, before=None) -> None:
    """Upgrade `names` together (one server, or one batch of agents); raise RolloutStopped."""
    done = [n for n in rollout.nodes if rollout.nodes.index(n) < rollout.nodes.index(names[0])]
    if drain:
        drain_batch(cluster, rollout, names, done, drain_timeout, force, before)
    run.session.execute([upgrade_step(run, names)])
    replaced = [n for n in names if not run.failed(n)]
    for name in names:
        failure = run.hosts[name].failure
        if failure:
            stop(rollout, name, done + replaced, failure.message, before=before)
    for name in names:
        try:
            wait_ready(cluster, name, rollout.target)
        except BootstrapError as exc:
            stop(rollout, name, done, exc.message, before=before)
        if drain:
            uncordon(cluster, name, CORDONED_FOR_UPGRADE)
        run.console.event("upgraded", node=name, version=rollout.target)
        run.console.say(f"upgraded {name} to {rollout.target or 'the k3s.airgap binary'}")


def drain_batch(cluster, rollout: Rollout, names: list[str], done: list[str], drain_timeout: int, force: bool,
                before) -> None:
    for name in names:
        cordon(cluster, name, CORDONED_FOR_UPGRADE)
    for name in names:
        result = drain_node(cluster, name, drain_timeout, force)
        if not result.complete:
            blockers = "; ".join(f"{pod}: {why}" for pod, why in result.blocked.items())
            stop(rollout, name, done, f"drain blocked by {blockers}", drained_only=True, before=before)


def upgrade_step(run, names: list[str]) -> Step:
    """The new binary in place (the old one kept), k3s restarted, then its image pulls started
    in the background (bootstrap.host.parts.k3s_images): one command per node."""
    step = Step("upgrade k3s", {})
    for name in names:
        step.commands[name] = converge.placed_and_started(run.hosts[name].plan, "restart", keep_previous_binary=True)
    return step


def crosses_minor(rollout: Rollout) -> bool:
    """A server goes to a newer minor release (or, the target unknown, may)."""
    want = parse_version(rollout.target)
    for name in rollout.servers:
        have = parse_version(rollout.installed.get(name))
        if want is None or have is None or (want.major, want.minor) != (have.major, have.minor):
            return True
    return False


@dataclass(frozen=True)
class RollbackPoint:
    """The snapshot taken before servers changed version, and where it lies."""

    snapshot: str  # its name (on `server`, in k3s's snapshot folder, and in the state folder)
    server: str
    s3_configured: bool  # the reset then needs --etcd-s3=false (bootstrap.host.plan.restore)


def restore_rollback(rollout: Rollout, point: RollbackPoint) -> str:
    """k3s's roll-back procedure (k3s-io/docs docs/upgrades/roll-back.md, embedded etcd)
    with the snapshot taken before this rollout."""
    old = ", ".join(sorted({v for v in rollout.installed.values() if v})) or "the old release"
    reset = restore.reset_command(restore.remote_snapshot_path(point.snapshot), point.s3_configured)
    return (f"roll the cluster back to {old} by restoring {point.snapshot}, the snapshot taken before this "
            "rollout (swapping the binary back is not a rollback across a minor release: the datastore was "
            "written by the new one): on every node stop k3s, and where it was upgraded put the old binary back "
            f"(`sudo install -m 0755 {k3s_binary.PREVIOUS} {k3s_binary.PATH}`); on {point.server} run "
            f"`sudo {reset}`, then start k3s; on the other servers run `sudo rm -rf {restore.ETCD_DB_DIR}`, then "
            f"start k3s; then start the agents; and set k3s.version back to {old}")


def stop(rollout: Rollout, name: str, done: list[str], reason: str, drained_only: bool = False,
         before: RollbackPoint | None = None):
    """`before`: the snapshot taken before servers changed version (None: none changed)."""
    after = [n for n in rollout.nodes if n not in done and n != name]
    unit = unit_name(Role.SERVER if name in rollout.servers else Role.AGENT)
    roll_back = f"roll {name} back: on it run `{k3s_binary.roll_back(unit)}`, then `kubectl uncordon {name}`"
    if drained_only:
        roll_back = f"it still runs {rollout.installed.get(name) or 'its old k3s'}: `kubectl uncordon {name}` undoes the cordon"
    elif before is not None and crosses_minor(rollout):
        roll_back = restore_rollback(rollout, before)
    raise RolloutStopped(
        f"rolling upgrade stopped at {name}: {reason}. Upgraded: {', '.join(done) or 'none'}; untouched: "
        f"{', '.join(after) or 'none'}",
        f"fix {name} and run `bootstrap up` again to resume from it; or {roll_back}")


def snapshot_before(inventory, state, rollout: Rollout, console, take_snapshot=None) -> RollbackPoint | None:
    """The way back, taken before the first server changes version; no rollout without it."""
    if not rollout.servers:
        return None
    server = inventory.servers[0]  # where bootstrap.state.snapshots.take saves it
    try:
        path = (take_snapshot or snapshots.take)(inventory, state)
    except BootstrapError as exc:
        raise RolloutStopped(f"rolling upgrade not started: the etcd snapshot to roll back to failed: {exc.message}",
                             "fix the first server (the snapshot is taken on it) and run `bootstrap up` again; "
                             "nothing was upgraded") from None
    console.say(f"snapshot before the upgrade: {path.name} (what a rollback restores)")
    return RollbackPoint(path.name, server.name, inventory.k3s.snapshots.s3 is not None)


def run_rollout(run, rollout: Rollout, phase_between, *, drain_timeout: int, force: bool) -> None:
    """A snapshot when servers change version, servers one at a time, then
    `phase_between()` (new and reconfigured nodes converge as usual), then the agents batch
    by batch. `run.take_snapshot(inventory, state)`: bootstrap.state.snapshots.take (a fake in tests)."""
    run.console.say_lines(rollout.describe())
    started = time.monotonic()
    before = snapshot_before(run.inventory, run.state, rollout, run.console, run.take_snapshot)
    with run.connect(run.inventory, run.state) as cluster:
        for name in rollout.servers:
            roll_nodes(run, cluster, rollout, [name], drain=False, drain_timeout=drain_timeout, force=force,
                       before=before)
    phase_between()
    if run.failures:
        report_host_failures(run.console, run.failures)
        failed = ", ".join(sorted(run.failures))
        raise RolloutStopped(f"rolling upgrade stopped before the agents: {failed} failed (see above); upgraded: "
                             f"{', '.join(rollout.servers) or 'none'}; untouched: "
                             f"{', '.join(n for b in rollout.agent_batches for n in b)}",
                             "fix the failed hosts and run `bootstrap up` again to resume")
    with run.connect(run.inventory, run.state) as cluster:
        settle_earlier_cordons(cluster, rollout, run.console, before)
        for batch in rollout.agent_batches:
            roll_nodes(run, cluster, rollout, batch, drain=True, drain_timeout=drain_timeout, force=force,
                       before=before)
    run.console.say(f"k3s upgrade: {len(rollout.nodes)} node(s) upgraded ({time.monotonic() - started:.1f}s)")
