"""The cluster CA's hash that joins name (bootstrap.host.plan.join_tokens): learnt from the
server nodes join, kept in the state folder (`ca-hash`) so a later run needs no round trip,
and read again from that server whenever the kept one may be refused.

A rotated CA (`k3s certificate rotate-ca`, k3s-io/docs docs/cli/certificate.md) gets a new
hash, and every join that names the old one is refused ("token CA hash does not match the
Cluster CA certificate hash", k3s-io/k3s pkg/clientaccess/token.go, validateCAHash). The
server's own `server/token` file is what such a join is checked against, so it decides;
a joining node's word that it was refused only makes the tool ask that server again.
"""

from __future__ import annotations

from bootstrap.errors import BootstrapError
from bootstrap.host.plan.join_tokens import CA_HASH_REFUSED, PLACEHOLDER, SERVER_TOKEN_FILE, JoinTokens, ca_hash_from_server_token
from bootstrap.inventory.model import Inventory
from bootstrap.state.folder import StateDir

CA_HASH = "ca-hash"  # the state folder's copy of the cluster CA's sha256


def k3s_server_runs(facts: dict, server) -> bool:
    install = getattr(facts.get(server.name), "k3s", None)
    unit = install.unit("k3s") if install else None
    return unit is not None and unit.active


def learn_ca_hash(session, inventory: Inventory, state: StateDir, tokens: JoinTokens, facts, join_via=None,
                  keep: bool = True) -> JoinTokens:
    """`tokens` with the cluster CA's hash, read from the server nodes join (`join_via`, else
    the first server) when its k3s runs and the state folder does not hold it yet; kept
    there (`keep`) so later runs need no round trip. Unchanged while no server runs."""
    if tokens.ca_hash or tokens is PLACEHOLDER:
        return tokens
    target = join_via or inventory.servers[0]
    if not k3s_server_runs(facts, target):
        return tokens
    return read_ca_hash(session, target, state, tokens, keep)


def read_ca_hash(session, server, state: StateDir, tokens: JoinTokens, keep: bool = True) -> JoinTokens:
    """The hash from `server`'s own server/token file, checked strictly (its format, and
    that it holds this cluster's server token); an error before any join uses it."""
    text = session.read_root_file(server.name, SERVER_TOKEN_FILE)
    try:
        ca_hash = ca_hash_from_server_token(text, tokens.server)
    except ValueError as problem:
        raise BootstrapError(f"cannot learn the cluster CA's hash from {server.name}: {problem}; "
                             "no node joins without it",
                             f"check k3s on {server.name} (journalctl -u k3s), then run the command again") from None
    if keep:
        state.write_secret(CA_HASH, ca_hash + "\n")
    return tokens.with_ca_hash(ca_hash)


def joining(plans: dict, server_name: str) -> list[str]:
    """The nodes whose k3s (re)starts in these plans, and so joins `server_name` with the hash."""
    return sorted(name for name, plan in plans.items() if name != server_name and plan.service)


def recheck_kept_ca_hash(session, console, state: StateDir, tokens: JoinTokens, server, joiners: list[str]) -> JoinTokens:
    """Before `joiners` join with the hash the state folder kept: the server's own hash (one
    read, only in a run where a node joins). A different one is said and kept, and used."""
    fresh = read_ca_hash(session, server, state, tokens)
    if fresh.ca_hash != tokens.ca_hash:
        console.say(f"the cluster CA's hash kept in the state folder ({tokens.ca_hash[:12]}...) is not the one "
                    f"{server.name} has now ({fresh.ca_hash[:12]}...): the CA was rotated. Read again from "
                    f"{server.name} and kept; {', '.join(joiners)} join with it")
    return fresh


def refused_for_the_ca_hash(failures: dict) -> list[str]:
    """The hosts whose start failed with k3s's CA-hash refusal (in their own failure)."""
    return sorted(name for name, failure in failures.items() if CA_HASH_REFUSED in failure.message)


def after_a_refused_join(session, console, state: StateDir, tokens: JoinTokens, server, refused: list[str]) -> JoinTokens:
    """Joins refused for the hash they named (the server's CA changed while this run went on, or
    the hash read before was stale): read it again from the server and keep it, so the next
    run joins with it; the same hash means the server those nodes reached is not this one."""
    who = ", ".join(refused)
    try:
        fresh = read_ca_hash(session, server, state, tokens)
    except BootstrapError as exc:
        console.warn(f"{who}: their join was refused for the cluster CA's hash, and {exc.args[0]}")
        return tokens
    if fresh.ca_hash != tokens.ca_hash:
        console.say(f"{who}: their join was refused for the cluster CA's hash ({tokens.ca_hash[:12]}...); read again "
                    f"from {server.name}: {fresh.ca_hash[:12]}... (the CA was rotated), kept in the state folder: "
                    "run `bootstrap up` again to join them with it")
    else:
        console.warn(f"{who}: their join was refused for the cluster CA's hash, which {server.name} still has: the "
                     "server they reached at its address is not this cluster's (check the address and its routes)")
    return fresh
