"""`bootstrap status INVENTORY`: nodes, GPUs, what the cluster advertises, components,
snapshots (bootstrap.flows.inspection)."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_document

SUMMARY = "nodes, GPUs, advertised resources, components and snapshots at a glance"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_document(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.inspection import cluster_status, render_status
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    report = cluster_status(inventory, StateDir(inventory), console)
    if args.json:
        console.document(report)
    else:
        console.say_lines(render_status(report))
    return 0
