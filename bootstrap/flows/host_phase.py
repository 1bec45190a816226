"""`up`'s pipeline: facts and preflight on every host, converge them (or roll an upgrade),
then the cluster side and a snapshot. `plan` and `rebuild` reuse its first half."""

from __future__ import annotations

import contextlib
import functools
import re
import secrets
import time
from dataclasses import dataclass

from bootstrap.artifacts import k3s_artifacts
from bootstrap.chart_archives import check_archives
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.facts.host_facts import HostFacts
from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.hostparts.k3s_service import CONFIG, KUBECONFIG
from bootstrap.hostparts.paths import managed_paths
from bootstrap.hostplan.all_hosts import make_plans
from bootstrap.hostplan.host_plan import after_the_ca, before_the_ca
from bootstrap.hostplan.join_tokens import (LEGACY_NOTE, PLACEHOLDER, SERVER_TOKEN_FILE, JoinTokens,
                                            ca_hash_from_server_token, is_secret)
from bootstrap.hostplan.steps import converge_steps, first_server_step
from bootstrap.hosts.connections import open_hosts, report_failures
from bootstrap.inventory.model import Inventory
from bootstrap.lock import cluster_lock
from bootstrap.preflight import Finding, ownership_findings, preflight
from bootstrap.secrets import with_secret_values
from bootstrap.statedir import StateDir


class PreflightFailed(BootstrapError):
    pass


CA_HASH = "ca-hash"  # the state folder's copy of the cluster CA's sha256 (bootstrap.hostplan.join_tokens)
# The state folder's mark of a cluster built before agent tokens (join_tokens.LEGACY_NOTE).
NO_AGENT_TOKEN = "no-agent-token"


def read_secret(state: StateDir, name: str, valid) -> str | None:
    """A secret of the state folder (`valid(text)` says whether it has the right shape), or
    None when it does not exist. An empty or damaged one is an error naming the file, never
    used: an empty token would join nothing, or worse, be written to every node.
    StateDir.read_secret reads it (no symlink followed, size capped, one printable line)."""
    path = state.path / name
    if not path.exists():
        return None
    text = state.read_secret(name)
    if not valid(text):
        raise UsageError(f"{path} is damaged; nothing was changed",
                         f"restore {name} from a copy of the state folder, or, if the cluster is gone, "
                         f"delete {path} so that `up` makes a new one")
    return text


def load_or_create_tokens(state: StateDir, facts: dict[str, HostFacts], inventory: Inventory,
                          create: bool = True, create_agent: bool | None = None) -> JoinTokens:
    """The server and agent tokens, generated once by the tool and kept 0600 in the state
    folder, with the cluster CA's hash once it is known (`ca-hash`). `create`: make the
    server token of a new cluster; `create_agent` (default: `create`): make the agent
    token, also for a cluster that has only its server token (it converges to one)."""
    create_agent = create if create_agent is None else create_agent
    server = read_secret(state, "token", is_secret)
    existing = [n.name for n in inventory.servers if CONFIG in facts.get(n.name, HostFacts()).files]
    if server is None:
        if not create:
            return PLACEHOLDER
        if existing:
            raise BootstrapError(
                f"server {existing[0]} already runs a k3s configured by bootstrap, but the join token is not "
                f"in the state folder {state.path}",
                "restore the state folder (token, known_hosts) from where `up` ran before, or set "
                "state_dir in the inventory to it")
        server = secrets.token_hex(24)
        state.write_secret("token", server + "\n")
    agent = read_secret(state, "agent-token", is_secret)
    ca_hash = read_secret(state, CA_HASH, lambda t: re.fullmatch(r"[0-9a-f]{64}", t))
    if agent is None and existing:
        return legacy_tokens(state, server, ca_hash, keep=create_agent)
    if agent is None:
        if not create_agent:
            return JoinTokens(server, PLACEHOLDER.agent)
        agent = secrets.token_hex(24)
        state.write_secret("agent-token", agent + "\n")
    return JoinTokens(server, agent, ca_hash)


def legacy_tokens(state: StateDir, server: str, ca_hash: str | None, keep: bool) -> JoinTokens:
    """A running cluster whose state folder has no agent token. Built before agent tokens
    (its folder has no `ca-hash` yet, or the NO_AGENT_TOKEN mark a run left): its servers
    run without one and must not get one now (LEGACY_NOTE). A folder that has `ca-hash` but
    neither lost its agent token: an error, since joining the agents with the server token
    would change what the servers run with, and the servers' next start would fail."""
    marked = (state.path / NO_AGENT_TOKEN).exists()
    if ca_hash is not None and not marked:
        path = state.path / "agent-token"
        raise UsageError(f"{path} is missing, and the cluster's servers run with an agent token; nothing was changed",
                         "restore it from a copy of the state folder; a server holds it too, after \"::node:\" in "
                         "/var/lib/rancher/k3s/server/agent-token")
    if keep and not marked:
        state.write_file(NO_AGENT_TOKEN, LEGACY_NOTE + "\n")
    return JoinTokens(server, None, ca_hash)


