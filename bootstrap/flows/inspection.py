"""The read-only views: `status` (what the hosts and the cluster say now) and `plan` (what
`up` would change). They change nothing; first contact pins host keys, so they hold the
cluster lock like every command that may write known_hosts."""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

from bootstrap.cluster.client import connect as connect_to_cluster, get
from bootstrap.cluster.gate_rules import FAILED, FAILED_OPEN, PENDING, node_state
from bootstrap.cluster.node_status import ready_word
from bootstrap.console_text import printable
from bootstrap.errors import BootstrapError
from bootstrap.flows.host_phase import preflight_and_plan, probe
from bootstrap.flows.run import Run
from bootstrap.host.plan.rollout import plan_rollout
from bootstrap.remote.connections import open_hosts
from bootstrap.state.lock import cluster_lock
from bootstrap.state import snapshots
from bootstrap.host.facts.pyinfra_fact import HostFactsFact
from bootstrap.flows.gpu_health import last_verdicts
from bootstrap.cluster.apply import read_digests
from bootstrap.cluster.components.cluster_plan import plan_cluster
from bootstrap.cluster.helm import APPLIED, NOT_INSTALLED, release_state
from bootstrap.host.plan.join_tokens import LEGACY_NOTE, PLACEHOLDER
from bootstrap.checks.reachability import describe_probes, plan_probes

RESOURCE_PREFIXES = ("nvidia.com/", "rdma/")


# --- status ------------------------------------------------------------------------------

def cluster_status(inventory, state, console, *, open_session=open_hosts, connect=connect_to_cluster) -> dict:
    """Every node as its host and the API see it, the components' state, the newest snapshot."""
    run = Run(inventory, state, console, connect=connect)
    with cluster_lock(state, "status"):
        with contextlib.ExitStack() as hosts:
            run.open_hosts(hosts, open_session, inventory.nodes, "status")
            run.set_facts(run.session.gather(HostFactsFact))
            # The API through the session's connection to the server (Run.open_hosts): no second SSH connection.
            nodes, components = cluster_view(inventory, state, run.facts, run.topology.gpu_nodes_of(inventory),
                                             run.connect)
    facts = run.facts

    newest = snapshots.newest(state) if (state.path / "snapshots").exists() else None
    health = last_verdicts(state)
    return {"cluster": inventory.cluster, "state_dir": str(state.path), "api": nodes is not None,
            "nodes": [dict(node_row(node, facts.get(node.name), (nodes or {}).get(node.name, {})),
                           health=health.get(node.name, "-"))
                      for node in inventory.nodes],
            "components": components, "inventory_as_applied": inventory_as_applied(inventory, state),
            "newest_snapshot": None if newest is None else {
                "file": newest.name, "age_hours": round((time.time() - newest.taken) / 3600, 1)}}


def node_row(node, host, api: dict) -> dict:
    allocatable = {k: v for k, v in api.get("status", {}).get("allocatable", {}).items()
                   if k.startswith(RESOURCE_PREFIXES)}
    gate_state = node_state(api) if api else ("-", "")
    return {
        "node": node.name, "role": node.role, "provider": node.provider, "region": node.region,
        "answers_ssh": host is not None,
        "ready": ready_word(api),
        "gpus": f"{len(host.gpus)} x {host.gpus[0].name}" if host and host.gpus else "-",
        "driver": host.driver_version if host and host.driver_version else "-",
        "cuda": host.cuda_version if host and host.cuda_version else "-",
        # what the node runs: during a rolling upgrade, which side of it each node is on
        "k3s": api.get("status", {}).get("nodeInfo", {}).get("kubeletVersion")
        or (host.k3s.version if host and host.k3s and host.k3s.version else "-"),
        "cordoned": bool(api.get("spec", {}).get("unschedulable")),
        "allocatable": allocatable,
        # the acceptance gate: open, pending (gated, not judged yet) or failed, with its reason
        "gate": gate_state[0], "gate_reason": gate_state[1],
    }


