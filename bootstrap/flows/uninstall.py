"""Uninstall (`bootstrap down`, `bootstrap scale-down`): remove k3s, agents first, and give
the hosts back.

Only hosts this cluster set up are touched (their manifest carries its id); a host of
another cluster, or with a k3s the tool did not install, is refused unless --force. The
join token and kubeconfig are deleted only once every server was really uninstalled:
while a server may still run k3s, they are what reaches it.
"""

from __future__ import annotations

import time

from pyinfra.api import StringCommand

from bootstrap.console_text import printable
from bootstrap.remote.connections import open_hosts, report_failures
from bootstrap.errors import HostsFailed
from bootstrap.state.lock import cluster_lock
from bootstrap.host.plan.steps import Step
from bootstrap.host.facts.pyinfra_fact import HostFactsFact
from bootstrap.host.parts.manifest import MANIFEST
from bootstrap.host.parts.paths import managed_paths
from bootstrap.checks.ownership import ownership
from bootstrap.remote_data import RemoteDataError
from bootstrap.host.teardown import teardown_script


def uninstall(session, inventory, state, nodes, purge_drivers: bool, console, force: bool = False,
              before_teardown=None) -> list[str]:
    """Remove k3s and what the tool installed from `nodes`: agents first, then servers.
    (`down` for the whole cluster, `scale-down` for a few hosts.) Hosts with nothing of
    anyone's on them are left alone; returns their names. A host another cluster owns
    stops the whole command before anything changes, unless `force`; a host whose manifest
    cannot be read fails on its own (with `force`, k3s is wiped from it) and the others go on. `before_teardown()`
    runs once no host was refused, before any is torn down (scale-down: stop k3s, remove
    the members)."""
    facts, owners = owned_hosts(session, inventory, state, nodes, force)
    foreign = {name: o.reason for name, o in owners.items() if o.verdict == "foreign"}
    if foreign and not force:
        for name, reason in sorted(foreign.items()):
            console.warn(f"REFUSED {name}: {printable(reason)}")
        raise HostsFailed(f"not removing k3s from {', '.join(sorted(foreign))}: not set up by this cluster; "
                          "nothing was changed on any host",
                          "remove those nodes from the inventory, or add --force to wipe k3s from them anyway")
    empty = sorted(name for name, o in owners.items() if o.verdict == "empty" and not force)
    scripts = teardown_scripts(session, inventory, facts, owners, empty, purge_drivers)
    if before_teardown is not None:  # every script is built: nothing is half-done for one host's record
        before_teardown()
    agents = Step("remove agent", {n.name: scripts[n.name] for n in inventory.agents if n.name in scripts})
    servers = Step("remove server", {n.name: scripts[n.name] for n in inventory.servers if n.name in scripts})
    session.execute([agents, servers])
    for name in empty:
        console.say(f"{name}: nothing of bootstrap's or k3s's on it; left untouched")
    return empty


def owned_hosts(session, inventory, state, nodes, force: bool):
    """(facts of the hosts that may be torn down, {node: Ownership}): a host whose manifest
    cannot be read fails on its own, unless `force`."""
    names = {n.name for n in nodes}
    facts = {n: f for n, f in session.gather(HostFactsFact, paths=tuple(managed_paths(inventory))).items()
             if n in names}
    for name in sorted(names - set(facts) - set(session.failures)):
        session.fail(name, "the facts probe returned no output; nothing was removed")
    owners = {name: ownership(f, state.cluster_id) for name, f in facts.items()}
    for name, owner in sorted(owners.items()):
        # A manifest the tool cannot read: that host's failure, the others go on. --force
        # wipes k3s from it as from a foreign host, undoing nothing the manifest claims.
        if owner.verdict == "unknown" and not force:
            session.fail(name, f"{owner.reason}; nothing was removed from it",
                         f"look at {MANIFEST} on the host: if it is this cluster's, remove that file and run "
                         "`bootstrap down` again, or add --force to wipe k3s from it anyway")
    return {name: f for name, f in facts.items() if name not in session.failures}, owners


def teardown_scripts(session, inventory, facts, owners, empty: list[str], purge_drivers: bool) -> dict:
    """{node: [the one root script that tears it down]}; a record that cannot be read fails its host."""
    source = inventory.gpu.container_toolkit.apt_source
    scripts = {}
    for name, f in facts.items():
        if name in empty:
            continue
        recorded = {} if owners[name].verdict == "unknown" else f.manifest
        try:
            script = teardown_script(recorded, purge_drivers=purge_drivers, toolkit_source=source)
        except RemoteDataError as exc:  # one host's record: its failure, never the others'
            session.fail(name, f"{exc}; nothing was removed from it")
            continue
        scripts[name] = [StringCommand(script)]
    return scripts


def tear_down(inventory, state, console, *, purge_drivers: bool, force: bool, open_session=open_hosts) -> None:
    """The whole cluster; the state folder's secrets go only when no server may run k3s.
    `open_session(inventory, nodes, command, console)`: the hosts (a fake one in tests)."""
    started = time.monotonic()
    with cluster_lock(state, "down"):
        with open_session(inventory, list(inventory.nodes), "down", console) as session:
            untouched = uninstall(session, inventory, state, list(inventory.nodes), purge_drivers, console, force)
        removed = [n.name for n in inventory.nodes if n.name not in session.failures and n.name not in untouched]
        console.say(f"removed k3s from {len(removed)} host(s) in {time.monotonic() - started:.1f}s"
              + ("" if purge_drivers else "; NVIDIA drivers were left in place (--purge-drivers removes "
                 "those the tool installed)"))
        left = sorted(session.failures)
        servers_left = [n.name for n in inventory.servers if n.name in session.failures]
        if servers_left:
            # The token and kubeconfig are the only way back into a server still running k3s.
            console.warn(f"kept the join token and kubeconfig in {state.path}: k3s may still run on "
                         f"{', '.join(left)} (not reached or not removed); run `bootstrap down` again once they "
                         "answer")
        else:
            for name in ("token", "agent-token", "ca-hash", "no-agent-token", "kubeconfig"):
                (state.path / name).unlink(missing_ok=True)
            if not left:
                state.renew_identity()  # the next `up` builds a new cluster, with its own id
            else:
                console.warn(f"k3s may still run on {', '.join(left)} (not reached): its server is gone, so it "
                             "can never rejoin; remove k3s from it by hand or run `bootstrap down` again once it "
                             "answers")
    report_failures(session.failures, console)