def learn_ca_hash(session, inventory: Inventory, state: StateDir, tokens: JoinTokens, facts, join_via=None,
                  keep: bool = True) -> JoinTokens:
    """`tokens` with the cluster CA's hash, read from the server nodes join (`join_via`, else
    the first server) when its k3s runs and the state folder does not hold it yet; kept
    there (`keep`) so later runs need no round trip. Unchanged while no server runs."""
    if tokens.ca_hash or tokens is PLACEHOLDER:
        return tokens
    target = join_via or inventory.servers[0]
    install = getattr(facts.get(target.name), "k3s", None)
    unit = install.unit("k3s") if install else None
    if unit is None or not unit.active:
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


def print_findings(findings: list[Finding], console) -> None:
    for finding in sorted(findings, key=lambda f: (f.node, f.severity != "error")):
        console.say(finding.render())


def fetch_kubeconfig(session, inventory: Inventory, state: StateDir) -> None:
    """Read k3s.yaml from the first server (never printed), point it at that server's
    address, name it bootstrap-<cluster>, keep it 0600 in the state folder."""
    answering = [s for s in inventory.servers if s.name not in session.failures
                 and s in session.nodes]
    if not answering:
        return
    first = answering[0]
    text = session.read_root_file(first.name, KUBECONFIG)
    if text is None:
        session.fail(first.name, f"cannot read {KUBECONFIG}")
        return
    from bootstrap.cluster.kubeconfig_file import rewrite

    try:  # only its allow-listed fields; a file that could run code here fails that server
        kubeconfig = rewrite(text, inventory, state.cluster_id, address=first.address)
    except BootstrapError as exc:
        session.fail(first.name, exc.message, exc.hint)
        return
    state.write_secret("kubeconfig", kubeconfig)


def gather_facts(session, inventory) -> dict:
    """Facts in one round trip per host, including the state of every file the tool manages."""
    from bootstrap.facts.pyinfra_fact import HostFactsFact

    facts = session.gather(HostFactsFact, paths=tuple(managed_paths(inventory)),
                           health=inventory.gpu.health != "off")
    for node in session.nodes:
        if node.name not in facts and node.name not in session.failures:
            session.fail(node.name, "the facts probe returned no output")
    return facts


def stops_the_run(failures: dict, inventory: Inventory) -> bool:
    """An unreachable host stops the run (nothing is changed until every host answers); an
    agent that answered with what cannot be used is only left out: one host's answers never
    stop the others. A server is needed whole, however it failed."""
    servers = {n.name for n in inventory.servers}
    return any(not f.bad_answer or f.node in servers for f in failures.values())


def gather_and_plan(session, inventory, state, console, *, create_token: bool, facts=None,
                    tolerate_unreachable=False, join_via=None, converging: bool | None = None):
    """Facts, preflight, then each host's plan. Raises when preflight fails or (unless
    tolerated, as `rebuild` does) a host cannot be reached: then nothing has been changed.
    `create_token`: a new cluster's server token may be made; `converging` (default: the
    same): the plans will be carried out, so a missing agent token is made and the CA hash
    learnt is kept."""
    from bootstrap.hostplan.rollout import version_findings

    facts = facts if facts is not None else gather_facts(session, inventory)
    findings = preflight(inventory, facts) + ownership_findings(inventory, facts, state.cluster_id)
    artifacts, target = None, None  # the k3s release to run (one for every arch)
    unreachable = stops_the_run(session.failures, inventory) and not tolerate_unreachable
    # An unreachable host is the problem to name; resolving a channel online can wait for it.
    if not unreachable and not any(f.severity == "error" for f in findings):
        artifacts = k3s_artifacts(inventory, {f.arch for f in facts.values()})
        target = next(iter(artifacts.values())).version if artifacts else None
        findings += version_findings(inventory, facts, target, {a: x.binary_sha256 for a, x in artifacts.items()})
    if not unreachable:
        # Provider firewalls, before any change; also beside other problems, so one run
        # names everything to fix on machines that cost money by the second.
        from bootstrap.hosts.reachability import check_reachability

        with console.phase("reachability"):
            findings += check_reachability(session, inventory, facts, console)
    print_findings(findings, console)
    from bootstrap.preflight import blocked_nodes

    for name, bad in blocked_nodes(findings).items():
        # gpu.health strict, or a host whose answers cannot be used: this node stays out of
        # the run; the others go on.
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        if bad[0].severity == "host-error":
            session.fail(name, bad[0].message + more, bad[0].fix)
        else:
            session.fail(name, f"GPU health: {bad[0].message}" + more,
                         "replace the machine (ask the provider for another), or set gpu.health: warn to use it "
                         "anyway")
    errors = [f for f in findings if f.severity == "error"]
    if errors or unreachable:
        for failure in sorted(session.failures.values(), key=lambda f: f.node):
            console.warn(f"FAILED {failure.render()}")
        problems = len(errors) + len(session.failures)
        raise PreflightFailed(f"preflight found {problems} problem(s); no host was changed",
                                   "fix the problems above and run the command again")
    converging = create_token if converging is None else converging
    tokens = load_or_create_tokens(state, facts, inventory, create=create_token, create_agent=converging)
    tokens = learn_ca_hash(session, inventory, state, tokens, facts, join_via, keep=converging)
    if converging and tokens.agent is None:
        console.warn(f"warning: {LEGACY_NOTE}")
    # The secrets that go into host files are read here, once: the planners stay pure.
    replan = functools.partial(make_plans, with_secret_values(inventory), facts, artifacts=artifacts,
                               cluster_id=state.cluster_id, join_via=join_via)
    plans = replan(tokens=tokens)
    for name, reason in plans.failures.items():
        session.fail(name, reason)  # its answers could not be planned from: the others go on
    plans.target_version, plans.tokens, plans.replan = target, tokens, replan
    return facts, plans


