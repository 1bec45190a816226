"""The acceptance gate never holds a server (bootstrap.cluster.gate_rules.may_hold), against the
sandboxed stand-in API: on a cluster of GPU machines only, a server that registered with the
gate's taint (as an earlier version of the tool made every GPU node register) is opened before
the components are applied, is judged like any GPU node, and a failure is reported (exit 1)
without holding it; a GPU agent is gated and judged as before; a server that never passed is
judged without being tainted; `health --cordon` cordons a broken server but does not gate it."""

from __future__ import annotations

import io

import pytest
import yaml
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_cluster_side_flow import helm_calls  # noqa: F401  (a fixture: the recording Helm)
from test_gate_flow import CPU, GOOD, XID_79, connector, taint_keys

from bootstrap import progress
from bootstrap.checks.preflight import Finding
from bootstrap.cluster.gate_rules import GATE_KEY, GATE_REASON, taint_flag
from bootstrap.errors import HostsFailed
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.flows.gpu_health import HEALTH_LABEL, NodeHealth, cordon_unhealthy
from bootstrap.flows.run import Run
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir


def all_gpu_inventory(tmp_path, gate=None):
    """One server and one agent, both GPU machines; the gate's checks that need no GPU pod."""
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({"cluster": "flow", "state_dir": "state", "validate": {"timeout_s": 20},
                                    "gpu": {"gate": gate if gate is not None else {"checks": ["health"]}},
                                    "nodes": [{"name": "box-1", "address": "10.0.0.1", "role": "server"},
                                              {"name": "gpu-1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def run_for(lab, tmp_path, out, facts, gate=None) -> Run:
    inventory, state = all_gpu_inventory(tmp_path, gate)
    run = Run(inventory, state, progress.Console(progress.Reporter(out)), connect=connector(lab, tmp_path))
    run.set_facts(facts)
    return run


@pytest.fixture
def all_gpu_lab(k3s, tmp_path):  # noqa: F811
    lab = Cluster(k3s, tmp_path / "hosts")
    lab.server(name="box-1", config_text=f"node-taint: ['{taint_flag()}']\n")  # gated by an earlier version
    lab.agent("gpu-1", gpus=1, taints=[taint_flag()])
    lab.wait_ready("box-1", "gpu-1")
    yield lab
    lab.stop()


def test_a_failing_gpu_server_is_reported_but_never_held(all_gpu_lab, helm_calls, tmp_path):  # noqa: F811
    lab = all_gpu_lab
    assert GATE_KEY in taint_keys(lab, "box-1") and GATE_KEY in taint_keys(lab, "gpu-1")
    out = io.StringIO()
    with pytest.raises(HostsFailed, match=r"1 GPU server\(s\) failed the acceptance gate and take workloads all the "
                                          r"same \(a server is never gated\): box-1") as failed:
        cluster_phase(run_for(lab, tmp_path, out, {"box-1": XID_79, "gpu-1": GOOD}), validate=False)
    assert "stay gated" not in str(failed.value)
    said = out.getvalue()
    assert "gate: box-1: not passed, takes workloads all the same (a server is never gated): gpu-health:" in said
    assert "gate: gpu-1: passed, takes workloads" in said
    assert GATE_KEY not in taint_keys(lab, "box-1") and GATE_KEY not in taint_keys(lab, "gpu-1")
    assert "Xid 79" in lab.node("box-1").metadata.annotations[GATE_REASON]  # why, on the node too


def test_a_servers_gate_is_lifted_before_the_components_whatever_the_gate(all_gpu_lab, helm_calls, tmp_path):  # noqa: F811
    """With the gate switched off nothing judges: the server's taint goes where the inventory's
    taints are applied, before any release; an agent's stays (the gate off leaves it alone)."""
    out = io.StringIO()
    cluster_phase(run_for(all_gpu_lab, tmp_path, out, {"box-1": GOOD, "gpu-1": GOOD}, gate=False), validate=False)
    assert "gate:" not in out.getvalue()
    assert GATE_KEY not in taint_keys(all_gpu_lab, "box-1")
    assert GATE_KEY in taint_keys(all_gpu_lab, "gpu-1")


def test_a_server_that_never_passed_is_judged_open_and_an_agent_gated_first(k3s, helm_calls, tmp_path):  # noqa: F811
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="box-1")  # registered without the gate: what k3s gets now
        lab.agent("gpu-1", gpus=1)  # registered before the gate existed
        lab.wait_ready("box-1", "gpu-1")
        out = io.StringIO()
        with pytest.raises(HostsFailed, match=r"1 GPU node\(s\) failed the acceptance gate and stay gated: gpu-1"):
            cluster_phase(run_for(lab, tmp_path, out, {"box-1": GOOD, "gpu-1": XID_79}), validate=False)
        said = out.getvalue()
        assert "gpu-1 registered before the acceptance gate: gated through the API" in said
        assert "box-1 registered before" not in said
        assert "gate: box-1: passed, takes workloads" in said
        assert GATE_KEY not in taint_keys(lab, "box-1") and GATE_KEY in taint_keys(lab, "gpu-1")
    finally:
        lab.stop()


def test_a_cpu_server_is_not_judged(all_gpu_lab, helm_calls, tmp_path):  # noqa: F811
    out = io.StringIO()
    cluster_phase(run_for(all_gpu_lab, tmp_path, out, {"box-1": CPU, "gpu-1": GOOD}), validate=False)
    assert "gate: box-1" not in out.getvalue() and "gate: gpu-1: passed" in out.getvalue()
    assert GATE_KEY not in taint_keys(all_gpu_lab, "box-1")


def test_health_cordon_cordons_a_broken_server_without_gating_it(all_gpu_lab, tmp_path):
    """Its next `up` would otherwise apply the components with the one server gated."""
    lab = all_gpu_lab
    inventory, state = all_gpu_inventory(tmp_path)
    for name in ("box-1", "gpu-1"):  # both open, as after a first `up`
        lab.core.patch_node(name, {"spec": {"taints": None}})
    broken = [NodeHealth(name, [Finding(name, "gpu-health:xid", "Xid 79: GPU has fallen off the bus",
                                        severity="health-error")], []) for name in ("box-1", "gpu-1")]
    out = io.StringIO()
    cordon_unhealthy(inventory, state, broken, progress.Console(progress.Reporter(out)), connector(lab, tmp_path))
    assert lab.node("box-1").spec.unschedulable and lab.node("gpu-1").spec.unschedulable
    assert GATE_KEY not in taint_keys(lab, "box-1") and GATE_KEY in taint_keys(lab, "gpu-1")
    said = out.getvalue()
    assert f"box-1: cordoned (label {HEALTH_LABEL}=error): Xid 79" in said
    assert f"gpu-1: cordoned (label {HEALTH_LABEL}=error) and gated ({GATE_KEY}): Xid 79" in said
