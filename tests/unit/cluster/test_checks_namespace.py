"""The checks' namespaces (checks.checks_namespace): each use gets its own, and earlier ones are
deleted first. Only the names the tool gives are ever deleted: the label PART_OF is no proof,
since anyone who may patch namespaces can put it on one, and a namespace deleted takes its
volumes with it. Against the k3s stand-in's API."""

from __future__ import annotations

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster import checks
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
