"""When `up` takes its snapshot: after a change, and whenever the cluster has none (found by
tests/hosts/test_faults_hosts.py: an `up` interrupted at its snapshot left the cluster
without one, and every later `up`, seeing no change, took none)."""

from bootstrap.flows.host_phase import snapshot_due


def test_a_cluster_without_a_snapshot_gets_one_even_without_a_change():
    assert snapshot_due(False, None)
    assert snapshot_due(True, None) and snapshot_due(True, object())
    assert not snapshot_due(False, object())
