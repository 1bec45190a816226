"""`bootstrap down INVENTORY`: tear the cluster down (bootstrap.flows.uninstall), after asking."""

from __future__ import annotations

import sys

from bootstrap.errors import UsageError
from bootstrap.flows.uninstall import tear_down
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def confirm(inventory, assume_yes: bool) -> None:
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to tear down cluster {inventory.cluster} without confirmation",
                         "add --yes to confirm")
    # The question goes to stderr: under --json, stdout carries only events.
    print(f"Tear down cluster {inventory.cluster} on {len(inventory.nodes)} hosts? "
          f"Type the cluster name to confirm: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip() != inventory.cluster:
        raise UsageError("not confirmed; nothing was changed")


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    confirm(inventory, args.yes)
    tear_down(inventory, StateDir(inventory), console, purge_drivers=args.purge_drivers,
              force=args.force)
    return 0
