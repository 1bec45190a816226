"""`bootstrap rebuild INVENTORY`: repair after spot loss (bootstrap.flows.repair)."""

from __future__ import annotations

from bootstrap.flows.repair import RepairOptions, repair
from bootstrap.flows.replaced_machines import forget_replaced_keys
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    if args.replace:
        forget_replaced_keys(inventory, StateDir(inventory), args.replace, console)
    options = RepairOptions(restore=args.restore, snapshot=args.snapshot, assume_yes=args.yes,
                            validate=not args.no_validate)
    repair(inventory, StateDir(inventory), options, console)
    return 0
