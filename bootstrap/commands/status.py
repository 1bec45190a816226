"""`bootstrap status INVENTORY`: nodes, GPUs, what the cluster advertises, components,
snapshots (bootstrap.flows.inspection)."""

from __future__ import annotations

from bootstrap.flows.inspection import cluster_status, render_status
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    report = cluster_status(inventory, StateDir(inventory), console)
    if args.json:
        console.document(report)
    else:
        console.say_lines(render_status(report))
    return 0
