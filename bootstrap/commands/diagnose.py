"""`bootstrap diagnose INVENTORY`: a support bundle (bootstrap.flows.diagnose), one .tar.gz in
the state folder, secrets redacted; prints its summary of what looks wrong and where it is."""

from __future__ import annotations

import argparse

SUMMARY = "collect a support bundle (.tar.gz, secrets redacted) of every host and the cluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """diagnose takes no option beyond the inventory."""


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.diagnose import diagnose
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    path, summary = diagnose(inventory, StateDir(inventory), console)
    console.say_lines(summary)
    console.say(f"bundle (secrets redacted; read it before you share it): {path}")
    return 0
