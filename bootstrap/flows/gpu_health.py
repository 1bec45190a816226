"""`bootstrap health`: the GPU health checks on every GPU node of a running cluster, in
parallel (one probe each), the Xid reports new since the last check, and with --cordon a
node with an error cordoned, labelled with why and put behind the acceptance gate again
(bootstrap.cluster.gate: the next `up` re-checks it), so the scheduler stops placing work
there. `status` shows the last verdict per node. Reads the hosts; changes the cluster only
with --cordon."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, replace

from bootstrap.cluster.client import connect as connect_to_cluster, merge_patch
from bootstrap.cluster.gate import close_gate
from bootstrap.cluster.gate_rules import GATE_KEY, cap_reason, may_hold
from bootstrap.flows.run import Run
from bootstrap.remote.connections import open_hosts
from bootstrap.state.lock import cluster_lock
from bootstrap.progress import report_host_failures
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.facts.pyinfra_fact import HostFactsFact
from bootstrap.checks.preflight import gpu_health_findings
from bootstrap.cluster.drain import cordon

HEALTH_LABEL = "bootstrap.k3s/gpu-health"  # "error" on a node --cordon cordoned
HEALTH_REASON = "bootstrap.k3s/gpu-health-reason"  # the first error, as an annotation
CORDONED_FOR_HEALTH = "bootstrap.k3s/cordoned-for-gpu-health"
RECORD = "gpu-health.json"  # in the state folder: per node, the last verdict and Xid seen


@dataclass
class NodeHealth:
    node: str
    findings: list  # preflight Findings (check gpu-health:*)
    new_xids: list  # XidEvents not seen by the last check
    gpus: int = 0
    host: HostFacts | None = None  # as probed (what a burn-in of it asks for)

    @property
    def verdict(self) -> str:
        severities = {f.severity for f in self.findings}
        return "error" if severities & {"error", "health-error"} else "warning" if "warning" in severities else "ok"


def new_since(record: dict, facts) -> list:
    """The Xid reports the last check did not see: all of them after a reboot (another boot
    id), else those later (kernel uptime) than the last one it saw."""
    xids = facts.xids or []
    if not record or record.get("boot_id") != facts.boot_id:
        return list(xids)
    seen = record.get("last_xid_uptime_s")
    return [x for x in xids if seen is None or (x.uptime_s is not None and x.uptime_s > seen)]


def check_health(inventory, state, console, *, cordon: bool = False, open_session=open_hosts,
                 connect=connect_to_cluster) -> list[NodeHealth]:
    # Asked for explicitly: checked even where the inventory turned the probe off.
    strict = replace(inventory, gpu=replace(inventory.gpu, health="strict"))
    run = Run(inventory, state, console, connect=connect)
    with cluster_lock(state, "health"):
        with contextlib.ExitStack() as hosts:
            run.open_hosts(hosts, open_session, inventory.nodes, "health")
            run.set_facts(run.session.gather(HostFactsFact, health=True))
        facts, gpu = run.facts, run.topology.gpu_nodes_of(inventory)
        findings = gpu_health_findings(strict, facts, gpu)
        path = state.path / RECORD
        records = json.loads(path.read_text()) if path.exists() else {}
        results = []
        for node in gpu:
            if node.name not in facts:
                continue
            host = facts[node.name]
            results.append(NodeHealth(node.name, findings.get(node.name, []),
                                      new_since(records.get(node.name, {}), host), len(host.gpus), host))
        for result in results:
            host = facts[result.node]
            uptimes = [x.uptime_s for x in host.xids or [] if x.uptime_s is not None]
            records[result.node] = {"checked": int(time.time()), "verdict": result.verdict, "boot_id": host.boot_id,
                                    "last_xid_uptime_s": max(uptimes) if uptimes else None,
                                    "first_error": next((f.message for f in result.findings
                                                         if f.severity == "health-error"), None)}
        state.write_secret(RECORD, json.dumps(records, indent=1, sort_keys=True) + "\n")
        if cordon:
            cordon_unhealthy(inventory, state, [r for r in results if r.verdict == "error"], console, connect)
    report_host_failures(console, run.failures)
    return results


def cordon_unhealthy(inventory, state, unhealthy: list[NodeHealth], console, connect) -> None:
    if not unhealthy:
        return
    with connect(inventory, state) as cluster:
        for result in unhealthy:
            first = next(f for f in result.findings if f.severity == "health-error")
            cordon(cluster, result.node, CORDONED_FOR_HEALTH)
            merge_patch(cluster, f"/api/v1/nodes/{result.node}", {"metadata": {
                "labels": {HEALTH_LABEL: "error"},
                "annotations": {HEALTH_REASON: first.message[:1000]}}})
            # Gated again as well: the cordon is what an operator lifts by hand; the gate is
            # lifted only by the node's own checks at the next `up` (bootstrap.cluster.gate).
            # A server is never gated (gate_rules.may_hold): the cordon alone.
            gated = may_hold(inventory.node(result.node))
            if gated:
                close_gate(cluster, result.node, cap_reason(f"gpu-health: {first.message}"))
            console.say_lines([f"{result.node}: cordoned (label {HEALTH_LABEL}=error)"
                               f"{f' and gated ({GATE_KEY})' if gated else ''}: {first.message}"])


def render(results: list[NodeHealth]) -> list[str]:
    lines = []
    for result in results:
        if result.verdict == "ok":
            lines.append(f"{result.node}: ok ({result.gpus} GPU(s))")
        for finding in result.findings:
            tag = "ERROR" if finding.severity == "health-error" else "WARN "
            lines.append(f"{result.node}: {tag} {finding.check[len('gpu-health:'):]}: {finding.message}")
            if finding.fix:
                lines.append(f"       fix: {finding.fix}")
        for xid in result.new_xids:
            lines.append(f"{result.node}: new since the last check: Xid {xid.xid} on {xid.pci}: {xid.text}")
    return lines or ["no GPU node answered"]


def last_verdicts(state) -> dict[str, str]:
    """For `status`: each node's verdict at the last `bootstrap health`."""
    path = state.path / RECORD
    if not path.exists():
        return {}
    try:
        return {node: r.get("verdict", "?") for node, r in json.loads(path.read_text()).items()}
    except (ValueError, AttributeError):
        return {}
