"""The acceptance gate in-process: `up`'s cluster half against the sandboxed stand-in API
(tests/sandbox.py), two GPU nodes registered with the gate's taint (k3s node-taint), one of
them with a GPU health error in its facts (an Xid 79). The healthy one passes and takes
workload pods; the other stays gated with the reason on the node and in the output; a pod
without the toleration waits Pending; `validate` does not gate a passed node again."""

from __future__ import annotations

import contextlib
import io
from dataclasses import replace

import pytest
import yaml
from sandbox import Cluster, k3s, wait  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_cluster_side_flow import helm_calls  # noqa: F401  (a fixture: the recording Helm)
from test_gpu_health_flow import XID79, probe_output

from bootstrap import progress
from bootstrap.cluster.client import Cluster as ApiCluster
from bootstrap.cluster.gate import OLD_GATE_PASSED, VERDICTS, read_verdicts
from bootstrap.cluster.gate_rules import GATE_KEY, GATE_REASON, taint_flag
from bootstrap.errors import HostsFailed
from bootstrap.flows.cluster_side import cluster_phase, validate_cluster
from bootstrap.flows.run import Run
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir
from bootstrap.topology import resolve_topology

GOOD = replace(parse_host_facts(probe_output()), init_process="systemd", has_systemd=True)
XID_79 = replace(parse_host_facts(probe_output(kernel_log=XID79)), init_process="systemd", has_systemd=True)
CPU = replace(GOOD, gpus=[], gpu_health=None, xids=None, nvidia_pci=[], mig_profiles=[])


@pytest.fixture
def gated_lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("gpu-1", gpus=1, taints=[taint_flag()])
    sandbox.agent("gpu-2", gpus=1, taints=[taint_flag()])
    sandbox.wait_ready("cp-1", "gpu-1", "gpu-2")
    yield sandbox
    sandbox.stop()


def inventory_for(tmp_path, gate=None, mig_on=None, validate=None):
    """`mig_on`: a node given a MIG layout no H200 holds (two 7g.141gb instances)."""
    path = tmp_path / "lab.yaml"
    gpu = {"gate": gate} if gate is not None else {}
    nodes = [{"name": "cp-1", "address": "10.0.0.1", "role": "server", "gpu": {"enabled": False}},
             {"name": "gpu-1", "address": "10.0.0.2"}, {"name": "gpu-2", "address": "10.0.0.3"}]
    for node in nodes:
        if node["name"] == mig_on:
            node["gpu"] = {"sharing": {"mig": {"profiles": {"7g.141gb": 2}}}}
    path.write_text(yaml.safe_dump({"cluster": "flow", "state_dir": "state", "gpu": gpu,
                                    "validate": validate or {"timeout_s": 20}, "nodes": nodes}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def connector(lab, tmp_path):
    @contextlib.contextmanager
    def connect(inv, st):
        yield ApiCluster(lab.api, tmp_path / "kubeconfig")
    return connect


def a_run(inventory, state, out, connect) -> Run:
    run = Run(inventory, state, progress.Console(progress.Reporter(out)), connect=connect)
    run.set_facts({"cp-1": CPU, "gpu-1": GOOD, "gpu-2": XID_79})
    return run


def taint_keys(lab, name):
    return [t.key for t in lab.node(name).spec.taints or []]


def user_pod(lab, name, node):
    lab.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}})


def wait_unschedulable(lab, name) -> str:
    """The scheduler's message on a pod it could not place."""
    def message():
        pod = lab.core.read_namespaced_pod(name, "default")
        assert pod.spec.node_name is None, "placed on a gated node"
        return next((c.message for c in pod.status.conditions or [] if c.reason == "Unschedulable"), None)
    return wait(f"pod {name} to be unschedulable", message)


