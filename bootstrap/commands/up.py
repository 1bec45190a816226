"""`bootstrap up INVENTORY`: preflight every host, then converge them into a k3s cluster
(bootstrap.flows.host_phase)."""

from __future__ import annotations

from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.flows.replaced_machines import forget_replaced_keys
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    if args.replace:
        forget_replaced_keys(inventory, StateDir(inventory), args.replace, console)
    bring_up(inventory, StateDir(inventory), UpOptions(
        hosts_only=args.hosts_only, validate=not args.no_validate, max_unavailable=args.max_unavailable,
        drain_timeout=args.drain_timeout, force=args.force), console)
    return 0
