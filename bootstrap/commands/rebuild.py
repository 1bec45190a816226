"""`bootstrap rebuild INVENTORY`: repair after spot loss (bootstrap.flows.repair)."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_events, add_no_validate, add_replace

SUMMARY = "after spot loss: remove lost nodes, join replacements, restore a lost control plane"
JSON_EVENTS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_replace(parser)
    add_no_validate(parser)
    parser.add_argument("--restore", action="store_true",
                        help="when no server's k3s answers: restore the control plane from the newest snapshot "
                             "in the state folder (or --snapshot NAME); says what is lost and asks first")
    parser.add_argument("--snapshot", metavar="NAME", help="with --restore: the snapshot to restore")
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask before restoring")
    add_json_events(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.repair import RepairOptions, repair
    from bootstrap.flows.replaced_machines import forget_replaced_keys
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    if args.replace:
        forget_replaced_keys(inventory, StateDir(inventory), args.replace, console)
    options = RepairOptions(restore=args.restore, snapshot=args.snapshot, assume_yes=args.yes,
                            validate=not args.no_validate)
    repair(inventory, StateDir(inventory), options, console)
    return 0
