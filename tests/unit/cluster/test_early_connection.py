"""The API connection an existing cluster's `up` makes while the host side works."""

import contextlib

import gevent

from bootstrap.cluster.early_connection import EarlyConnection


class Connects:
    def __init__(self, fail=False):
        self.opened, self.closed, self.warmed, self.fail = [], [], [], fail

    @contextlib.contextmanager
    def __call__(self, inventory, state):
        if self.fail:
            raise OSError("no tunnel")
        self.opened.append((inventory, state))
        try:
            yield f"cluster{len(self.opened)}"
        finally:
            self.closed.append(len(self.opened))


def test_the_connection_is_made_in_the_background_and_kept_until_closed():
    early_side, fallback = Connects(), Connects()
    early = EarlyConnection(early_side, "inv", "state", warm=early_side.warmed.append)
    gevent.sleep(0)  # the host side would be probing now
    assert early_side.opened == [("inv", "state")] and early_side.warmed == ["cluster1"]
    connect = early.connect_or(fallback)
    for _ in range(2):  # the cluster side, then validate: the same connection
        with connect("inv", "state") as cluster:
            assert cluster == "cluster1"
    assert early_side.closed == [] and fallback.opened == []
    early.close()
    assert early_side.closed == [1]


def test_a_connection_that_failed_leaves_the_cluster_side_its_own_connect():
    broken, fallback = Connects(fail=True), Connects()
    early = EarlyConnection(broken, "inv", "state", warm=lambda c: None)
    with early.connect_or(fallback)("inv", "state") as cluster:
        assert cluster == "cluster1"  # the fallback's, with its own errors had it failed
    assert fallback.closed == [1]
    early.close()
