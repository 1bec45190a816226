"""`bootstrap up INVENTORY`: preflight every host, then converge them into a k3s cluster."""

from __future__ import annotations

import sys
import time

from bootstrap import artifacts as art
from bootstrap import up as flow
from bootstrap.commands.common import open_hosts
from bootstrap.commands.facts import report_failures
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def gather_and_plan(session, inventory, state, *, create_token: bool):
    """Facts in one round trip per host, preflight, then each host's plan. Raises when
    preflight fails or a host cannot be reached: then nothing has been changed."""
    from bootstrap.facts.host_facts import HostFactsFact

    paths = sorted(set(flow.managed_paths(inventory, {})) | set(flow.local_images_candidates(inventory)))
    facts = session.gather(HostFactsFact, paths=tuple(paths))
    for node in inventory.nodes:
        if node.name not in facts and node.name not in session.failures:
            session.fail(node.name, "the facts probe returned no output")
    findings = flow.preflight(inventory, facts)
    flow.print_findings(findings)
    errors = [f for f in findings if f.severity == "error"]
    if errors or session.failures:
        for failure in sorted(session.failures.values(), key=lambda f: f.node):
            print(f"FAILED {failure.render()}", file=sys.stderr)
        problems = len(errors) + len(session.failures)
        raise flow.PreflightFailed(f"preflight found {problems} problem(s); no host was changed",
                                   "fix the problems above and run the command again")
    artifacts = art.k3s_artifacts(inventory, {facts[n.name].arch for n in inventory.nodes})
    token = flow.load_or_create_token(state, facts, inventory, create=create_token)
    return facts, flow.make_plans(inventory, facts, token, artifacts)


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    started = time.monotonic()
    with cluster_lock(state, "up"):
        with open_hosts(inventory, list(inventory.nodes), "up") as session:
            facts, plans = gather_and_plan(session, inventory, state, create_token=True)
            if not any(p.changed for p in plans.plans.values()):
                if not (state.path / "kubeconfig").exists():
                    flow.fetch_kubeconfig(session, inventory, state)
                print(f"no change: {len(plans.plans)} hosts already converged ({time.monotonic() - started:.1f}s)")
                return 0
            from bootstrap.hosts.executor import execute

            results = execute(session, flow.converge_steps(inventory, plans.plans, set(session.failures)))
            flow.fetch_kubeconfig(session, inventory, state)
            summarise(results, started)
            report_failures(session.failures)
    return 0


def summarise(results, started) -> None:
    for name in sorted(results):
        statuses = {r.status for r in results[name].values()}
        word = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "no change"
        print(f"{name}: {word}")
    print(f"done in {time.monotonic() - started:.1f}s")
