"""`bootstrap scale-down INVENTORY --node NAME... | --idle`: drain, delete, uninstall
(bootstrap.flows.scale_down)."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_events

SUMMARY = "drain, delete and uninstall nodes (--node NAME..., or --idle GPU nodes)"
JSON_EVENTS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", action="append", metavar="NAME", help="a node to remove (repeatable)")
    parser.add_argument("--idle", action="store_true", help="every GPU agent with no GPU pods")
    parser.add_argument("--timeout", type=int, default=300, help="seconds to wait for evictions (default 300)")
    parser.add_argument("--force", action="store_true", help="delete pods still blocked after the time-out")
    parser.add_argument("--purge-drivers", action="store_true", help="also remove drivers the tool installed")
    parser.add_argument("--yes", "-y", action="store_true",
                        help="with --idle: do not ask before removing the idle GPU nodes it found")
    parser.add_argument("--keep", type=int, default=0, metavar="N",
                        help="with --idle: leave N idle GPU nodes (the first in the inventory) in the cluster")
    add_json_events(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.scale_down import ScaleDownOptions, scale_down
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    options = ScaleDownOptions(nodes=args.node or [], idle=args.idle, drain_timeout=args.timeout,
                               force=args.force, purge_drivers=args.purge_drivers, assume_yes=args.yes, keep=args.keep)
    scale_down(inventory, StateDir(inventory), options, console)
    return 0
