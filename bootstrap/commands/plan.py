"""`bootstrap plan INVENTORY`: what `up` would change on each host, changing nothing."""

from __future__ import annotations

from bootstrap.hosts.connections import open_hosts
from bootstrap.flows.host_phase import gather_and_plan
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "plan"):  # first contact pins host keys (and the API tunnel's)
        return show_plan(args, inventory, state, console)


def show_plan(args, inventory, state, console) -> int:
    with open_hosts(inventory, list(inventory.nodes), "plan", console) as session:
        facts, plans = gather_and_plan(session, inventory, state, console, create_token=False)
    for node in inventory.nodes:
        plan = plans.plans[node.name]
        if not plan.changed:
            print(f"{node.name}: no change")
            continue
        print(f"{node.name}:")
        for change in plan.changes:
            print(f"  - {change}")
    rollout = plans.rollout(inventory, facts, getattr(args, "max_unavailable", 1))
    if rollout:
        for line in rollout.describe():
            print(line)
    for line in component_changes(inventory, state, facts):
        print(line)
    return 0


def component_changes(inventory, state, facts) -> list[str]:
    """Which Helm releases `up` would install or upgrade (from the digests in the cluster)."""
    from bootstrap.components.cluster_plan import plan_cluster
    from bootstrap.errors import BootstrapError

    releases = plan_cluster(inventory, facts).releases
    applied: dict = {}
    try:
        from bootstrap.cluster.apply import read_digests
        from bootstrap.cluster.client import connect

        if (state.path / "kubeconfig").exists():
            with connect(inventory, state) as cluster:
                applied = read_digests(cluster)
    except BootstrapError:
        applied = {}
    from bootstrap.helm import APPLIED, NOT_INSTALLED, release_state

    lines = []
    for release in releases:
        state_now = release_state(release, applied)
        if state_now == NOT_INSTALLED:
            lines.append(f"component {release.name}: install {release.chart} {release.version}")
        elif state_now == APPLIED:
            lines.append(f"component {release.name}: no change")
        else:
            lines.append(f"component {release.name}: upgrade to {release.chart} {release.version} "
                         "(version or values changed)")
    return lines
