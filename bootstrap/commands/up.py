"""`bootstrap up INVENTORY`: preflight every host, then converge them into a k3s cluster
(bootstrap.flows.host_phase)."""

from __future__ import annotations

from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    bring_up(inventory, StateDir(inventory), UpOptions(
        hosts_only=args.hosts_only, validate=not args.no_validate, max_unavailable=args.max_unavailable,
        drain_timeout=args.drain_timeout, force=args.force), console)
    return 0
