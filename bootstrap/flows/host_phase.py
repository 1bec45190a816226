"""`up`'s pipeline, as a list of named phases over one `Run` (bootstrap.flows.run): probe,
replaced machines, preflight and plan, converge (or roll an upgrade), kubeconfig, cluster
side, snapshot. `plan`, `check` and `rebuild` reuse its first phases."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import gevent

from bootstrap.state import snapshots
from bootstrap.cluster.charts import check_archives
from bootstrap.cluster.kubeconfig_file import rewrite as rewrite_kubeconfig
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.facts.pyinfra_fact import HostFactsFact
from bootstrap.cluster.client import connect as connect_to_cluster, warm_connections
from bootstrap.cluster.early_connection import EarlyConnection
from bootstrap.cluster.read_ahead import remembered
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.flows.preflight_phase import enforce, examine
from bootstrap.flows.replaced_machines import clear_replaced, find_replaced
from bootstrap.flows.rolling_upgrade import run_rollout
from bootstrap.flows.run import Run
from bootstrap.host.parts.k3s_service import CONFIG, K3S_DATA_DIR, KUBECONFIG
from bootstrap.host.parts.paths import managed_paths
from bootstrap.host.plan.all_hosts import Plans, make_plans
from bootstrap.host.plan.host_plan import after_the_ca, before_the_ca
from bootstrap.host.plan.join_tokens import LEGACY_NOTE, PLACEHOLDER, JoinTokens, is_secret
from bootstrap.flows.ca_hash import (CA_HASH, after_a_refused_join, joining, k3s_server_runs, learn_ca_hash, read_ca_hash,
                                     recheck_kept_ca_hash, refused_for_the_ca_hash)
from bootstrap.host.plan.rollout import plan_rollout
from bootstrap.host.plan.steps import converge_steps, first_server_step
from bootstrap.remote.connections import open_hosts
from bootstrap.remote.executor import StepResult
from bootstrap.inventory.model import Inventory
from bootstrap.state.lock import cluster_lock
from bootstrap.progress import end_run
from bootstrap.state.folder import StateDir


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
                         f"{K3S_DATA_DIR}/server/agent-token")
    if keep and not marked:
        state.write_file(NO_AGENT_TOKEN, LEGACY_NOTE + "\n")
    return JoinTokens(server, None, ca_hash)


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
    try:  # only its allow-listed fields; a file that could run code here fails that server
        kubeconfig = rewrite_kubeconfig(text, inventory, state.cluster_id, address=first.address)
    except BootstrapError as exc:
        session.fail(first.name, exc.message, exc.hint)
        return
    state.write_secret("kubeconfig", kubeconfig)


def gather_facts(session, inventory) -> dict:
    """Facts in one round trip per host, including the state of every file the tool manages."""
    facts = session.gather(HostFactsFact, paths=tuple(managed_paths(inventory)),
                           health=inventory.gpu.health != "off")
    for node in session.nodes:
        if node.name not in facts and node.name not in session.failures:
            session.fail(node.name, "the facts probe returned no output")
    return facts


# --- the phases ----------------------------------------------------------------------------

def probe(run: Run) -> None:
    """Facts in one round trip per host; the topology they imply, resolved once."""
    with run.console.phase("probe"):
        run.set_facts(gather_facts(run.session, run.inventory))


def preflight_and_plan(run: Run, *, create_token: bool, tolerate_unreachable=False, join_via=None,
                       converging: bool | None = None) -> Plans:
    """Every finding (flows.preflight_phase), printed and decided on (raises when one is an
    error or, unless tolerated as `rebuild` does, a host cannot be reached: then nothing
    has been changed), then each host's plan. `create_token`: a new cluster's server token
    may be made; `converging` (default: the same): the plans will be carried out, so a
    missing agent token is made and the CA hash learnt is kept."""
    with run.console.phase("preflight and plan"):
        enforce(run, examine(run, tolerate_unreachable))
        return plan_hosts(run, create_token=create_token, join_via=join_via,
                          converging=create_token if converging is None else converging)


def plan_hosts(run: Run, *, create_token: bool, join_via, converging: bool) -> Plans:
    """The join tokens, the inventory resolved (node-ips, secrets: once), each host's plan."""
    tokens = load_or_create_tokens(run.state, run.facts, run.inventory, create=create_token,
                                   create_agent=converging)
    kept = tokens.ca_hash is not None  # from the state folder, not read in this run
    tokens = learn_ca_hash(run.session, run.inventory, run.state, tokens, run.facts, join_via, keep=converging)
    if converging and tokens.agent is None:
        run.console.warn(f"warning: {LEGACY_NOTE}")
    run.replan = functools.partial(make_plans, run.resolve_inventory(), run.facts,
                                   artifacts=run.topology.releases, cluster_id=run.state.cluster_id,
                                   join_via=join_via, topology=run.topology)
    plans = run.replan(tokens=tokens)
    server = join_via or run.inventory.servers[0]
    joiners = joining(plans.plans, server.name)
    if converging and kept and joiners and k3s_server_runs(run.facts, server):
        # A rotated CA refuses every join that names the kept hash: ask the server first.
        fresh = recheck_kept_ca_hash(run.session, run.console, run.state, tokens, server, joiners)
        if fresh.ca_hash != tokens.ca_hash:
            tokens, plans = fresh, run.replan(tokens=fresh)
    for name, reason in plans.failures.items():
        run.fail(name, reason)  # its answers could not be planned from: the others go on
    plans.target_version, plans.tokens, plans.replan = run.topology.target_version, tokens, run.replan
    run.set_plans(plans.plans)
    run.tokens = tokens
    return plans


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
    run = Run(inventory, state, console, connect=connect, take_snapshot=take_snapshot)
    check_archives(inventory)  # a wrong chart archive stops `up` before any host changes
    with cluster_lock(state, "up"), contextlib.ExitStack() as stack:
        run.open_hosts(stack, open_session, inventory.nodes, "up")
        stack.callback(run.stop_reprobe)  # the second probe, still running: gone before the connections
        if not options.hosts_only:
            stack.callback(close_early, run)
            connect_early(run)
        probe(run)
        find_replaced(run)  # a machine re-created under a node's name: its old Node must go
        preflight_and_plan(run, create_token=True, join_via=run.join_via)
        clear_replaced(run)
        converge_or_roll(run, options)
        if options.hosts_only:
            return
        if run.early_cluster is not None and (run.early_after_start or not run.changed):
            run.connect = run.early_cluster.connect_or(run.connect)
        cluster_changed = cluster_side(run, options)
        snapshot(run, run.changed or cluster_changed)
        record_applied(inventory, state)


