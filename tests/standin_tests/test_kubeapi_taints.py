"""The stand-in API places pods as kube-scheduler's TaintToleration filter does, and counts a
DaemonSet's nodes as the DaemonSet controller does: a custom taint (the acceptance gate's)
keeps out every pod, a DaemonSet's included, that does not tolerate it."""

from __future__ import annotations

from kubernetes import client
from sandbox import Cluster, k3s, wait  # noqa: F401  (k3s: the built stand-in, a fixture; puts standins/ on the path)
from standins import kubeapi

GATE = {"key": "bootstrap.k3s/gate", "value": "pending", "effect": "NoSchedule"}


def test_tolerates_is_kubernetes_own_rule():
    assert kubeapi.tolerates({"operator": "Exists"}, GATE)  # empty key with Exists: everything
    assert kubeapi.tolerates({"key": GATE["key"], "operator": "Exists", "effect": "NoSchedule"}, GATE)
    assert kubeapi.tolerates({"key": GATE["key"], "value": "pending"}, GATE)  # empty operator: Equal
    assert not kubeapi.tolerates({"key": GATE["key"], "value": "other"}, GATE)
    assert not kubeapi.tolerates({"key": GATE["key"], "operator": "Exists", "effect": "NoExecute"}, GATE)
    assert not kubeapi.tolerates({"key": GATE["key"], "operator": "Gt", "value": "pending"}, GATE)  # unknown
    assert not kubeapi.tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, GATE)


def daemonset(name, tolerations):
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"tolerations": tolerations,
                                           "containers": [{"name": "main", "image": "busybox"}]}}}}


def test_a_daemonset_runs_on_a_gated_node_only_with_the_gates_toleration(k3s, tmp_path):  # noqa: F811
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("gpu-1", gpus=1, taints=["bootstrap.k3s/gate=pending:NoSchedule"])
        lab.wait_ready("cp-1", "gpu-1")
        apps = client.AppsV1Api(lab.api)
        apps.create_namespaced_daemon_set("default", daemonset("plain", []))
        apps.create_namespaced_daemon_set("default", daemonset("tolerant", [
            {"key": "bootstrap.k3s/gate", "operator": "Exists", "effect": "NoSchedule"}]))

        def desired(name):
            status = apps.read_namespaced_daemon_set(name, "default").status
            return status.desired_number_scheduled if status else None
        assert wait("plain counted", lambda: desired("plain")) == 1  # cp-1 only: the DaemonSet controller's own
        assert wait("tolerant counted", lambda: desired("tolerant") == 2 or None)  # tolerations do not cover it
    finally:
        lab.stop()

