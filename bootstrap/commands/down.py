"""`bootstrap down INVENTORY`: tear the cluster down (bootstrap.flows.uninstall), after asking."""

from __future__ import annotations

from bootstrap.consent import ask_for_cluster_name
from bootstrap.flows.uninstall import tear_down
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def confirm(inventory, assume_yes: bool) -> None:
    ask_for_cluster_name(inventory, f"Tear down cluster {inventory.cluster} on {len(inventory.nodes)} hosts?",
                         f"refusing to tear down cluster {inventory.cluster} without confirmation", assume_yes)


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    confirm(inventory, args.yes)
    tear_down(inventory, StateDir(inventory), console, purge_drivers=args.purge_drivers,
              force=args.force)
    return 0
