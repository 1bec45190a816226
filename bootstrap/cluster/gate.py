"""The acceptance gate through the API: each gated GPU node's own checks (the ones `validate`
runs, bootstrap.cluster.checks and bootstrap.cluster.burn_in, on that node alone), then the
taint lifted from a node that passed, or kept with the reason on a node that failed.
The pure half (the taint, the decision) is bootstrap.cluster.gate_rules."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from bootstrap.checks.preflight import gpu_health_findings
from bootstrap.cluster import burn_in
from bootstrap.cluster import nccl_pairs
from bootstrap.cluster.checks import (CheckResult, check_capacity, check_gpu_pods, check_nccl, check_rdma,
                                      checks_namespace)
from bootstrap.cluster.client import Cluster, ClusterError, get, merge_patch, object_path, request
from bootstrap.cluster.gate_rules import (GATE_REASON, GateDecision, decide, has_gate, may_hold, with_gate,
                                          without_gate)
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory
from bootstrap.remote_data import RemoteDataError, loads

# The verdict is kept where only the tool writes: a ConfigMap in kube-system (a kubelet may
# write its own Node's annotations and labels, within NodeRestriction's limits, but no ConfigMap:
# kubernetes plugin/pkg/admission/noderestriction/admission.go, plugin/pkg/auth/authorizer/node).
# Per node, the uid of the Node object that passed: a Node deleted and registered again (by its
# own agent, or `rebuild`) is another object, with another uid, and is judged again.
VERDICTS = ("kube-system", "bootstrap-gate")
VERDICTS_PATH = object_path("v1", "ConfigMap", VERDICTS[1], VERDICTS[0])
# Where earlier versions kept the verdict, on the Node: never read, since its kubelet may write
# it (issue 32 item 19); removed whenever the tool writes a node's verdict. So a node that
# passed under an earlier version and carries no gate is gated through the API once and
# checked again, as a node from before the gate is.
OLD_GATE_PASSED = "bootstrap.k3s/gate-passed"
PATCH_TRIES = 5
VERDICT_CHARS = 1024  # one verdict as record_verdict writes it is some 60 characters


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def read_verdicts(cluster: Cluster) -> dict[str, str]:
    """Node name -> the uid of the Node object that passed the gate (the tool's record)."""
    data = (get(cluster, VERDICTS_PATH) or {}).get("data") or {}
    passed = {}
    for name, value in data.items() if isinstance(data, dict) else ():
        try:  # capped: a value nested deep would raise RecursionError past any ValueError handler
            uid = loads(value, what="a gate verdict", max_chars=VERDICT_CHARS, max_depth=2).get("uid") \
                if isinstance(value, str) else None
        except (RemoteDataError, AttributeError):
            uid = None
        if isinstance(uid, str) and uid:
            passed[name] = uid
    return passed


def passed_before(node_object: dict, verdicts: dict[str, str]) -> bool:
    """Whether this very Node object (its uid, which the API server gives) passed the gate."""
    meta = node_object.get("metadata") or {}
    uid = meta.get("uid")
    return isinstance(uid, str) and bool(uid) and verdicts.get(meta.get("name")) == uid


def record_verdict(cluster: Cluster, name: str, uid: str | None) -> None:
    """Record that the Node `name` with `uid` passed (None: forget it): one key of VERDICTS."""
    value = json.dumps({"uid": uid, "passed": int(time.time())}) if uid else None
    change = {"data": {name: value}}
    status, body = request(cluster, "PATCH", VERDICTS_PATH, change, content_type="application/merge-patch+json")
    if status == 404 and value is not None:  # the first verdict: the record made with it
        status, body = request(cluster, "POST", object_path("v1", "ConfigMap", None, VERDICTS[0]), {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": VERDICTS[1], "namespace": VERDICTS[0]},
            **change})
    if status >= 300 and status != 404:
        raise ClusterError(f"cannot record the gate's verdict in ConfigMap {VERDICTS[0]}/{VERDICTS[1]}: "
                           f"{body.get('message', status)}")


# Why a GPU agent that did not answer the probe is gated unjudged (its Node's annotation).
UNPROBED_REASON = ("gated without its checks: this Node has no gate and never passed it (the tool's record), "
                   "and its host did not answer the probe; it is checked once it answers")


def nodes_to_judge(inventory: Inventory, facts: dict[str, HostFacts], node_objects: dict[str, dict],
                   gpu: list, verdicts: dict[str, str], *, gpu_cluster: bool) -> tuple[list, list, list]:
    """(to judge, to gate first, to gate unjudged): the GPU nodes that answered and hold the
    gate's taint, or are servers that never passed (judged open: gate_rules.may_hold); the
    agents that answered and registered before the gate existed (no taint, never passed): the
    tool gates those through the API, since k3s sets node-taint only when a node registers;
    and the GPU agents that did not answer the probe, with no taint and no verdict for their
    Node: gated through the API too, and judged once they answer. A kubelet may delete its
    Node and register it again (another uid, and no taint: node-taint is in a config.yaml its
    host controls), then not answer SSH: it is not left open. `verdicts`: read_verdicts."""
    if not inventory.gpu.gate.enabled:
        return [], [], []
    gated, legacy, unprobed = [], [], []
    for node in gpu_nodes_in_cluster(inventory, facts, node_objects, gpu, verdicts, gpu_cluster=gpu_cluster):
        obj = node_objects[node.name]
        if node.name not in facts:
            if may_hold(node) and not has_gate(obj) and not passed_before(obj, verdicts):
                unprobed.append(node)
        elif has_gate(obj):
            gated.append(node)
        elif not passed_before(obj, verdicts):
            (legacy if may_hold(node) else gated).append(node)
    return gated, legacy, unprobed


def gpu_nodes_in_cluster(inventory: Inventory, facts: dict[str, HostFacts], node_objects: dict[str, dict],
                         gpu: list, verdicts: dict[str, str], *, gpu_cluster: bool) -> list:
    """The GPU nodes that have a Node: the run's (`gpu`: the inventory's word, or the host's
    own answer), and, in a GPU cluster, a node whose host did not answer the probe and is no
    GPU node by the inventory's word alone, when the tool's record names it (it passed the gate
    as a GPU node before) or its Node advertises a GPU resource (its own answer). A node the
    inventory makes no GPU node (gpu.enabled: false) is none."""
    names = {n.name for n in gpu}
    return [n for n in inventory.nodes if n.name in node_objects and (n.name in names or (
        gpu_cluster and n.name not in facts and n.gpu.enabled is not False
        and (n.name in verdicts or bool(burn_in.advertised(node_objects[n.name])))))]


def _patch_node(cluster: Cluster, name: str, change) -> dict:
    """`change(node) -> patch`, with the node's resourceVersion: the list of taints is replaced
    whole, so a taint the node controller added meanwhile must not be lost (409: read again).
    Returns the node as it was read before the patch."""
    for _ in range(PATCH_TRIES):
        current = get(cluster, node_path(name))
        if current is None:
            raise ClusterError(f"node {name} is gone")
        patch = change(current)
        patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"].get("resourceVersion")
        status, body = request(cluster, "PATCH", node_path(name), patch, content_type="application/merge-patch+json")
        if status < 300:
            return current
        if status != 409:
            raise ClusterError(f"PATCH {node_path(name)}: {status} {body.get('message', '')}")
    raise ClusterError(f"node {name} kept changing: its gate was not updated")


def close_gate(cluster: Cluster, name: str, reason: str | None = None) -> None:
    """Put the gate on `name` (a node registered before the gate, or one `health --cordon`
    found broken), with the reason when there is one."""
    def change(node):
        patch: dict = {"spec": {"taints": with_gate((node.get("spec") or {}).get("taints"))}}
        if reason:
            patch["metadata"] = {"annotations": {GATE_REASON: reason}}
        return patch
    _patch_node(cluster, name, change)


def apply_decision(cluster: Cluster, decision: GateDecision) -> None:
    """A node that passed loses the taint (and any old reason); one that failed keeps it and
    carries why; a server that failed carries why, and loses a taint an older run gave it. The
    verdict is recorded apart (record_verdict), never on the Node."""
    annotations = {GATE_REASON: decision.annotation, OLD_GATE_PASSED: None}
    if not decision.held:
        opened = _patch_node(cluster, decision.node, lambda node: {
            "spec": {"taints": without_gate((node.get("spec") or {}).get("taints")) or None},
            "metadata": {"annotations": annotations}})
        uid = (opened.get("metadata") or {}).get("uid") if decision.passed else None
    else:
        merge_patch(cluster, node_path(decision.node), {"metadata": {"annotations": annotations}})
        uid = None
    record_verdict(cluster, decision.node, uid if isinstance(uid, str) else None)


# --- the checks, each node's own ------------------------------------------------------------

def health_results(inventory: Inventory, facts: dict[str, HostFacts], nodes, gpu: list) -> list[CheckResult]:
    """GPU health from the facts, judged as `health` judges it (an error holds the node, whatever
    gpu.health says about preflight; gpu.health off: not probed, not judged)."""
    strict = replace(inventory, gpu=replace(inventory.gpu, health="strict")) if inventory.gpu.health != "off" \
        else inventory
    findings = gpu_health_findings(strict, facts, gpu)  # a peer showing more GPUs is only a warning
    results = []
    for node in nodes:
        errors = [f for f in findings.get(node.name, []) if f.severity == "health-error"]
        if errors:
            results.append(CheckResult("gpu-health", "FAIL", "; ".join(f.message for f in errors), node.name))
        elif node.name in findings:
            results.append(CheckResult("gpu-health", "PASS", "no GPU health error", node.name))
    return results


def in_namespace(cluster: Cluster, run, sweep: bool = True) -> list[CheckResult]:
    """`run(namespace)` in a namespace of its own, deleted afterwards; a node whose kubelet
    keeps one of its pods past the cleanup fails for it, no other node does. `sweep`:
    checks.checks_namespace."""
    with checks_namespace(cluster, sweep) as space:
        results = run(space.name)
    return results + space.leftovers("FAIL")


def pod_results(cluster: Cluster, inventory: Inventory, facts, nodes, checks) -> list[CheckResult]:
    """The GPU pod first (it waits for the device plugin), then what the node advertises."""
    timeout = inventory.validate.timeout_s

    def run(namespace):
        results = check_gpu_pods(cluster, inventory, nodes, facts, timeout, namespace) if "gpu-pod" in checks else []
        if "capacity" in checks:
            results += check_capacity(cluster, inventory, nodes, facts)
        if "rdma" in checks and inventory.network.rdma:
            results += check_rdma(cluster, inventory, nodes)
        return results
    return in_namespace(cluster, run)


def burn_in_results(cluster: Cluster, inventory: Inventory, facts, nodes) -> list[CheckResult]:
    """Each node against the inventory's floor and its own GPUs; a peer's figures only warn."""
    gate = inventory.gpu.gate
    slots = burn_in.slots_of(cluster, inventory, {n.name: facts[n.name] for n in nodes})
    verdict = burn_in.run_burn_in(cluster, slots, gate.burn_in_s, gate.burn_in_min_gflops)
    results = []
    for node in nodes:
        failed, warned = ([why for why in verdict[key] if why.startswith(f"{node.name}:")]
                          for key in ("failed", "warnings"))
        results.append(CheckResult("burn-in", "FAIL" if failed else "PASS",
                                   "; ".join(failed) or "every GPU slot within its own node's range", node.name))
        results += [CheckResult("burn-in", "WARN", why, node.name) for why in warned]
    return results


def proven_nodes(inventory: Inventory, node_objects: dict[str, dict], verdicts: dict[str, str]) -> frozenset[str]:
    """The nodes whose NCCL pairs may pin a failure on a partner (nccl_pairs): the servers, the
    nodes left trusted where the inventory marks some node `trusted: false` (the operator's
    word; with none so marked, `trusted` is everyone's default and says nothing), and the open
    Node objects that passed the gate in an earlier run (the tool's record, by uid)."""
    marks_trust = any(not n.trusted for n in inventory.nodes)

    def passed_open(name: str) -> bool:
        obj = node_objects.get(name)
        return obj is not None and not has_gate(obj) and passed_before(obj, verdicts)
    return frozenset(n.name for n in inventory.nodes
                     if not may_hold(n) or (marks_trust and n.trusted) or passed_open(n.name))


def nccl_results(cluster: Cluster, inventory: Inventory, facts, nodes, peers, proven) -> list[CheckResult]:
    """Each node's NCCL pair tests with peers at its provider (nccl_pairs: a failure counts
    against a node only when unambiguous, with `proven` partners), one pair at a time, each
    in its own namespace; a pair tested once is not tested again."""
    tested: dict[frozenset, CheckResult] = {}
    kept: list[CheckResult] = []  # a kubelet that kept a pod of a pair test: its own node's FAIL

    def test(a, b) -> CheckResult:
        key = frozenset((a.name, b.name))
        if key not in tested:
            def run(namespace):
                return [check_nccl(cluster, inventory, [a, b], facts, inventory.validate.timeout_s, namespace)]
            tested[key], *left = in_namespace(cluster, run, sweep=False)  # the pod checks swept
            kept.extend(left)
        return tested[key]
    return [r for node in nodes
            for r in nccl_pairs.judge_node(node, nccl_pairs.partners_of(node, peers), test, proven=proven)] + kept


def gate_checks(cluster: Cluster, inventory: Inventory, facts: dict[str, HostFacts], nodes, peers,
                gpu: list, proven: frozenset[str] = frozenset()) -> list[CheckResult]:
    """The gated `nodes`' own checks, as gpu.gate.checks chooses; `peers`: GPU nodes already
    open, for the NCCL pair test; `proven`: proven_nodes."""
    checks = set(inventory.gpu.gate.checks)
    results = health_results(inventory, facts, nodes, gpu) if "health" in checks else []
    results += pod_results(cluster, inventory, facts, nodes, checks)
    if "burn-in" in checks:
        results += burn_in_results(cluster, inventory, facts, nodes)
    nccl = inventory.validate.nccl
    if "nccl" in checks and nccl and nccl.enabled:
        passed = [n for n in nodes if decide(n.name, results).passed]  # a failed node is not paired
        results += nccl_results(cluster, inventory, facts, passed, list(peers) + passed, proven)
    return results


def run_gate(cluster: Cluster, inventory: Inventory, facts: dict[str, HostFacts],
             node_objects: dict[str, dict], gpu: list,
             failed_before: dict[str, str] | None = None, *,
             gpu_cluster: bool) -> tuple[list[GateDecision], list[str], list[str]]:
    """Judge every gated GPU node and lift or keep its gate. Returns the decisions, the
    pre-gate nodes the tool gated first, and the GPU agents it gated without judging (they did
    not answer the probe). `gpu`: the run's GPU nodes (bootstrap.topology); `failed_before`:
    nodes that failed on the cluster side already (their MIG layout), with why."""
    # The tool's record is read only where a node's own taint does not settle it (a cluster
    # whose nodes are all gated, or answered and are no GPU nodes, costs no read).
    gpu_names = {n.name for n in gpu}
    open_nodes = [n for n in inventory.nodes if n.name in node_objects and not has_gate(node_objects[n.name])
                  and (n.name in gpu_names or n.name not in facts)]
    verdicts = read_verdicts(cluster) if inventory.gpu.gate.enabled and open_nodes else {}
    gated, legacy, unprobed = nodes_to_judge(inventory, facts, node_objects, gpu, verdicts, gpu_cluster=gpu_cluster)
    for node in legacy:
        close_gate(cluster, node.name)
    for node in unprobed:
        close_gate(cluster, node.name, UNPROBED_REASON)
    nodes = gated + legacy
    if not nodes:
        return [], [], [n.name for n in unprobed]
    judged, failed_before = {n.name for n in nodes}, failed_before or {}
    peers = [n for n in gpu if n.name in facts and n.name in node_objects
             and n.name not in judged and n.name not in failed_before]
    checked = [n for n in nodes if n.name not in failed_before]  # its MIG layout failed: not worth its checks
    try:
        results = gate_checks(cluster, inventory, facts, checked, peers, gpu,
                              proven_nodes(inventory, node_objects, verdicts)) if checked else []
    except ClusterError as exc:  # the checks could not run: every node stays gated, saying why
        results = [CheckResult("gate", "FAIL", f"its checks could not run: {exc}", n.name) for n in nodes]
    results += [CheckResult("mig", "FAIL", why, name) for name, why in failed_before.items() if name in judged]
    decisions = [with_warnings(decide(n.name, results, holds=may_hold(n)), results) for n in nodes]
    for decision in decisions:
        apply_decision(cluster, decision)
    return decisions, [n.name for n in legacy], [n.name for n in unprobed]


def with_warnings(decision: GateDecision, results: list[CheckResult]) -> GateDecision:
    """A node that passed, with what only warned (a failing pair not its own, a peer's figures)."""
    warned = [f"{r.check}: {r.reason}" for r in results if r.node == decision.node and r.status == "WARN"]
    return replace(decision, reason="; ".join([decision.reason, *warned])) if decision.passed and warned else decision


def read_nodes(cluster: Cluster) -> dict[str, dict]:
    items = (get(cluster, "/api/v1/nodes") or {}).get("items") or []
    return {n["metadata"]["name"]: n for n in items if isinstance(n, dict) and "metadata" in n}
