"""`bootstrap forget-host INVENTORY NODE...`: drop the pinned key of a replaced machine."""

from __future__ import annotations

import argparse

from bootstrap.errors import UsageError

SUMMARY = "forget the pinned SSH host key of a replaced machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE", nargs="+", help="node name(s) whose machine was replaced")


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.lock import cluster_lock
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    names = {n.name for n in inventory.nodes}
    unknown = [n for n in args.node if n not in names]
    if unknown:
        raise UsageError(f"no node named {', '.join(unknown)} in {inventory.source}",
                         f"nodes are: {', '.join(sorted(names))}")
    with cluster_lock(state, "forget-host"):
        for name in args.node:
            forget_one(state, inventory, name, console)
    return 0


def forget_one(state, inventory, name, console) -> None:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.remote import hostkeys

    node = inventory.node(name)
    port = inventory.ssh_for(node).port
    entry = hostkeys.known_hosts_entry(node.address, port)
    if hostkeys.forget(state.known_hosts, node.address, port):
        console.say(f"{name}: forgot the pinned host key of {entry}; the next contact pins the new machine's key")
    else:
        console.say(f"{name}: no pinned host key for {entry}")
