"""`bootstrap up INVENTORY`: preflight every host, then converge them into a k3s cluster
(bootstrap.flows.host_phase)."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_events, add_max_unavailable, add_no_validate, add_replace

SUMMARY = "check every host, then build or converge the cluster"
JSON_EVENTS = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts-only", action="store_true", help="converge the hosts, skip the cluster side")
    add_no_validate(parser)
    add_max_unavailable(parser)
    parser.add_argument("--drain-timeout", type=int, default=300, metavar="S",
                        help="k3s upgrades: seconds to wait for a node's pods to be evicted (default 300)")
    parser.add_argument("--force", action="store_true",
                        help="k3s upgrades: delete pods a PodDisruptionBudget still protects after the time-out")
    add_replace(parser)
    add_json_events(parser)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.host_phase import UpOptions, bring_up
    from bootstrap.flows.replaced_machines import forget_replaced_keys
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    if args.replace:
        forget_replaced_keys(inventory, StateDir(inventory), args.replace, console)
    bring_up(inventory, StateDir(inventory), UpOptions(
        hosts_only=args.hosts_only, validate=not args.no_validate, max_unavailable=args.max_unavailable,
        drain_timeout=args.drain_timeout, force=args.force), console)
    return 0
