"""The tool's validation checks (bootstrap/cluster/checks.py) through its own API client against
the stand-in API (tests/sandbox.py): what a user reads when a GPU node cannot get its image."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "standins"))
import airgap  # noqa: E402

pytest.importorskip("kubernetes")
from sandbox import cluster, k3s  # noqa: E402,F401
from test_facts_parsers import h200_probe_output  # noqa: E402

from bootstrap.cluster.checks import NAMESPACE, check_gpu_pods, render_table  # noqa: E402
from bootstrap.cluster.client import Cluster  # noqa: E402
from bootstrap.host.facts.probe import parse_host_facts  # noqa: E402
from bootstrap.inventory.loader import parse_inventory  # noqa: E402

needs_upstream = pytest.mark.skipif(airgap.upstream_missing() is not None, reason=airgap.upstream_missing() or "")


@needs_upstream
def test_a_validation_image_no_node_can_pull_fails_the_check_with_the_kubelets_reason(cluster):
    """The kubelet's ImagePullBackOff and containerd's error are what the check says, not
    'still Pending' (the kubelet keeps retrying, so the check waits its time-out for it)."""
    cluster.server()
    cluster.agent("gpu-1", gpus=1)
    cluster.wait_ready("cp-1", "gpu-1")
    inventory = parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server}, "
                                "{name: gpu-1, address: 10.0.0.2}]\n"
                                "validate: {image: 'registry.invalid/cuda-sample:vectoradd-cuda12.5.0'}\n")
    cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
    tool = Cluster(api_client=cluster.api, kubeconfig=cluster.root / "etc/rancher/k3s/k3s.yaml")
    started = time.monotonic()
    (result,) = check_gpu_pods(tool, inventory, [inventory.node("gpu-1")],
                               {"gpu-1": parse_host_facts(h200_probe_output())}, timeout_s=4)
    assert time.monotonic() - started < 8
    assert (result.check, result.status, result.node) == ("gpu-pod", "FAIL", "gpu-1")
    assert result.reason == ('pod never ran: ImagePullBackOff: Back-off pulling image '
                             '"registry.invalid/cuda-sample:vectoradd-cuda12.5.0" (the kubelet retries with a back-off)')
    assert "FAIL  gpu-pod:gpu-1" in render_table([result])
