"""`health --burn-in` against the sandboxed stand-in cluster (tests/sandbox.py), whose
k8s-samples n-body image behaves as the real one: the ENTRYPOINT /cuda-samples/sample with the
pod's args, `nbody` by name not on PATH, n-body's own benchmark lines (tests/standins/kubeapi.py,
run_nbody, with the upstream files it follows)."""

from __future__ import annotations

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster.burn_in import BURN_IN_IMAGE, Slots, run_burn_in
from bootstrap.cluster.client import Cluster as ApiCluster


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("gpu-1", gpus=2)
    sandbox.wait_ready("cp-1", "gpu-1")
    yield sandbox
    sandbox.stop()


def test_burn_in_gets_a_number_from_every_gpu_and_the_image_refuses_nbody_by_name(lab, tmp_path):
    verdict = run_burn_in(ApiCluster(lab.api, tmp_path / "kubeconfig"), {"gpu-1": Slots("nvidia.com/gpu", 2)}, 10)
    assert verdict["failed"] == [] and verdict["slow"] == []
    assert verdict["gpus"] == {"gpu-1": {0: 27000.0, 1: 27000.0}}  # the stand-in's H200 rate
    # What the burn-in ran before: a shell calling `nbody`, which the image does not have on PATH.
    lab.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "by-name"},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
                 "containers": [{"name": "main", "image": BURN_IN_IMAGE, "command": ["/bin/sh", "-c",
                                                                               "nbody -benchmark -device=0"],
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    pod = lab.pod_done("by-name")
    assert pod.status.phase == "Failed" and lab.log("by-name") == "/bin/sh: 1: nbody: not found\n"