def connect_early(run: Run, after_start: bool = False) -> None:
    """An existing cluster's API connection (the tunnel's channel, TLS, one request), made
    in the background while the hosts' side works. The cluster side takes it when no host
    changed, or when it was made `after_start`: once the first server's k3s started in
    this run (nothing restarts it later in the same run). A change may restart that k3s
    under an earlier one, and then the cluster side connects as it always did."""
    if not (run.state.path / "kubeconfig").exists():
        return
    close_early(run)
    # Its first requests read what the last cluster side compared: a run that changes nothing
    # then compares without a read of its own.
    run.early_cluster = EarlyConnection(run.connect, run.inventory, run.state,
                                        warm=functools.partial(warm_connections, paths=remembered(run.state)))
    run.early_after_start = after_start


def close_early(run: Run) -> None:
    if run.early_cluster is not None:
        run.early_cluster.close()
        run.early_cluster = None


def converge_or_roll(run: Run, options: UpOptions) -> None:
    """The hosts' steps, or a rolling upgrade with the other hosts' steps between its
    servers and its agents; then the summary, and the failed hosts end the run."""
    if not run.changed:
        nothing_to_converge(run)
        return
    rollout = plan_rollout(run.inventory, run.facts, run.plans, run.topology.target_version,
                           options.max_unavailable)
    rest = {n: p for n, p in run.plans.items() if not rollout or n not in rollout.nodes}
    if rollout:
        run_rollout(run, rollout, lambda: converge(run, rest, not options.hosts_only), drain_timeout=options.drain_timeout,
                    force=options.force)
        for name in rollout.nodes:
            run.hosts[name].result["upgrade k3s"] = StepResult("changed")
    else:
        converge(run, rest, not options.hosts_only)
    refused = refused_for_the_ca_hash(run.failures)
    if refused and run.tokens is not None and run.tokens.ca_hash and run.tokens is not PLACEHOLDER:
        server = run.join_via or run.inventory.servers[0]
        run.tokens = after_a_refused_join(run.session, run.console, run.state, run.tokens, server, refused)
    summarise(run)
    end_run(run.console, run.failures)
    if not options.hosts_only:
        # What k3s and the installs just created (the CNI bin dir in containerd's config, a
        # freshly installed driver) decides the cluster side: look again, while the cluster
        # side waits for the nodes to be Ready (it needs the facts only then).
        run.reprobe_in_background(functools.partial(second_probe, run))


def second_probe(run: Run) -> dict:
    with run.console.phase("second probe"):
        return gather_facts(run.session, run.inventory)


