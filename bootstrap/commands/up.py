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


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    started = time.monotonic()
    with cluster_lock(state, "up"):
        local_images = flow.local_images_candidates(inventory)
        with open_hosts(inventory, list(inventory.nodes), "up") as session:
            from bootstrap.facts.host_facts import HostFactsFact

            paths = sorted(set(flow.managed_paths(inventory, {})) | set(local_images))
            facts = session.gather(HostFactsFact, paths=tuple(paths))
            for name in [n.name for n in inventory.nodes]:
                if name not in facts and name not in session.failures:
                    session.fail(name, "the facts probe returned no output")
            findings = flow.preflight(inventory, facts)
            flow.print_findings(findings)
            errors = [f for f in findings if f.severity == "error"]
            if errors or session.failures:
                for failure in sorted(session.failures.values(), key=lambda f: f.node):
                    print(f"FAILED {failure.render()}", file=sys.stderr)
                raise flow.PreflightFailed(f"preflight found {len(errors)} problem(s); no host was changed",
                                           "fix the problems above and run `bootstrap up` again")
            arches = {facts[n.name].arch for n in inventory.nodes}
            artifacts = art.k3s_artifacts(inventory, arches)
            token = flow.load_or_create_token(state, facts, inventory)
            plans = flow.make_plans(inventory, facts, token, artifacts)
            if not any(p.changed for p in plans.plans.values()):
                fetch_kubeconfig_if_missing(session, inventory, state, facts)
                print(f"no change: {len(plans.plans)} hosts already converged ({time.monotonic() - started:.1f}s)")
                return 0
            from bootstrap.hosts.executor import execute

            steps = flow.converge_steps(inventory, plans.plans, set(session.failures))
            results = execute(session, steps)
            fetch_kubeconfig(session, inventory, state, force=True)
            summarise(results, started)
            report_failures(session.failures)
    return 0


def summarise(results, started) -> None:
    for name in sorted(results):
        statuses = {r.status for r in results[name].values()}
        word = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "no change"
        print(f"{name}: {word}")
    print(f"done in {time.monotonic() - started:.1f}s")


def fetch_kubeconfig_if_missing(session, inventory, state, facts) -> None:
    if not (state.path / "kubeconfig").exists():
        fetch_kubeconfig(session, inventory, state, force=True)


def fetch_kubeconfig(session, inventory, state, force=False) -> None:
    """Read k3s.yaml from the first server (never printed), point it at the server, keep it 0600."""
    import yaml

    from bootstrap.hostplan import desired as d
    from bootstrap.hostplan.k3sconfig import cluster_address

    first = inventory.servers[0]
    if first.name in session.failures:
        return
    host = session.pyinfra_state.inventory.get_host(first.name)
    ok, output = host.run_shell_command(f"cat {d.KUBECONFIG}", _sudo=host.data.get("_sudo", False),
                                        print_output=False, print_input=False)
    if not ok:
        session.fail(first.name, f"cannot read {d.KUBECONFIG}")
        return
    config = yaml.safe_load(output.stdout)
    address = first.address
    for cluster in config.get("clusters", []):
        server = cluster["cluster"]["server"]
        scheme = server.split("://", 1)[0]
        cluster["cluster"]["server"] = f"{scheme}://{address}:6443"
        cluster["name"] = f"bootstrap-{inventory.cluster}"
    for user in config.get("users", []):
        user["name"] = f"bootstrap-{inventory.cluster}"
    for context in config.get("contexts", []):
        context["name"] = f"bootstrap-{inventory.cluster}"
        context["context"]["cluster"] = f"bootstrap-{inventory.cluster}"
        context["context"]["user"] = f"bootstrap-{inventory.cluster}"
    config["current-context"] = f"bootstrap-{inventory.cluster}"
    state.write_secret("kubeconfig", yaml.safe_dump(config, default_flow_style=False))
