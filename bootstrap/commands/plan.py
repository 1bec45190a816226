"""`bootstrap plan INVENTORY`: what `up` would change on each host and in the cluster,
changing nothing (bootstrap.flows.inspection)."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_max_unavailable

SUMMARY = "show what `up` would change on each host, changing nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_max_unavailable(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.inspection import planned_changes
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    console.say_lines(planned_changes(inventory, StateDir(inventory), console,
                                      max_unavailable=getattr(args, "max_unavailable", 1)))
    return 0