def nothing_to_converge(run: Run) -> None:
    if not (run.state.path / "kubeconfig").exists():
        kubeconfig(run)
    run.console.event("hosts", changed=[], no_change=sorted(run.plans), failed=[])
    run.console.say(f"hosts: no change, {len(run.plans)} hosts already converged ({run.elapsed():.1f}s)")


def kubeconfig(run: Run) -> None:
    with run.console.phase("kubeconfig"):
        fetch_kubeconfig(run.session, run.inventory, run.state)


def kubeconfig_and_connect(run: Run) -> None:
    """After the first server's start: its kubeconfig, then the cluster side's connection,
    both while the agents join."""
    kubeconfig(run)
    connect_early(run, after_start=True)


def converge(run: Run, plans: dict, cluster_side_follows: bool = False) -> None:
    """The steps of `plans`' hosts. The kubeconfig is read (and, when the cluster side
    follows, the API connection made) as soon as the first server runs, while the others
    join. A new cluster: its CA, which the joins' secure tokens name, exists once the first
    server has started; every host is prepared meanwhile (the first server placed and
    started in the same step), and the joiners' config.yaml, planned with the CA's hash,
    and their starts come after, one command each, while the kubeconfig is read."""
    then = functools.partial(kubeconfig_and_connect if cluster_side_follows else kubeconfig, run)
    joiners = first_server_then_joiners(run.topology.first_server, run.tokens, plans)
    meanwhile = {n: before_the_ca(p) if n in (joiners or ()) else p for n, p in plans.items()}
    steps = converge_steps(run.inventory, meanwhile, set(run.failures), first_server_early=True)
    if not joiners:
        run.merge_results(run.session.execute(steps, {first_server_step(run.inventory): then}))
        return
    run.merge_results(run.session.execute(steps))
    reading = gevent.spawn(then)  # beside the CA's hash and the joins, not before them
    try:
        join_after_the_ca(run, joiners)
    finally:
        reading.join()
    reading.get()


def join_after_the_ca(run: Run, joiners: list[str]) -> None:
    first = run.inventory.node(run.topology.first_server)
    if run.failed(first.name):
        for name in joiners:
            run.fail(name, f"not joining: the first server {first.name} failed")
        return
    run.tokens = read_ca_hash(run.session, first, run.state, run.tokens)
    secured = {n: p for n, p in run.replan(tokens=run.tokens).plans.items() if n in joiners}
    run.set_plans(secured)
    joins = {n: after_the_ca(p) for n, p in secured.items()}
    steps = converge_steps(run.inventory, joins, set(run.failures), place_with_start=True)
    run.merge_results(run.session.execute(steps))


def cluster_side(run: Run, options: UpOptions) -> bool:
    with run.console.phase("cluster side"):
        return cluster_phase(run, validate=options.validate, hosts_changed=run.changed)


def snapshot(run: Run, due_to_change: bool) -> None:
    """A snapshot of what was just built: what `rebuild` restores after losing a server."""
    if not snapshot_due(due_to_change, snapshots.newest(run.state)):
        return
    with run.console.phase("snapshot"):
        take = run.take_snapshot or functools.partial(snapshots.take, ssh=run.session.ssh_client)
        path = take(run.inventory, run.state)
    run.console.say(f"snapshot: {path.name} copied to the state folder")


def first_server_then_joiners(first: str, tokens, rest: dict) -> list[str] | None:
    """The nodes that must wait for the first server's CA (a new cluster whose first server
    starts in this run), or None when every join can be planned now (the CA hash is known,
    or nothing joins)."""
    if tokens is None or tokens.ca_hash or tokens is PLACEHOLDER or first not in rest:
        return None
    joiners = [n for n, p in rest.items() if n != first and p.changed]
    return joiners or None


def record_applied(inventory, state) -> None:
    """The digest of the inventory last applied in full, for `status` and later runs."""
    digest = hashlib.sha256(Path(inventory.source).read_bytes()).hexdigest()
    state.write_file("applied-inventory.sha256", f"{digest}  {inventory.source}\n")


def summarise(run: Run) -> None:
    words = {}
    results = run.results
    for name in sorted(results):
        statuses = {r.status for r in results[name].values()}
        words[name] = "failed" if "failed" in statuses else "changed" if "changed" in statuses else "no change"
        run.console.say(f"{name}: {words[name]}")
    run.console.event("hosts", **{w.replace(" ", "_"): [n for n in words if words[n] == w]
                                  for w in ("changed", "no change", "failed")})
    run.console.say(f"done in {run.elapsed():.1f}s")
