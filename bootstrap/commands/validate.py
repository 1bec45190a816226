"""`bootstrap validate INVENTORY`: run the cluster checks; exit 1 when one fails."""

from __future__ import annotations

import json

from bootstrap.commands.common import open_hosts
from bootstrap.errors import EXIT_FAILED, EXIT_OK
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def validate(inventory, state, facts, *, as_json: bool = False) -> int:
    from bootstrap.cluster.client import connect
    from bootstrap.cluster.validate import render_table, run_checks

    with connect(inventory, state) as cluster:
        results = run_checks(cluster, inventory, facts)
    from bootstrap import progress

    if progress.json_events():  # inside `up --json`: one event, not a document
        progress.current().event("validate", checks=[r.to_dict() for r in results])
    elif as_json:
        print(json.dumps({"cluster": inventory.cluster, "checks": [r.to_dict() for r in results]}, indent=2))
    else:
        print(render_table(results))
    failed = [r for r in results if r.status == "FAIL"]
    if failed and not as_json and not progress.json_events():
        print(f"{len(failed)} check(s) failed")
    return EXIT_FAILED if failed else EXIT_OK


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "validate"):  # it pins first-contact host keys
        with open_hosts(inventory, list(inventory.nodes), "validate") as session:
            from bootstrap.facts.host_facts import HostFactsFact

            facts = session.gather(HostFactsFact)
        return validate(inventory, state, facts, as_json=args.json)
