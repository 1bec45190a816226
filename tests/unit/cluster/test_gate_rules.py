"""The acceptance gate's pure half: the taint k3s applies when a GPU node registers, the
toleration every DaemonSet the tool installs carries (checked against the charts' own
values.yaml where the chart's default is kept), and the gate's decision per node."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from test_components import SCENARIOS, chart_defaults

from bootstrap.cluster.checks import CheckResult
from bootstrap.cluster.components import desired_manifests, desired_releases
from bootstrap.cluster.gate_rules import (GATE_KEY, GATE_REASON, GATE_TAINT, REASON_MAX, decide, has_gate,
                                          node_state, taint_flag, with_gate, without_gate)
from bootstrap.errors import InvalidInput
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.desired import gated_config
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.inventory.loader import parse_inventory
from bootstrap.topology import resolve_topology

TOKENS = JoinTokens("tok", "agent-tok")


def tolerates(toleration: dict, taint: dict) -> bool:
    """k8s.io/api core/v1 toleration.go, ToleratesTaint: the effect must match when given, the
    key when given; operator Exists matches any value, Equal (or empty) the same value."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def inventory(gpu: str = "{}"):
    return parse_inventory(f"""\
cluster: t
gpu: {gpu}
nodes:
  - {{name: cp-1, address: 10.0.0.1, role: server}}
  - {{name: gpu-1, address: 10.0.0.2, taints: ["nvidia.com/gpu=true:NoSchedule"]}}
""", "inv.yaml")


def config_of(inv, gpu=True, current_sha=None) -> dict:
    text = gated_config(inv, inv.node("gpu-1"), TOKENS, None, False, False, gpu and inv.gpu.gate.enabled, current_sha)
    return yaml.safe_load(text)


# --- the taint -------------------------------------------------------------------------------

def test_a_gpu_node_registers_with_the_gate_taint_after_its_own():
    config = config_of(inventory())
    assert config["node-taint"] == ["nvidia.com/gpu=true:NoSchedule", "bootstrap.k3s/gate=pending:NoSchedule"]
    assert taint_flag() == "bootstrap.k3s/gate=pending:NoSchedule"


def test_a_cpu_node_and_a_gate_switched_off_register_without_it():
    assert config_of(inventory(), gpu=False)["node-taint"] == ["nvidia.com/gpu=true:NoSchedule"]
    assert config_of(inventory("{gate: false}"))["node-taint"] == ["nvidia.com/gpu=true:NoSchedule"]
    assert config_of(inventory("{gate: {enabled: false}}"))["node-taint"] == ["nvidia.com/gpu=true:NoSchedule"]


def test_a_node_built_before_the_gate_keeps_its_config_so_k3s_does_not_restart():
    inv = inventory()
    before = k3sconfig.render(k3sconfig.node_config(inv, inv.node("gpu-1"), TOKENS))
    sha = hashlib.sha256(before.encode()).hexdigest()
    assert "node-taint" in config_of(inv, current_sha=sha)
    assert taint_flag() not in config_of(inv, current_sha=sha)["node-taint"]
    # Any other config.yaml (a new node, or one changing anyway) gets the gate.
    assert taint_flag() in config_of(inv, current_sha="0" * 64)["node-taint"]


# --- tolerations -----------------------------------------------------------------------------

# Where each chart's DaemonSets take their tolerations (the chart's values.yaml).
DAEMONSET_TOLERATION_KEYS = {
    "gpu-operator": ["daemonsets.tolerations", "node-feature-discovery.worker.tolerations"],
    "rke2-multus": ["tolerations", "rke2-whereabouts.tolerations"],
    "csi-driver-nfs": ["node.tolerations"],
    "longhorn": ["longhornManager.tolerations"],
}