@dataclass(frozen=True)
class UpOptions:
    hosts_only: bool = False
    validate: bool = True
    max_unavailable: int = 1
    drain_timeout: int = 300
    force: bool = False


def snapshot_due(changed: bool, newest_snapshot) -> bool:
    """After a change, and whenever this cluster has no snapshot in the state folder: an
    `up` stopped at its snapshot (Ctrl-C, the first server lost) had changed everything and
    saved nothing, and the next one, seeing no change, saved nothing either."""
    return changed or newest_snapshot is None


def bring_up(inventory, state, options: UpOptions, console, open_session=open_hosts,
             connect=connect_to_cluster, take_snapshot=None) -> None:
    """`open_session(inventory, nodes, command, console)`: the hosts; `connect(inventory,
    state)`: the cluster; `take_snapshot(inventory, state)`: the etcd snapshot after a change
    (fakes in tests). The hosts' SSH connections stay open to the end: the API tunnel and
    the snapshot go over the first server's instead of a new connection each."""
    from bootstrap.cluster.client import reusing_ssh

    started = time.monotonic()
    check_archives(inventory)  # a wrong chart archive stops `up` before any host changes
    with cluster_lock(state, "up"), contextlib.ExitStack() as hosts:
        with console.phase("connect"):
            session = hosts.enter_context(open_session(inventory, list(inventory.nodes), "up", console))
        connect_here = reusing_ssh(connect, session)
        plans, facts = _converge_hosts(session, inventory, state, options, console, connect_here,
                                       take_snapshot, started)
        if options.hosts_only:
            return
        if hasattr(facts, "kill"):  # the second probe, still running: gone before the connections
            hosts.callback(facts.kill)
            facts = facts.get
        hosts_changed = any(p.changed for p in plans.plans.values())
        with console.phase("cluster side"):
            cluster_changed = cluster_phase(inventory, state, facts, console, validate=options.validate,
                                            hosts_changed=hosts_changed, connect=connect_here)
        from bootstrap import snapshots

        if snapshot_due(hosts_changed or cluster_changed, snapshots.newest(state)):
            # A snapshot of what was just built: what `rebuild` restores after losing a server.
            with console.phase("snapshot"):
                take = take_snapshot or functools.partial(snapshots.take, ssh=session.ssh_client)
                path = take(inventory, state)
            console.say(f"snapshot: {path.name} copied to the state folder")
        record_applied(inventory, state)


