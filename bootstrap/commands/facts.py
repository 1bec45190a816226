"""`bootstrap facts INVENTORY`: what each host has, gathered in one SSH round trip per host."""

from __future__ import annotations

from bootstrap.commands.common import select_nodes
from bootstrap.hosts.connections import open_hosts, report_failures
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    nodes = select_nodes(inventory, args.node)
    # Read-only, but first contact pins host keys: known_hosts is written under the lock only.
    with cluster_lock(StateDir(inventory), "facts"), open_hosts(inventory, nodes, "facts", console) as session:
        from bootstrap.facts.pyinfra_fact import HostFactsFact

        facts = session.gather(HostFactsFact)
    for node in nodes:
        if node.name not in facts and node.name not in session.failures:
            session.failures[node.name] = _no_output(node.name)
    if args.json:
        console.document({
            "cluster": inventory.cluster,
            "hosts": {name: value.to_dict() for name, value in sorted(facts.items())},
            "failed": {f.node: f.message + (f"; {f.hint}" if f.hint else "")
                       for f in session.failures.values()},
        }, sort_keys=True)
    else:
        from bootstrap.facts.render import render_host

        blocks = [render_host(n.name, n.address, facts[n.name]) for n in nodes if n.name in facts]
        console.say("\n\n".join(blocks))
    report_failures(session.failures, console)
    return 0


def _no_output(name):
    from bootstrap.hosts.session import HostFailure

    return HostFailure(name, "the facts probe returned no output")
