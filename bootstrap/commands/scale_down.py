"""`bootstrap scale-down INVENTORY --node NAME... | --idle`: drain, delete, uninstall
(bootstrap.flows.scale_down)."""

from __future__ import annotations

from bootstrap.flows.scale_down import ScaleDownOptions, scale_down
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    options = ScaleDownOptions(nodes=args.node or [], idle=args.idle, drain_timeout=args.timeout,
                               force=args.force, purge_drivers=args.purge_drivers, assume_yes=args.yes, keep=args.keep)
    scale_down(inventory, StateDir(inventory), options, console)
    return 0