def _converge_hosts(session, inventory, state, options: UpOptions, console, connect, take_snapshot, started):
    """Facts, preflight, the hosts' steps (or a rolling upgrade): (plans, facts for the
    cluster side: the ones read first, or the greenlet reading them again after a change)."""
    from bootstrap.flows.replaced_machines import clear_replaced, find_replaced

    with console.phase("probe"):
        facts = gather_facts(session, inventory)
    # A machine re-created under a node's name: k3s refuses it until its old Node goes.
    replaced = find_replaced(inventory, state, facts, console, connect)
    with console.phase("preflight and plan"):
        facts, plans = gather_and_plan(session, inventory, state, console, create_token=True, facts=facts,
                                       join_via=replaced.join_via)
    clear_replaced(inventory, state, replaced, console, connect)
    if not any(p.changed for p in plans.plans.values()):
        if not (state.path / "kubeconfig").exists():
            with console.phase("kubeconfig"):
                fetch_kubeconfig(session, inventory, state)
        console.event("hosts", changed=[], no_change=sorted(plans.plans), failed=[])
        console.say(f"hosts: no change, {len(plans.plans)} hosts already converged "
                    f"({time.monotonic() - started:.1f}s)")
        return plans, facts
    rollout = plans.rollout(inventory, facts, options.max_unavailable)
    results: dict = {}
    rest = {n: p for n, p in plans.plans.items() if not rollout or n not in rollout.nodes}

    def read_kubeconfig():
        with console.phase("kubeconfig"):
            fetch_kubeconfig(session, inventory, state)

    def converge_rest():
        # The kubeconfig is read as soon as the first server runs, while the agents join.
        after = {first_server_step(inventory): read_kubeconfig}
        joiners = first_server_then_joiners(inventory, plans, rest)
        if joiners is None:
            merge_results(results, session.execute(converge_steps(inventory, rest, set(session.failures)), after))
            return
        # A new cluster: its CA, which the joins' secure tokens name, exists once the first
        # server has started. Every host is prepared meanwhile; the joiners' config.yaml,
        # planned with the CA's hash, and their starts come after.
        first = inventory.servers[0]
        meanwhile = {n: before_the_ca(p) if n in joiners else p for n, p in rest.items()}
        merge_results(results, session.execute(converge_steps(inventory, meanwhile, set(session.failures)), after))
        if first.name in session.failures:
            for name in joiners:
                session.fail(name, f"not joining: the first server {first.name} failed")
            return
        tokens = read_ca_hash(session, first, state, plans.tokens)
        secured = {n: p for n, p in plans.replan(tokens=tokens).plans.items() if n in joiners}
        plans.plans.update(secured)
        plans.tokens = tokens
        joins = {n: after_the_ca(p) for n, p in secured.items()}
        merge_results(results, session.execute(converge_steps(inventory, joins, set(session.failures))))

    if rollout:
        from bootstrap.flows.rolling_upgrade import run_rollout

        from bootstrap.hosts.executor import StepResult

        run_rollout(session, inventory, state, plans, rollout, converge_rest, console,
                    drain_timeout=options.drain_timeout, force=options.force,
                    take_snapshot=take_snapshot)
        for name in rollout.nodes:
            results.setdefault(name, {})["upgrade k3s"] = StepResult("changed")
    else:
        converge_rest()
    summarise(results, started, console)
    report_failures(session.failures, console)
    if not options.hosts_only:
        # What k3s and the installs just created (the CNI bin dir in containerd's
        # config, a freshly installed driver) decides the cluster side: look again, while
        # the cluster side waits for the nodes to be Ready (it needs the facts only then).
        import gevent

        def probe_again():
            with console.phase("second probe"):
                return gather_facts(session, inventory)

        return plans, gevent.spawn(probe_again)
    return plans, facts


def first_server_then_joiners(inventory, plans, rest: dict) -> list[str] | None:
    """The nodes that must wait for the first server's CA (a new cluster whose first server
    starts in this run), or None when every join can be planned now (the CA hash is known,
    or nothing joins)."""
    first = inventory.servers[0].name
    if plans.tokens is None or plans.tokens.ca_hash or plans.tokens is PLACEHOLDER or first not in rest:
        return None
    joiners = [n for n, p in rest.items() if n != first and p.changed]
    return joiners or None


def merge_results(results: dict, more: dict) -> None:
    """Add one executed batch of steps to `results`: a step a host had nothing to do in
    does not hide what an earlier batch did in it."""
    for name, steps in more.items():
        mine = results.setdefault(name, {})
        for step, result in steps.items():
            if step not in mine or result.status != "no change":
                mine[step] = result


def record_applied(inventory, state) -> None:
    """The digest of the inventory last applied in full, for `status` and later runs."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256(Path(inventory.source).read_bytes()).hexdigest()
    state.write_file("applied-inventory.sha256", f"{digest}  {inventory.source}\n")


def summarise(results, started, console) -> None:
    words = {}
    for name in sorted(results):
        statuses = {r.status for r in results[name].values()}
        words[name] = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "no change"
        console.say(f"{name}: {words[name]}")
    console.event("hosts", **{w.replace(" ", "_"): [n for n in words if words[n] == w]
                                         for w in ("changed", "no change", "failed")})
    console.say(f"done in {time.monotonic() - started:.1f}s")
