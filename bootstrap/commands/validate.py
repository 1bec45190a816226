"""`bootstrap validate INVENTORY`: run the cluster checks; exit 1 when one fails."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_document

SUMMARY = "prove the cluster works: GPU pods, capacity, RDMA, a PVC, a gang job"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_document(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.host.facts.pyinfra_fact import HostFactsFact
    from bootstrap.flows.cluster_side import validate_cluster
    from bootstrap.remote.connections import open_hosts
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.lock import cluster_lock
    from bootstrap.state.folder import StateDir
    from bootstrap.topology import resolve_topology

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "validate"):  # it pins first-contact host keys
        with open_hosts(inventory, list(inventory.nodes), "validate", console) as session:
            facts = session.gather(HostFactsFact)
        gpu = resolve_topology(inventory, facts).gpu_nodes_of(inventory)
        return validate_cluster(inventory, state, facts, console, gpu=gpu, as_json=args.json)