def inventory_as_applied(inventory, state) -> bool | None:
    """Whether the inventory is the one `up` last applied in full (None: never applied)."""
    applied = state.path / "applied-inventory.sha256"
    if not applied.exists():
        return None
    return applied.read_text().split()[0] == hashlib.sha256(Path(inventory.source).read_bytes()).hexdigest()


def render_status(report: dict) -> list[str]:
    lines = [f"cluster {report['cluster']} (state: {report['state_dir']})" + ("" if report["api"]
                                                                            else "; API unreachable"),
             f"{'NODE':<14} {'ROLE':<7} {'STATE':<18} {'K3S':<14} {'GPUS':<22} {'DRIVER':<12} {'CUDA':<5} "
             f"{'HEALTH':<8} ALLOCATABLE"]
    by_provider: dict = {}
    for r in report["nodes"]:  # grouped by provider, when the inventory names them
        by_provider.setdefault(r.get("provider"), []).append(r)
    for provider, rows in by_provider.items():
        if len(by_provider) > 1 or provider:
            regions = sorted({r["region"] for r in rows if r.get("region")})
            lines.append(f"provider {provider or '(none)'}" + (f" ({', '.join(regions)})" if regions else "") + ":")
        for r in rows:
            state_word = (r["ready"] if r["answers_ssh"] else "NO-SSH") + (",cordoned" if r["cordoned"] else "") \
                + (",gated" if r.get("gate") in (PENDING, FAILED) else "")
            alloc = ", ".join(f"{k}={v}" for k, v in sorted(r["allocatable"].items())) or "-"
            # The cells are what hosts and the API said (kubeletVersion, GPU names): one printable
            # line each, whatever type or text they hold.
            cell = {key: printable(r.get(key, "-"))
                    for key in ("node", "role", "k3s", "gpus", "driver", "cuda", "health")}
            lines.append(f"{cell['node']:<14} {cell['role']:<7} {state_word:<18} {cell['k3s']:<14} {cell['gpus']:<22} "
                         f"{cell['driver']:<12} {cell['cuda']:<5} {cell['health']:<8} {printable(alloc)}")
    lines += gate_lines(report["nodes"])
    lines += [f"component {name}: {info['version']} ({info['state']})" for name, info in report["components"].items()]
    if report["inventory_as_applied"] is not None:
        lines.append("inventory: " + ("as last applied by `up`" if report["inventory_as_applied"]
                                      else "changed since the last `up` (run `bootstrap plan`)"))
    newest = report["newest_snapshot"]
    lines.append("newest snapshot: " + (f"{newest['file']}, {newest['age_hours']} h old" if newest
                                        else "none (`bootstrap snapshot` takes one)"))
    return lines


def gate_lines(rows: list[dict]) -> list[str]:
    """Each gated node (waiting for its first checks, or why it failed them) and each server that
    failed them (never gated); the reason is the node's annotation, read from the API: printable."""
    lines = []
    for r in rows:
        if r.get("gate") == PENDING:
            lines.append(f"gate {printable(r['node'])}: pending (its checks run at the next `bootstrap up`)")
        elif r.get("gate") == FAILED:
            lines.append(f"gate {printable(r['node'])}: failed, no workload pods: {printable(r.get('gate_reason', ''))}")
        elif r.get("gate") == FAILED_OPEN:
            lines.append(f"gate {printable(r['node'])}: failed, takes workloads all the same (a server is never "
                         f"gated): {printable(r.get('gate_reason', ''))}")
    return lines


