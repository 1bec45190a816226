"""The gate's verdict record (gate.VERDICTS, a ConfigMap only the tool should write): read with
the caps every answer gets. Whoever may write ConfigMaps in kube-system (Longhorn's manager's
account may, cluster-wide) must not make `up` fail for every node with a value nested too deep
for json's recursive decoder. Against the k3s stand-in's API."""

from __future__ import annotations

from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster import gate
from bootstrap.cluster.client import Cluster as ApiCluster


def test_a_verdict_nested_past_any_depth_is_no_verdict_and_the_others_are_read(k3s, tmp_path):  # noqa: F811
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.core.create_namespaced_config_map(gate.VERDICTS[0], {"metadata": {"name": gate.VERDICTS[1]}, "data": {
            "gpu-1": '{"uid": "uid-1", "passed": 1}', "gpu-2": "[" * 100000 + "]" * 100000,
            "gpu-3": '{"uid": ' + "[" * 5 + "]" * 5 + "}", "gpu-4": "not json"}})
        assert gate.read_verdicts(ApiCluster(lab.api, tmp_path / "kubeconfig")) == {"gpu-1": "uid-1"}
    finally:
        lab.stop()
