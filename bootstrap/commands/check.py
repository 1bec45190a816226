"""`bootstrap check INVENTORY`: validate offline; exit 0 or 2, no host touched. With
`--hosts`, also every check `up` makes on the hosts before changing them (exit 1 on a problem)."""

from __future__ import annotations

import argparse

SUMMARY = "validate an inventory offline; touches no host (--hosts: also check the hosts, changing nothing)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing when the inventory is valid")
    parser.add_argument("--hosts", action="store_true",
                        help="also run every check `up` makes on the hosts (preflight, reachability between "
                             "the nodes), changing nothing")


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.cluster.charts import check_archives
    from bootstrap.inventory.loader import load_inventory

    inventory = load_inventory(args.inventory)
    check_archives(inventory)
    if not args.quiet:
        gpu_nodes = [n.name for n in inventory.nodes if n.gpu.enabled is not False]
        console.say(f"{inventory.source}: valid: cluster {inventory.cluster}, "
              f"{len(inventory.servers)} server(s), {len(inventory.agents)} agent(s)"
              f"{'' if gpu_nodes else ', no GPU nodes'}")
    if getattr(args, "hosts", False):
        # imported here: startup time (pyinfra and the flows load only for --hosts)
        from bootstrap.flows.host_check import check_hosts

        return check_hosts(inventory, console)
    return 0