def cluster_view(inventory, state, facts, gpu, connect=connect_to_cluster):
    """Node objects and component versions, or (None, {}) when no server's API answers."""
    try:
        with connect(inventory, state) as cluster:
            nodes = {n["metadata"]["name"]: n for n in (get(cluster, "/api/v1/nodes") or {}).get("items", [])}
            digests = read_digests(cluster)
    except BootstrapError:
        return None, {}
    try:
        releases = plan_cluster(inventory, facts, gpu).releases
    except BootstrapError:
        releases = []
    return nodes, {r.name: {"version": r.version, "state": release_state(r, digests)} for r in releases}


# --- plan --------------------------------------------------------------------------------

def planned_changes(inventory, state, console, *, max_unavailable: int = 1, open_session=open_hosts,
                    connect=connect_to_cluster) -> list[str]:
    """What `up` would change: `up`'s phases, dry (probe, preflight and plan; no change to
    any host), then per host its changes, the join tokens, the k3s rollout, the network
    probes, the Helm releases."""
    run = Run(inventory, state, console, connect=connect)
    with cluster_lock(state, "plan"):  # first contact pins host keys (and the API tunnel's)
        with contextlib.ExitStack() as hosts:
            run.open_hosts(hosts, open_session, inventory.nodes, "plan")
            probe(run)
            preflight_and_plan(run, create_token=False)
        # The hosts' connections are closed: the cluster through a tunnel of its own.
        return (host_changes(run) + token_plan(run.tokens) + rollout_plan(run, max_unavailable)
                + network_plan(run.inventory, run.facts, run.topology)
                + component_changes(run.inventory, state, run.facts, run.topology.gpu_nodes_of(run.inventory),
                                    connect))


def host_changes(run: Run) -> list[str]:
    lines = []
    for name, plan in run.plans.items():
        lines += [f"{name}: no change"] if not plan.changed else \
            [f"{name}:"] + [f"  - {change}" for change in plan.changes]
    return lines


def rollout_plan(run: Run, max_unavailable: int) -> list[str]:
    rollout = plan_rollout(run.inventory, run.facts, run.plans, run.topology.target_version, max_unavailable)
    return rollout.describe() if rollout else []


def token_plan(tokens) -> list[str]:
    """What happens to the join tokens: a new agent token for a cluster whose state folder
    has none yet, or why a cluster built before agent tokens keeps its agents' token."""
    if tokens is None or tokens is PLACEHOLDER:
        return []
    if tokens.agent is None:
        return [f"tokens: {LEGACY_NOTE}"]
    if tokens.agent == PLACEHOLDER.agent:
        return ["tokens: `up` generates the agent token: the servers get agent-token, the agents join with it "
                "instead of the server token, which stays on the servers"]
    return []


def network_plan(inventory, facts, topology) -> list[str]:
    """The network mode and the reachability probes `up` makes before any change."""
    backend = inventory.k3s.flannel_backend
    mode = ("public: nodes talk over their public addresses; pod traffic in WireGuard (flannel "
            f"{backend}, flannel-external-ip)" if inventory.network.public
            else f"private: nodes talk over their node-ip; pod traffic in flannel {backend}")
    probes = plan_probes(inventory, facts, topology.embedded_mirror, topology.gpu_nodes)
    return [f"network: {mode}"] + describe_probes(probes)


def component_changes(inventory, state, facts, gpu, connect=connect_to_cluster) -> list[str]:
    """Which Helm releases `up` would install or upgrade (from the digests in the cluster)."""
    releases = plan_cluster(inventory, facts, gpu).releases
    applied: dict = {}
    try:
        if (state.path / "kubeconfig").exists():
            with connect(inventory, state) as cluster:
                applied = read_digests(cluster)
    except BootstrapError:
        applied = {}
    lines = []
    for release in releases:
        state_now = release_state(release, applied)
        if state_now == NOT_INSTALLED:
            lines.append(f"component {release.name}: install {release.chart} {release.version}")
        elif state_now == APPLIED:
            lines.append(f"component {release.name}: no change")
        else:
            lines.append(f"component {release.name}: upgrade to {release.chart} {release.version} "
                         "(version or values changed)")
    return lines