def lookup(values: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(values, dict) or part not in values:
            return None
        values = values[part]
    return values


def longhorn_setting_tolerations(text: str) -> list[dict]:
    """Longhorn's taintToleration setting (`kubectl taint` syntax, ';' between): key[=value]:effect."""
    out = []
    for item in filter(None, (part.strip() for part in (text or "").split(";"))):
        key_value, _, effect = item.rpartition(":")
        key, eq, value = key_value.partition("=")
        out.append({"key": key, "operator": "Equal" if eq else "Exists", "value": value, "effect": effect})
    return out


@pytest.mark.parametrize("name", ["mixed", "longhorn", "defaults"])
def test_every_daemonset_the_tool_installs_tolerates_the_gate(name):
    inv, facts = SCENARIOS[name]()
    seen = set()
    gpu = resolve_topology(inv, facts).gpu_nodes_of(inv)
    for release in desired_releases(inv, facts, gpu):
        for key in DAEMONSET_TOLERATION_KEYS.get(release.chart, []):
            ours = lookup(release.values, key)
            effective = ours if ours is not None else lookup(chart_defaults(release.chart), key)
            assert any(tolerates(t, GATE_TAINT) for t in effective or []), (release.name, key, effective)
            seen.add(release.chart)
        if release.chart == "longhorn":
            setting = lookup(release.values, "defaultSettings.taintToleration")
            assert any(tolerates(t, GATE_TAINT) for t in longhorn_setting_tolerations(setting))
    for obj in desired_manifests(inv, facts, gpu):
        if obj["kind"] == "DaemonSet":
            tolerations = obj["spec"]["template"]["spec"].get("tolerations") or []
            assert any(tolerates(t, GATE_TAINT) for t in tolerations), obj["metadata"]["name"]
            seen.add(obj["metadata"]["name"])
    expected = {"defaults": {"gpu-operator"}, "longhorn": {"gpu-operator", "longhorn"},
                "mixed": {"gpu-operator", "rke2-multus", "csi-driver-nfs", "rdma-shared-dp-ds"}}[name]
    assert seen >= expected


def test_the_gpu_operator_keeps_its_charts_own_tolerations():
    inv, facts = SCENARIOS["defaults"]()
    gpu = resolve_topology(inv, facts).gpu_nodes_of(inv)
    values = {r.name: r for r in desired_releases(inv, facts, gpu)}["gpu-operator"].values
    defaults = chart_defaults("gpu-operator")
    for key in DAEMONSET_TOLERATION_KEYS["gpu-operator"]:
        for toleration in lookup(defaults, key):
            assert toleration in lookup(values, key), key  # Helm replaces the list whole


def test_the_tolerance_rule_is_kubernetes_own():
    assert tolerates({"operator": "Exists"}, GATE_TAINT)  # empty key with Exists: every taint
    assert tolerates({"key": GATE_KEY, "operator": "Exists"}, GATE_TAINT)
    assert not tolerates({"key": GATE_KEY, "operator": "Exists", "effect": "NoExecute"}, GATE_TAINT)
    assert not tolerates({"key": GATE_KEY, "value": "passed"}, GATE_TAINT)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, GATE_TAINT)


# --- the decision ----------------------------------------------------------------------------

def test_a_node_passes_when_none_of_its_own_checks_failed():
    results = [CheckResult("gpu-capacity", "PASS", "nvidia.com/gpu=8", "g1"),
               CheckResult("gpu-pod", "PASS", "ok", "g1"),
               CheckResult("rdma", "SKIP", "no network.rdma"),
               CheckResult("gpu-pod", "FAIL", "pod failed", "g2")]
    assert decide("g1", results).passed
    assert decide("g1", results).annotation is None
    failed = decide("g2", results)
    assert not failed.passed and failed.reason == "gpu-pod: pod failed"


def test_a_reason_on_the_node_is_one_printable_capped_line():
    decision = decide("g1", [CheckResult("gpu-pod", "FAIL", "\x1b[31mred\nline" + "x" * 2000, "g1")])
    assert "\x1b" not in decision.annotation and "\n" not in decision.annotation
    assert len(decision.annotation) <= REASON_MAX


def test_node_state_reads_the_taint_and_the_reason():
    pending = {"spec": {"taints": with_gate([{"key": "a", "effect": "NoSchedule"}])}}
    assert has_gate(pending) and node_state(pending) == ("pending", "")
    failed = {"metadata": {"annotations": {GATE_REASON: "gpu-pod: no"}}, "spec": pending["spec"]}
    assert node_state(failed) == ("failed", "gpu-pod: no")
    assert node_state({"spec": {"taints": without_gate(pending["spec"]["taints"])}}) == ("open", "")


def test_gate_checks_are_checked_with_file_line_and_field():
    with pytest.raises(InvalidInput) as caught:
        parse_inventory("cluster: t\nnodes: [{name: a, address: 10.0.0.1, role: server}]\n"
                        "gpu:\n  gate:\n    checks: [gpu-pods]\n", "inv.yaml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.line, problem.path) == ("inv.yaml", 5, "gpu.gate.checks[0]")
    assert "gpu-pod" in problem.hint


def test_status_shows_each_nodes_gate():
    from test_host_phase_flow import healthy_host

    from bootstrap.flows.inspection import node_row, render_status

    inv = inventory()
    gated = {"metadata": {"annotations": {GATE_REASON: "gpu-pod: pod failed\x1b[2J"}},
             "spec": {"taints": with_gate([])}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    rows = [node_row(inv.node("cp-1"), healthy_host("cp-1"), {"spec": {}, "status": {}}),
            node_row(inv.node("gpu-1"), healthy_host("gpu-1"), gated)]
    assert (rows[0]["gate"], rows[1]["gate"]) == ("open", "failed")
    text = "\n".join(render_status({"cluster": "t", "state_dir": "s", "api": True, "nodes": rows, "components": {},
                                    "inventory_as_applied": None, "newest_snapshot": None}))
    assert "Ready,gated" in text
    assert "gate gpu-1: failed, no workload pods: gpu-pod: pod failed" in text and "\x1b" not in text
