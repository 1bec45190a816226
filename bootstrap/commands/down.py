"""`bootstrap down INVENTORY`: tear the cluster down, agents first, and give the hosts back."""

from __future__ import annotations

import sys
import time

from bootstrap.commands.common import open_hosts
from bootstrap.commands.common import report_failures
from bootstrap.errors import UsageError
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def confirm(inventory, assume_yes: bool) -> None:
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to tear down cluster {inventory.cluster} without confirmation",
                         "add --yes to confirm")
    # The question goes to stderr: under --json, stdout carries only events.
    print(f"Tear down cluster {inventory.cluster} on {len(inventory.nodes)} hosts? "
          f"Type the cluster name to confirm: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip() != inventory.cluster:
        raise UsageError("not confirmed; nothing was changed")


def uninstall(session, inventory, nodes, purge_drivers: bool) -> None:
    """Remove k3s and what the tool installed from `nodes`: agents first, then servers.
    (`down` for the whole cluster, `scale-down` for a few hosts.)"""
    from pyinfra.api import StringCommand

    from bootstrap.facts.host_facts import HostFactsFact
    from bootstrap.hosts.executor import Step, execute
    from bootstrap.teardown import teardown_script
    from bootstrap.up import managed_paths

    facts = session.gather(HostFactsFact, paths=tuple(managed_paths(inventory)))
    source = inventory.gpu.container_toolkit.apt_source
    scripts = {name: [StringCommand(teardown_script(f.manifest, purge_drivers=purge_drivers, toolkit_source=source))]
               for name, f in facts.items()}
    names = {n.name for n in nodes}
    agents = Step("remove agent", {n.name: scripts[n.name] for n in inventory.agents
                                   if n.name in scripts and n.name in names})
    servers = Step("remove server", {n.name: scripts[n.name] for n in inventory.servers
                                     if n.name in scripts and n.name in names})
    execute(session, [agents, servers])


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    confirm(inventory, args.yes)
    state = StateDir(inventory)
    started = time.monotonic()
    with cluster_lock(state, "down"):
        with open_hosts(inventory, list(inventory.nodes), "down") as session:
            uninstall(session, inventory, list(inventory.nodes), args.purge_drivers)
    for name in ("token", "kubeconfig"):
        (state.path / name).unlink(missing_ok=True)
    done = [n.name for n in inventory.nodes if n.name not in session.failures]
    print(f"removed k3s from {len(done)} host(s) in {time.monotonic() - started:.1f}s"
          + ("" if args.purge_drivers else "; NVIDIA drivers were left in place (--purge-drivers removes "
             "those the tool installed)"))
    report_failures(session.failures)
    return 0
