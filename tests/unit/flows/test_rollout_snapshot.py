"""The rolling upgrade's way back: an etcd snapshot before any server changes version, and
a stop hint that restores it across a minor release (k3s-io/docs docs/upgrades/roll-back.md:
the old binary *and* the datastore from before the upgrade)."""

import contextlib
from pathlib import Path

import pytest

from bootstrap import progress
from bootstrap.errors import BootstrapError
from bootstrap.flows import rolling_upgrade as ru
from bootstrap.flows.run import Run
from bootstrap.host.plan.rollout import Rollout
from bootstrap.inventory.loader import parse_inventory

INV = parse_inventory("""\
cluster: t
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: cp-2, address: 10.0.0.2, role: server}
  - {name: cp-3, address: 10.0.0.3, role: server}
  - {name: a1, address: 10.0.0.11}
""")
SNAP = "bootstrap-0123456789abcdef-20261201-100000-cp-1-1796000000"


def rollout(target="v1.34.1+k3s1", installed="v1.33.5+k3s1", servers=("cp-1", "cp-2", "cp-3")):
    return Rollout(target, {n: installed for n in [*servers, "a1"]}, list(servers), [["a1"]])


def console():
    return progress.Console(progress.Reporter())


def test_servers_changing_version_get_a_snapshot_first_and_agents_alone_do_not():
    taken = []
    point = ru.snapshot_before(INV, None, rollout(), console(), lambda inv, st: taken.append(1) or Path(SNAP))
    assert taken == [1] and point == ru.RollbackPoint(SNAP, "cp-1", False)
    assert ru.snapshot_before(INV, None, rollout(servers=()), console(), lambda *a: taken.append(2)) is None
    assert taken == [1]


def test_no_snapshot_no_rollout():
    def fails(inv, st):
        raise BootstrapError("k3s etcd-snapshot save on cp-1 failed: etcd database not found")

    with pytest.raises(ru.RolloutStopped) as caught:
        ru.snapshot_before(INV, None, rollout(), console(), fails)
    assert "not started" in caught.value.message and "etcd database not found" in caught.value.message
    assert "nothing was upgraded" in caught.value.hint


def test_across_a_minor_the_hint_restores_the_snapshot_not_only_the_binary():
    point = ru.RollbackPoint(SNAP, "cp-1", False)
    with pytest.raises(ru.RolloutStopped) as caught:
        ru.stop(rollout(), "cp-2", ["cp-1"], "not Ready after 300s", before=point)
    hint = caught.value.hint
    assert "fix cp-2 and run `bootstrap up` again" in hint
    assert f"restoring {SNAP}" in hint and "not a rollback across a minor release" in hint
    assert (f"on cp-1 run `sudo k3s server --cluster-reset --cluster-reset-restore-path="
            f"/var/lib/rancher/k3s/server/db/snapshots/{SNAP}`") in hint
    assert "sudo rm -rf /var/lib/rancher/k3s/server/db" in hint and "set k3s.version back to v1.33.5+k3s1" in hint
    assert "systemctl restart k3s" not in hint  # the plain binary swap is not offered


def test_with_s3_the_rollback_reset_restores_the_local_file():
    with pytest.raises(ru.RolloutStopped) as caught:
        ru.stop(rollout(servers=("cp-1",)), "cp-1", [], "crashed", before=ru.RollbackPoint(SNAP, "cp-1", True))
    assert f"snapshots/{SNAP} --etcd-s3=false`" in caught.value.hint


def test_within_a_minor_swapping_the_binary_back_is_the_rollback():
    point = ru.RollbackPoint(SNAP, "cp-1", False)
    with pytest.raises(ru.RolloutStopped) as caught:
        ru.stop(rollout("v1.33.6+k3s1"), "cp-2", ["cp-1"], "not Ready", before=point)
    assert "install -m 0755 /var/lib/bootstrap/k3s.previous /usr/local/bin/k3s && sudo systemctl restart k3s" in \
        caught.value.hint
    assert "--cluster-reset" not in caught.value.hint


def test_the_snapshot_is_taken_before_the_first_server_is_touched(monkeypatch):
    order = []
    monkeypatch.setattr(ru, "roll_nodes", lambda run, cluster, r, names, **kw:
                        order.append(("roll", tuple(names), kw["before"])))
    monkeypatch.setattr(ru, "settle_earlier_cordons", lambda *a: None)

    class Session:
        failures = {}

    run = Run(INV, None, console(), connect=lambda inv, st: contextlib.nullcontext(object()),
              take_snapshot=lambda inv, st: order.append(("snapshot",)) or Path(SNAP))
    run.attach(Session())
    ru.run_rollout(run, rollout(), lambda: order.append(("between",)), drain_timeout=1, force=False)
    point = ru.RollbackPoint(SNAP, "cp-1", False)
    assert order == [("snapshot",), ("roll", ("cp-1",), point), ("roll", ("cp-2",), point),
                     ("roll", ("cp-3",), point), ("between",), ("roll", ("a1",), point)]
