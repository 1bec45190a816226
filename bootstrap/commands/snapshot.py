"""`bootstrap snapshot INVENTORY`: an etcd snapshot now, copied to the state folder."""

from __future__ import annotations

import argparse

SUMMARY = "take an etcd snapshot now and copy it (with its token) to the state folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags of its own."""


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.lock import cluster_lock
    from bootstrap.state.snapshots import take
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "snapshot"):
        path = take(inventory, state)
    console.say(f"snapshot saved: {path} (with its token beside it, 0600)")
    return 0
