"""`bootstrap validate INVENTORY`: run the cluster checks; exit 1 when one fails."""

from __future__ import annotations

from bootstrap.hosts.connections import open_hosts
from bootstrap.flows.cluster_side import validate_cluster
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "validate"):  # it pins first-contact host keys
        with open_hosts(inventory, list(inventory.nodes), "validate", console) as session:
            from bootstrap.facts.pyinfra_fact import HostFactsFact

            facts = session.gather(HostFactsFact)
        return validate_cluster(inventory, state, facts, console, as_json=args.json)
