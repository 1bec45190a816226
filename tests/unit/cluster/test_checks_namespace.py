"""The checks' namespaces and pods, against the k3s stand-in's API. Each use of the checks gets
a namespace of its own (checks.checks_namespace), and earlier ones are deleted first: only by
the names the tool gives, since the label PART_OF is no proof (anyone who may patch namespaces
can put it on one, and a namespace deleted takes its volumes with it). A check's pod for a
node runs on that Node, chosen by its name: never by a label its kubelet may write."""

from __future__ import annotations

import time

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster import burn_in, checks
from bootstrap.cluster.client import Cluster as ApiCluster


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    yield sandbox
    sandbox.stop()


def state(lab, name: str) -> str:
    found = [n for n in lab.core.list_namespace().items if n.metadata.name == name]
    if not found:
        return "gone"
    return "deleting" if found[0].metadata.deletion_timestamp or found[0].status.phase == "Terminating" else "kept"


def test_only_the_checks_own_names_are_deleted_whatever_else_carries_their_label(lab, tmp_path):
    for name in ("longhorn-system", "bootstrap-validate-0a1b2c3d", "bootstrap-validate-prod"):
        lab.core.create_namespace({"metadata": {"name": name, "labels": dict(checks.PART_OF)}})
    checks.delete_earlier(ApiCluster(lab.api, tmp_path / "kubeconfig"))
    assert state(lab, "longhorn-system") == "kept"  # labelled by someone else
    assert state(lab, "bootstrap-validate-prod") == "kept"  # not a name checks_namespace gives
    assert state(lab, "bootstrap-validate-0a1b2c3d") in ("gone", "deleting")  # an earlier run's


def test_a_node_that_claims_another_nodes_hostname_draws_none_of_its_pods(k3s, tmp_path):  # noqa: F811
    """Before, each node's GPU pod, burn-in pod and gang member chose its node by the
    kubernetes.io/hostname label, which a kubelet may write on its own Node: a-evil (first in
    the scheduler's order) labelled itself gpu-1 and ran gpu-1's pods, answering for it."""
    lab = Cluster(k3s, tmp_path / "hosts")
    try:
        lab.server(name="cp-1")
        lab.agent("a-evil", gpus=1)
        lab.agent("gpu-1", gpus=1)
        lab.wait_ready("cp-1", "a-evil", "gpu-1")
        lab.core.patch_node("a-evil", {"metadata": {"labels": {"kubernetes.io/hostname": "gpu-1"}}})
        cluster = ApiCluster(lab.api, tmp_path / "kubeconfig")
        with checks.checks_namespace(cluster) as space:
            checks._create(cluster, checks._pod("gpu-test", "gpu-1", "busybox", {"nvidia.com/gpu": 1},
                                                command=["true"]), space.name)
            checks._create(cluster, burn_in.burn_in_pod("gpu-1", burn_in.Slots("nvidia.com/gpu", 1), 1), space.name)
            placed = [lab.pod_done(name, space.name).spec.node_name for name in ("gpu-test", burn_in.pod_name("gpu-1"))]
        assert placed == ["gpu-1", "gpu-1"]
    finally:
        lab.stop()


def test_pods_started_together_share_one_deadline(lab, tmp_path, monkeypatch):
    """Three nodes whose burn-in pods never run (no such Node here: they stay Pending) end
    the burn-in at its one time-out, not one after the other (three time-outs before)."""
    monkeypatch.setattr(burn_in, "START_UP_S", 0)
    monkeypatch.setattr(checks, "CLEANUP_S", 5)
    cluster = ApiCluster(lab.api, tmp_path / "kubeconfig")
    started = time.monotonic()
    verdict = burn_in.run_burn_in(cluster, {f"ghost-{i}": burn_in.Slots("nvidia.com/gpu", 1) for i in range(3)}, 1)
    waited = time.monotonic() - started
    assert [why.split(":")[:2] for why in sorted(verdict["failed"])] == [
        [f"ghost-{i}", " the burn-in pod pending"] for i in range(3)]
    assert waited < 11, waited  # one time-out (5 s) and the cleanup; before: three (15 s) and the cleanup
