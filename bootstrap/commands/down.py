"""`bootstrap down INVENTORY`: tear the cluster down (bootstrap.flows.uninstall), after asking."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_events
from bootstrap.consent import ask_for_cluster_name

SUMMARY = "tear the cluster down and give the hosts back as they were"
JSON_EVENTS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_events(parser)
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--purge-drivers", action="store_true",
                        help="also remove NVIDIA driver packages the tool installed")
    parser.add_argument("--force", action="store_true",
                        help="also wipe k3s from hosts this cluster did not set up (another cluster's, or "
                             "installed by hand)")


def confirm(inventory, assume_yes: bool) -> None:
    ask_for_cluster_name(inventory, f"Tear down cluster {inventory.cluster} on {len(inventory.nodes)} hosts?",
                         f"refusing to tear down cluster {inventory.cluster} without confirmation", assume_yes)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.uninstall import tear_down
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    confirm(inventory, args.yes)
    tear_down(inventory, StateDir(inventory), console, purge_drivers=args.purge_drivers,
              force=args.force)
    return 0
