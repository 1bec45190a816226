"""Opening the hosts for a command: the pyinfra session with its run log in the state
folder. Host failures end a command through bootstrap.progress.end_run."""

from __future__ import annotations

import contextlib
import time

from bootstrap.inventory.model import Inventory, Node
from bootstrap.progress import Console, end_run
from bootstrap.state.folder import StateDir
from bootstrap.remote.session import HostSession


@contextlib.contextmanager
def open_hosts(inventory: Inventory, nodes: list[Node], command: str, console: Console):
    """Connect to `nodes` in parallel; steps are reported to the console's reporter, the
    run log goes to the cluster's state folder."""
    state = StateDir(inventory)
    log_file = state.logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}.log"
    try:
        with HostSession(inventory, state, nodes, log_file=log_file, reporter=console.reporter) as session:
            yield session
    finally:
        if log_file.exists():
            console.warn(f"full log: {log_file}")


def report_failures(failures, console: Console) -> None:
    """(bootstrap.progress.end_run: the one reporter of host failures.)"""
    end_run(console, failures)
