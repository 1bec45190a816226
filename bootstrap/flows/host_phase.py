"""`up`'s pipeline: facts and preflight on every host, converge them (or roll an upgrade),
then the cluster side and a snapshot. `plan` and `rebuild` reuse its first half."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from bootstrap import artifacts as art
from bootstrap import progress
from bootstrap import up as flow
from bootstrap.hosts.connections import open_hosts, report_failures
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.lock import cluster_lock
from bootstrap.preflight import ownership_findings, preflight


def gather_facts(session, inventory) -> dict:
    """Facts in one round trip per host, including the state of every file the tool manages."""
    from bootstrap.facts.host_facts import HostFactsFact

    facts = session.gather(HostFactsFact, paths=tuple(flow.managed_paths(inventory)))
    for node in session.nodes:
        if node.name not in facts and node.name not in session.failures:
            session.fail(node.name, "the facts probe returned no output")
    return facts


def gather_and_plan(session, inventory, state, *, create_token: bool, facts=None, tolerate_unreachable=False,
                    join_via=None):
    """Facts, preflight, then each host's plan. Raises when preflight fails or (unless
    tolerated, as `rebuild` does) a host cannot be reached: then nothing has been changed."""
    from bootstrap.hostplan.rollout import version_findings

    facts = facts if facts is not None else gather_facts(session, inventory)
    findings = preflight(inventory, facts) + ownership_findings(inventory, facts, state.cluster_id)
    artifacts, target = None, None  # the k3s release to run (one for every arch)
    unreachable = bool(session.failures) and not tolerate_unreachable
    # An unreachable host is the problem to name; resolving a channel online can wait for it.
    if not unreachable and not any(f.severity == "error" for f in findings):
        artifacts = art.k3s_artifacts(inventory, {f.arch for f in facts.values()})
        target = next(iter(artifacts.values())).version if artifacts else None
        findings += version_findings(inventory, facts, target, {a: x.binary_sha256 for a, x in artifacts.items()})
    flow.print_findings(findings)
    errors = [f for f in findings if f.severity == "error"]
    if errors or unreachable:
        for failure in sorted(session.failures.values(), key=lambda f: f.node):
            print(f"FAILED {failure.render()}", file=sys.stderr)
        problems = len(errors) + len(session.failures)
        raise flow.PreflightFailed(f"preflight found {problems} problem(s); no host was changed",
                                   "fix the problems above and run the command again")
    token = flow.load_or_create_token(state, facts, inventory, create=create_token)
    plans = flow.make_plans(inventory, facts, token, artifacts, state.cluster_id, join_via)
    plans.target_version = target
    return facts, plans


@dataclass(frozen=True)
class UpOptions:
    hosts_only: bool = False
    validate: bool = True
    max_unavailable: int = 1
    drain_timeout: int = 300
    force: bool = False


def bring_up(inventory, state, options: UpOptions) -> None:
    started = time.monotonic()
    with cluster_lock(state, "up"):
        with open_hosts(inventory, list(inventory.nodes), "up") as session:
            facts, plans = gather_and_plan(session, inventory, state, create_token=True)
            if not any(p.changed for p in plans.plans.values()):
                if not (state.path / "kubeconfig").exists():
                    flow.fetch_kubeconfig(session, inventory, state)
                progress.current().event("hosts", changed=[], no_change=sorted(plans.plans), failed=[])
                print(f"hosts: no change, {len(plans.plans)} hosts already converged "
                      f"({time.monotonic() - started:.1f}s)")
            else:
                from bootstrap.hosts.executor import execute

                rollout = plans.rollout(inventory, facts, options.max_unavailable)
                results: dict = {}
                rest = {n: p for n, p in plans.plans.items() if not rollout or n not in rollout.nodes}

                def converge_rest():
                    results.update(execute(session, flow.converge_steps(inventory, rest, set(session.failures))))
                    flow.fetch_kubeconfig(session, inventory, state)

                if rollout:
                    from bootstrap.upgrade import run_rollout

                    from bootstrap.hosts.executor import StepResult

                    run_rollout(session, inventory, state, plans, rollout, converge_rest,
                                drain_timeout=options.drain_timeout, force=options.force)
                    for name in rollout.nodes:
                        results.setdefault(name, {})["upgrade k3s"] = StepResult("changed")
                else:
                    converge_rest()
                summarise(results, started)
                report_failures(session.failures)
                if not options.hosts_only:
                    # What k3s and the installs just created (the CNI bin dir in containerd's
                    # config, a freshly installed driver) decides the cluster side: look again.
                    facts = gather_facts(session, inventory)
        if options.hosts_only:
            return
        hosts_changed = any(p.changed for p in plans.plans.values())
        cluster_changed = cluster_phase(inventory, state, facts, validate=options.validate,
                                        hosts_changed=hosts_changed)
        if hosts_changed or cluster_changed:
            # A snapshot of what was just built: what `rebuild` restores after losing a server.
            from bootstrap import snapshots

            path = snapshots.take(inventory, state)
            print(f"snapshot: {path.name} copied to the state folder")
        record_applied(inventory, state)


def record_applied(inventory, state) -> None:
    """The digest of the inventory last applied in full, for `status` and later runs."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256(Path(inventory.source).read_bytes()).hexdigest()
    (state.path / "applied-inventory.sha256").write_text(f"{digest}  {inventory.source}\n")


def summarise(results, started) -> None:
    words = {}
    for name in sorted(results):
        statuses = {r.status for r in results[name].values()}
        words[name] = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "no change"
        print(f"{name}: {words[name]}")
    progress.current().event("hosts", **{w.replace(" ", "_"): [n for n in words if words[n] == w]
                                         for w in ("changed", "no change", "failed")})
    print(f"done in {time.monotonic() - started:.1f}s")
