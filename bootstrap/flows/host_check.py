"""`bootstrap check --hosts`: every check `up` makes before it changes anything (facts,
preflight, ownership, versions, reachability between the nodes), on the real hosts, and
nothing more: no host is changed, no token is made."""

from __future__ import annotations

from bootstrap.flows.host_phase import gather_and_plan
from bootstrap.hosts.connections import open_hosts, report_failures
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def check_hosts(inventory, console, open_session=open_hosts) -> int:
    """0 when `up` would go ahead; PreflightFailed (exit 1) with every problem otherwise."""
    state = StateDir(inventory)
    with cluster_lock(state, "check"):  # first contact pins host keys
        with open_session(inventory, list(inventory.nodes), "check", console) as session:
            gather_and_plan(session, inventory, state, console, create_token=False)
    # A node left out on its own (gpu.health strict, answers that cannot be used): `up` would
    # go ahead without it, so the check fails naming it.
    report_failures(session.failures, console)
    console.say(f"hosts: every check passed on {len(inventory.nodes)} hosts; `up` would go ahead")
    return 0
