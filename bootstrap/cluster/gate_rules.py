"""The acceptance gate, its pure half: a GPU agent joins tainted, so the scheduler places no
workload pod on it until its own checks pass; the tool then removes the taint. An agent that
fails keeps it, with the reason in an annotation. A server is judged too but never held
(may_hold).

The taint is set by k3s when the node registers (`node-taint` in config.yaml): k3s applies
node-taint only at registration, never to a Node that exists (k3s-io/docs docs/cli/agent.md,
"Node Labels and Taints for Agents": "only add labels and/or taints at registration time").
So nothing lands on a new node before its first check, a node re-registered by `rebuild` is
gated again, and a node that registered before the gate existed gets the taint through the
API (bootstrap.cluster.gate), not by a k3s restart.

NoSchedule: pods already running stay (kube-scheduler's TaintToleration plugin filters on
NoSchedule and NoExecute, only NoExecute evicts: kubernetes pkg/scheduler/framework/plugins/
tainttoleration/taint_toleration.go). A DaemonSet's pods get only the node.kubernetes.io/*
tolerations from the DaemonSet controller (pkg/controller/daemon/util/daemonset_util.go,
AddOrUpdateDaemonPodTolerations): every DaemonSet the tool installs carries GATE_TOLERATION.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.console_text import printable
from bootstrap.inventory.model import Node, Role

GATE_KEY = "bootstrap.k3s/gate"  # the taint's key, beside the tool's other bootstrap.k3s/* marks
GATE_VALUE = "pending"
GATE_EFFECT = "NoSchedule"
GATE_TAINT = {"key": GATE_KEY, "value": GATE_VALUE, "effect": GATE_EFFECT}
GATE_REASON = "bootstrap.k3s/gate-reason"  # annotation: why a node stays gated
REASON_MAX = 500  # characters of a reason kept on the node (checks quote pods' logs)
# What a DaemonSet the tool installs tolerates: the gate, whatever its value.
GATE_TOLERATION = {"key": GATE_KEY, "operator": "Exists", "effect": GATE_EFFECT}
# The same as a Longhorn setting (`kubectl taint` syntax; a key without a value tolerates
# any value: longhorn/longhorn docs/taint-toleration.md, "key2:NoExecute").
GATE_TOLERATION_LONGHORN = f"{GATE_KEY}:{GATE_EFFECT}"

PASSED, FAILED, PENDING, OPEN = "passed", "failed", "pending", "open"
FAILED_OPEN = "failed-open"  # failed its checks but not gated: a server (may_hold)


def may_hold(node: Node) -> bool:
    """Whether the gate may keep `node` out of work: an agent, never a server. A server runs the
    cluster's own add-ons, which tolerate only CriticalAddonsOnly and the control-plane role
    (k3s-io/k3s manifests/coredns.yaml, metrics-server/metrics-server-deployment.yaml,
    local-storage.yaml, traefik.yaml), and every Deployment the tool installs: the GPU
    Operator's and NFD's master (values.yaml v26.7.0 operator.tolerations,
    node-feature-discovery master.tolerations: the control-plane taint only), NFD's gc and
    Volcano's three (none), the CSI controllers. On a cluster of GPU machines only, a gated
    server leaves them nowhere to run: `helm install --wait` times out before the gate's own
    checks can open any node. Kept off the servers, the gate deadlocks nothing."""
    return node.role != Role.SERVER


def taint_flag() -> str:
    """The gate as k3s's node-taint takes it: key=value:effect."""
    return f"{GATE_KEY}={GATE_VALUE}:{GATE_EFFECT}"


def has_gate(node_object: dict) -> bool:
    taints = (node_object.get("spec") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == GATE_KEY for t in taints)


def without_gate(taints: list) -> list:
    return [t for t in taints or [] if not (isinstance(t, dict) and t.get("key") == GATE_KEY)]


def with_gate(taints: list) -> list:
    return without_gate(taints) + [dict(GATE_TAINT)]


def node_state(node_object: dict) -> tuple[str, str]:
    """(state, reason) of a Node object as `status` shows it: `pending` (gated, not judged
    yet), `failed` (gated, with the reason the node carries), `open` (no gate), `failed-open`
    (no gate, with a reason: a server that failed its checks)."""
    reason = ((node_object.get("metadata") or {}).get("annotations") or {}).get(GATE_REASON) or ""
    if not has_gate(node_object):
        return (FAILED_OPEN, printable(str(reason))) if reason else (OPEN, "")
    return (FAILED, printable(reason)) if reason else (PENDING, "")


@dataclass(frozen=True)
class GateDecision:
    node: str
    passed: bool
    reason: str  # the failed checks, or what passed
    holds: bool = True  # whether a failure keeps the node gated (never a server's: may_hold)

    @property
    def held(self) -> bool:
        """Kept out of work: failed, and a node the gate may hold."""
        return self.holds and not self.passed

    @property
    def annotation(self) -> str | None:
        """The reason as it is kept on the node: one printable line, capped; None (removed) once passed."""
        return None if self.passed else cap_reason(self.reason)


def cap_reason(text: str) -> str:
    line = printable(text)
    return line if len(line) <= REASON_MAX else line[:REASON_MAX - 3] + "..."


def decide(node: str, results: list, holds: bool = True) -> GateDecision:
    """Whether `node` passes, from its checks' results (bootstrap.cluster.checks.CheckResult:
    check, status PASS|FAIL|SKIP, reason, node). A node passes when none of its own checks
    failed; a SKIP (not configured, not measurable) does not hold it. `holds`: may_hold(node)."""
    mine = [r for r in results if r.node == node]
    failed = [r for r in mine if r.status == "FAIL"]
    if failed:
        return GateDecision(node, False, "; ".join(f"{r.check}: {r.reason}" for r in failed), holds)
    passed = [r.check for r in mine if r.status == "PASS"]
    return GateDecision(node, True, "passed " + (", ".join(passed) if passed else "(no check applied)"), holds)
