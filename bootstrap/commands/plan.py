"""`bootstrap plan INVENTORY`: what `up` would change on each host and in the cluster,
changing nothing (bootstrap.flows.inspection)."""

from __future__ import annotations

from bootstrap.flows.inspection import planned_changes
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    console.say_lines(planned_changes(inventory, StateDir(inventory), console,
                                      max_unavailable=getattr(args, "max_unavailable", 1)))
    return 0
