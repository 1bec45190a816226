"""The record of applied releases (bootstrap.cluster.apply.DigestRecord), against the API
stand-in: one request per release, and no release's entry lost to another's."""

from __future__ import annotations

import pytest
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap.cluster.apply import DIGESTS, DIGESTS_PATH, DigestRecord, digests_in
from bootstrap.cluster.client import Cluster as ApiCluster, get, request


@pytest.fixture
def api(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    yield ApiCluster(sandbox.api, tmp_path / "kubeconfig")
    sandbox.stop()


def recorded(api) -> dict:
    return digests_in(get(api, DIGESTS_PATH))


def test_the_first_release_creates_the_record_and_later_ones_add_their_key(api):
    record = DigestRecord(api, exists=False)
    record.record("multus", "d1")
    record.record("volcano", "d2")
    record.record("multus", "d3")
    assert recorded(api) == {"multus": "d3", "volcano": "d2"}


def test_a_record_created_or_deleted_meanwhile_is_still_written(api):
    DigestRecord(api, exists=False).record("volcano", "d1")
    DigestRecord(api, exists=False).record("multus", "d2")  # another run made it: patched, not refused
    assert recorded(api) == {"volcano": "d1", "multus": "d2"}
    status, _ = request(api, "DELETE", DIGESTS_PATH)
    assert status < 300
    DigestRecord(api, exists=True).record("nfs", "d3")  # deleted meanwhile: created again
    assert recorded(api) == {"nfs": "d3"}
    assert get(api, DIGESTS_PATH)["metadata"]["namespace"] == DIGESTS[0]
