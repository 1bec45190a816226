"""MIG Manager's verdict per node, against the sandboxed stand-in API (tests/sandbox.py): a
node's labels are its own answer (its agent may write them at registration, node-label), so
one agent that says nvidia.com/mig.config.state=failed, or one that never settles, is that
node's failure; the wait goes on for the others (issue 32 item 13: it stopped the cluster
side for every node)."""

from __future__ import annotations

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster.apply import wait_mig
from bootstrap.cluster.client import Cluster as ApiCluster

STATE = "nvidia.com/mig.config.state"


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("liar", labels=[f"{STATE}=failed"])  # its own agent writes it
    sandbox.agent("stuck", labels=[f"{STATE}=pending"])
    sandbox.agent("good", labels=[f"{STATE}=success"])
    sandbox.wait_ready("cp-1", "liar", "stuck", "good")
    yield sandbox
    sandbox.stop()


def test_one_nodes_failed_or_unsettled_mig_state_is_that_nodes_failure_only(lab, tmp_path):
    api = ApiCluster(lab.api, tmp_path / "kubeconfig")
    failed = wait_mig(api, {"liar": "all-1g.18gb", "stuck": "all-3g.71gb", "good": "all-1g.18gb"}, timeout_s=3)
    assert failed == {"liar": "MIG layout all-1g.18gb failed on liar: see the nvidia-mig-manager pod's log",
                      "stuck": f"MIG layout all-3g.71gb not applied on stuck after 3s ({STATE}=pending)"}
    assert wait_mig(api, {"good": "all-1g.18gb"}, timeout_s=3) == {} and wait_mig(api, {}) == {}
