"""`bootstrap facts INVENTORY`: what each host has, gathered in one SSH round trip per host."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_document

SUMMARY = "show what each host has: OS, GPUs, driver, MIG profiles, RDMA, k3s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_document(parser)
    parser.add_argument("--node", action="append", metavar="NAME", help="only these nodes (repeatable)")


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.commands.common import select_nodes
    from bootstrap.host.facts.pyinfra_fact import HostFactsFact
    from bootstrap.host.facts.render import render_host
    from bootstrap.remote.connections import open_hosts, report_failures
    from bootstrap.remote.session import HostFailure
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.lock import cluster_lock
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    nodes = select_nodes(inventory, args.node)
    # Read-only, but first contact pins host keys: known_hosts is written under the lock only.
    with cluster_lock(StateDir(inventory), "facts"), open_hosts(inventory, nodes, "facts", console) as session:
        facts = session.gather(HostFactsFact)
    for node in nodes:
        if node.name not in facts and node.name not in session.failures:
            session.failures[node.name] = HostFailure(node.name, "the facts probe returned no output")
    if args.json:
        console.document({
            "cluster": inventory.cluster,
            "hosts": {name: value.to_dict() for name, value in sorted(facts.items())},
            "failed": {f.node: f.message + (f"; {f.hint}" if f.hint else "")
                       for f in session.failures.values()},
        }, sort_keys=True)
    else:
        blocks = [render_host(n.name, n.address, facts[n.name]) for n in nodes if n.name in facts]
        console.say("\n\n".join(blocks))
    report_failures(session.failures, console)
    return 0
