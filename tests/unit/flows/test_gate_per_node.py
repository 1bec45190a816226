"""The acceptance gate's outcomes are per node, in-process against the sandboxed stand-in API
(tests/sandbox.py). Issue 32 item 13: all gated nodes shared one namespace, so a kubelet that
never confirmed its pod's deletion timed the cleanup out and failed every node of the batch,
and left the namespace Terminating for later gate and `validate` runs. Item 19: the verdict
was an annotation on the Node, which its kubelet may write."""

from __future__ import annotations

import io

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_cluster_side_flow import helm_calls  # noqa: F401  (a fixture: the recording Helm)
from test_gate_flow import CPU, GOOD, XID_79, a_run, connector, gated_lab, inventory_for, taint_keys  # noqa: F401

from bootstrap.cluster import checks
from bootstrap.cluster.client import Cluster as ApiCluster
from bootstrap.cluster.gate import OLD_GATE_PASSED, UNPROBED_REASON, VERDICTS, passed_before, read_verdicts
from bootstrap.cluster.gate_rules import GATE_KEY, GATE_REASON, taint_flag
from bootstrap.errors import HostsFailed
from bootstrap.flows.cluster_side import cluster_phase

KEEPS_PODS = "standin.k3s/kubelet=keeps-deleted-pods"  # the stand-in's kubelet that never confirms a deletion


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("gpu-1", gpus=1, taints=[taint_flag()])
    sandbox.agent("gpu-2", gpus=1, taints=[taint_flag()], labels=[KEEPS_PODS])
    sandbox.wait_ready("cp-1", "gpu-1", "gpu-2")
    yield sandbox
    sandbox.stop()


def leave_terminating(lab, namespace: str) -> None:
    """An earlier run's namespace, held Terminating by a pod on gpu-2 its kubelet keeps."""
    lab.core.create_namespace({"metadata": {"name": namespace}})
    lab.core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-2"}, "restartPolicy": "Never",
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}})
    lab.pod_done("left", namespace)
    lab.core.delete_namespace(namespace)


def up_failing(lab, tmp_path, facts: dict, failing: str) -> str:
    """`up`'s cluster half on `lab` with these facts; it must end naming `failing`; its output."""
    inventory, state = inventory_for(tmp_path)
    out = io.StringIO()
    run = a_run(inventory, state, out, connector(lab, tmp_path))
    run.set_facts(facts)
    with pytest.raises(HostsFailed, match=failing):
        cluster_phase(run, validate=False)
    return out.getvalue()


