"""What the cluster side's requests cost through the tunnel, against the API stand-in: the
record of applied releases (bootstrap.cluster.apply.DigestRecord) takes one request per
release and loses no release's entry; reads after a warmed connection open no new one."""

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


def connections_opened(api) -> int:
    pools = api.api_client.rest_client.pool_manager.pools
    return sum(pools[key].num_connections for key in pools.keys())


def test_warm_connections_are_opened_together_and_the_reads_after_them_open_none(api):
    """The connection made ahead of time (while the hosts are probed) opens WARM_CONNECTIONS
    kept-alive connections at once; a batch of reads then goes out in parallel over them:
    no channel or TLS handshake more through the tunnel."""
    from bootstrap.cluster.client import WARM_CONNECTIONS, get_all, warm_connections

    warm_connections(api)
    assert api.open_connections == WARM_CONNECTIONS == connections_opened(api)
    got = get_all(api, ["/api/v1/nodes", DIGESTS_PATH, "/api/v1/namespaces/kube-system",
                        "/apis/storage.k8s.io/v1/storageclasses/local-path"])
    assert got[DIGESTS_PATH] is None and got["/api/v1/namespaces/kube-system"]["metadata"]["name"] == "kube-system"
    assert connections_opened(api) == WARM_CONNECTIONS