def test_the_healthy_node_passes_the_gate_and_the_broken_one_stays_gated(gated_lab, helm_calls, tmp_path):  # noqa: F811
    lab = gated_lab
    assert GATE_KEY in taint_keys(lab, "gpu-1") and GATE_KEY in taint_keys(lab, "gpu-2")  # from registration
    user_pod(lab, "early", "gpu-1")
    waiting = wait_unschedulable(lab, "early")
    assert "untolerated taint {bootstrap.k3s/gate: pending}" in waiting  # what a user's pod sees
    inventory, state = inventory_for(tmp_path)
    out = io.StringIO()
    with pytest.raises(HostsFailed, match="1 GPU node.* failed the acceptance gate .*gpu-2"):
        cluster_phase(a_run(inventory, state, out, connector(lab, tmp_path)), validate=False)
    said = out.getvalue()
    assert "gate: gpu-1: passed, takes workloads" in said
    assert "gate: gpu-2: not passed, stays gated: gpu-health:" in said and "Xid 79" in said
    assert GATE_KEY not in taint_keys(lab, "gpu-1")
    # the verdict is kept where no kubelet writes (kube-system), for this very Node object
    assert read_verdicts(ApiCluster(lab.api, tmp_path / "kubeconfig")) == {"gpu-1": lab.node("gpu-1").metadata.uid}
    assert lab.core.read_namespaced_config_map(VERDICTS[1], VERDICTS[0]).data.keys() == {"gpu-1"}
    assert OLD_GATE_PASSED not in (lab.node("gpu-1").metadata.annotations or {})
    assert GATE_KEY in taint_keys(lab, "gpu-2")
    reason = lab.node("gpu-2").metadata.annotations[GATE_REASON]
    assert "Xid 79" in reason and reason.isprintable()
    # The user's pod waited for the gate, then went to the node that passed.
    assert lab.pod_done("early").spec.node_name == "gpu-1"
    user_pod(lab, "on-broken", "gpu-2")
    assert "untolerated taint {bootstrap.k3s/gate: pending}" in wait_unschedulable(lab, "on-broken")

    # validate re-checks; it never gates a passed node again.
    facts = {"cp-1": CPU, "gpu-1": GOOD, "gpu-2": XID_79}
    validate_cluster(inventory, state, facts, progress.Console(progress.Reporter(io.StringIO())),
                     gpu=resolve_topology(inventory, facts).gpu_nodes_of(inventory), connect=connector(lab, tmp_path))
    assert GATE_KEY not in taint_keys(lab, "gpu-1")


def test_a_node_registered_before_the_gate_is_gated_through_the_api_then_judged(k3s, helm_calls, tmp_path):  # noqa: F811
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("gpu-1", gpus=1)  # no node-taint: a cluster built before the gate
        lab.agent("gpu-2", gpus=1, taints=[taint_flag()])
        lab.wait_ready("cp-1", "gpu-1", "gpu-2")
        inventory, state = inventory_for(tmp_path)
        out = io.StringIO()
        run = a_run(inventory, state, out, connector(lab, tmp_path))
        run.set_facts({"cp-1": CPU, "gpu-1": GOOD, "gpu-2": GOOD})
        cluster_phase(run, validate=False)
        assert "gpu-1 registered before the acceptance gate: gated through the API" in out.getvalue()
        assert GATE_KEY not in taint_keys(lab, "gpu-1") and GATE_KEY not in taint_keys(lab, "gpu-2")
        # Passed once: the next run leaves both alone (no taint, no checks).
        again = io.StringIO()
        cluster_phase(a_run(inventory, state, again, connector(lab, tmp_path)), validate=False, hosts_changed=False)
        assert "gate:" not in again.getvalue()
    finally:
        lab.stop()


def test_the_gate_switched_off_leaves_gated_nodes_alone(gated_lab, helm_calls, tmp_path):  # noqa: F811
    inventory, state = inventory_for(tmp_path, gate=False)
    out = io.StringIO()
    cluster_phase(a_run(inventory, state, out, connector(gated_lab, tmp_path)), validate=False)
    assert "gate:" not in out.getvalue()
    assert GATE_KEY in taint_keys(gated_lab, "gpu-1")