def test_a_kubelet_that_keeps_its_pods_fails_its_own_node_only(lab, helm_calls, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(checks, "CLEANUP_S", 5, raising=False)  # how long a deletion is waited for (120 s)
    leave_terminating(lab, checks.NAMESPACE)  # the fixed namespace of earlier versions
    said = up_failing(lab, tmp_path, {"cp-1": CPU, "gpu-1": GOOD, "gpu-2": GOOD},
                      "1 GPU node.* failed the acceptance gate .*gpu-2")
    assert "gate: gpu-1: passed, takes workloads" in said
    assert "gate: gpu-2: not passed, stays gated: cleanup: its kubelet did not confirm the deletion of gpu-test-" \
        in said
    assert GATE_KEY not in taint_keys(lab, "gpu-1") and GATE_KEY in taint_keys(lab, "gpu-2")
    assert "its kubelet did not confirm" in lab.node("gpu-2").metadata.annotations[GATE_REASON]
    names = [n.metadata.name for n in lab.core.list_namespace().items]
    assert checks.NAMESPACE in names  # still Terminating: nothing waited on it


def test_a_kubelet_that_writes_the_old_passed_annotation_is_gated_and_judged_all_the_same(k3s, helm_calls, tmp_path):  # noqa: F811
    """Item 19: `bootstrap.k3s/gate-passed` on the Node was the verdict, and a kubelet may write
    its own Node's annotations. Now the verdict is the tool's record (gate.VERDICTS); a node
    that carries only the annotation, like every node that passed under an earlier version, is
    gated through the API once and checked again."""
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("gpu-1", gpus=1)  # no node-taint: registered before the gate
        lab.agent("gpu-2", gpus=1)
        lab.wait_ready("cp-1", "gpu-1", "gpu-2")
        lab.core.patch_node("gpu-1", {"metadata": {"annotations": {OLD_GATE_PASSED: "1767225600"}}})
        said = up_failing(lab, tmp_path, {"cp-1": CPU, "gpu-1": GOOD, "gpu-2": XID_79}, "gpu-2")
        assert "gate: gpu-1 registered before the acceptance gate: gated through the API" in said
        assert "gate: gpu-1: passed, takes workloads" in said
        assert OLD_GATE_PASSED not in (lab.node("gpu-1").metadata.annotations or {})  # the old mark is gone
        assert GATE_KEY in taint_keys(lab, "gpu-2")  # failed: gated, not recorded
        assert read_verdicts(ApiCluster(lab.api, tmp_path / "kubeconfig")) == {"gpu-1": lab.node("gpu-1").metadata.uid}
    finally:
        lab.stop()


def test_a_verdict_holds_for_the_node_object_that_passed_only():
    verdicts = {"gpu-1": "uid-a"}
    assert passed_before({"metadata": {"name": "gpu-1", "uid": "uid-a"}}, verdicts)
    assert not passed_before({"metadata": {"name": "gpu-1", "uid": "uid-b"}}, verdicts)  # registered again
    assert not passed_before({"metadata": {"name": "gpu-1", "annotations": {OLD_GATE_PASSED: "1"}}}, verdicts)
    assert not passed_before({"metadata": {"name": "gpu-2", "uid": "uid-a"}}, verdicts)


def test_one_nodes_failed_mig_layout_keeps_it_gated_and_the_others_go_on(k3s, helm_calls, tmp_path):  # noqa: F811
    """Item 13: one node's nvidia.com/mig.config.state=failed (MIG Manager's, or its own
    agent's: the node may write its labels) stopped the cluster side for every node."""
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("gpu-1", gpus=1, taints=[taint_flag()])
        lab.agent("gpu-2", gpus=1, taints=[taint_flag()])
        lab.wait_ready("cp-1", "gpu-1", "gpu-2")
        inventory, state = inventory_for(tmp_path, mig_on="gpu-2")  # a layout the H200 cannot hold
        out = io.StringIO()
        run = a_run(inventory, state, out, connector(lab, tmp_path))
        run.set_facts({"cp-1": CPU, "gpu-1": GOOD, "gpu-2": GOOD})
        with pytest.raises(HostsFailed, match="MIG layout not applied on gpu-2"):
            cluster_phase(run, validate=False)
        said = out.getvalue()
        assert "mig: MIG layout" in said and "failed on gpu-2" in said
        assert "gate: gpu-1: passed, takes workloads" in said
        assert "gate: gpu-2: not passed, stays gated: mig: MIG layout" in said
        assert GATE_KEY not in taint_keys(lab, "gpu-1") and GATE_KEY in taint_keys(lab, "gpu-2")
    finally:
        lab.stop()


def test_a_failing_nccl_pair_that_no_second_partner_can_explain_fails_no_node(gated_lab, helm_calls, tmp_path):  # noqa: F811
    """Item 12: the pair's failure was pinned on the gated node. Two nodes, one pair, and it
    fails (its bus bandwidth under the floor): whose fault cannot be told, so both pass the
    gate with the failing pair said."""
    inventory, state = inventory_for(tmp_path, validate={
        "timeout_s": 20, "nccl": {"image": "example.com/nccl-tests:busbw-50", "min_busbw_gbps": 100}})
    out = io.StringIO()
    run = a_run(inventory, state, out, connector(gated_lab, tmp_path))
    run.set_facts({"cp-1": CPU, "gpu-1": GOOD, "gpu-2": GOOD})
    cluster_phase(run, validate=False)
    said = out.getvalue()
    for node, partner in (("gpu-1", "gpu-2"), ("gpu-2", "gpu-1")):
        line = next(line for line in said.splitlines() if line.startswith(f"gate: {node}: "))
        assert line.startswith(f"gate: {node}: passed, takes workloads") and \
            f"nccl: the pair with {partner} failed" in line and "not attributed to this node" in line
        assert GATE_KEY not in taint_keys(gated_lab, node)


def test_a_gpu_node_registered_again_that_does_not_answer_the_probe_is_gated_unjudged(k3s, helm_calls, tmp_path):  # noqa: F811
    """A kubelet may delete its own Node and register it again: another uid, and no taint (k3s
    sets node-taint only at registration, from a config.yaml its host controls), then not
    answer the probe. The gate skipped every GPU node without facts, so it stayed open."""
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("gpu-1", gpus=1, taints=[taint_flag()])
        lab.agent("gpu-2", gpus=1)  # registered again: no gate
        lab.wait_ready("cp-1", "gpu-1", "gpu-2")
        lab.core.create_namespaced_config_map(VERDICTS[0], {"metadata": {"name": VERDICTS[1]}, "data": {
            "gpu-2": '{"uid": "the-node-that-passed", "passed": 1}'}})  # as its earlier Node passed
        inventory, state = inventory_for(tmp_path)
        out = io.StringIO()
        run = a_run(inventory, state, out, connector(lab, tmp_path))
        run.set_facts({"cp-1": CPU, "gpu-1": GOOD})  # gpu-2's host did not answer
        cluster_phase(run, validate=False)
        said = out.getvalue()
        assert "gate: gpu-2: its Node has no gate and never passed it, and its host did not answer the probe: " \
            "gated through the API without its checks" in said
        assert GATE_KEY in taint_keys(lab, "gpu-2")  # before: left open
        assert lab.node("gpu-2").metadata.annotations[GATE_REASON] == UNPROBED_REASON
        assert "gate: gpu-1: passed, takes workloads" in said and "gate: gpu-2: passed" not in said
    finally:
        lab.stop()
