"""`bootstrap check --hosts`: every check `up` makes before it changes anything (facts,
preflight, ownership, versions, reachability between the nodes), on the real hosts, and
nothing more: no host is changed, no token is made."""

from __future__ import annotations

import contextlib

from bootstrap.flows.host_phase import preflight_and_plan, probe
from bootstrap.flows.run import Run
from bootstrap.remote.connections import open_hosts
from bootstrap.state.lock import cluster_lock
from bootstrap.progress import end_run
from bootstrap.state.folder import StateDir


def check_hosts(inventory, console, open_session=open_hosts) -> int:
    """0 when `up` would go ahead; PreflightFailed (exit 1) with every problem otherwise."""
    run = Run(inventory, StateDir(inventory), console)
    with cluster_lock(run.state, "check"), contextlib.ExitStack() as hosts:  # first contact pins host keys
        run.open_hosts(hosts, open_session, inventory.nodes, "check")
        probe(run)
        preflight_and_plan(run, create_token=False)
    # A node left out on its own (gpu.health strict, answers that cannot be used): `up` would
    # go ahead without it, so the check fails naming it.
    end_run(console, run.failures)
    console.say(f"hosts: every check passed on {len(inventory.nodes)} hosts; `up` would go ahead")
    return 0
