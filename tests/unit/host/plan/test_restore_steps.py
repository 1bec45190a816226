"""The restore's rendered commands and steps (bootstrap.host.plan.restore, converge_steps
with a restore): what k3s's restore procedure asks for, in its order."""

from pathlib import Path

from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.host.plan.restore import reset_command
from bootstrap.host.plan.steps import converge_steps
from bootstrap.inventory.loader import parse_inventory

HA = """\
cluster: t
{extra}nodes:
  - {{name: s1, address: 10.0.0.1, role: server}}
  - {{name: s2, address: 10.0.0.2, role: server}}
  - {{name: s3, address: 10.0.0.3, role: server}}
  - {{name: a1, address: 10.0.0.4}}
"""
SNAPSHOT = Path("/state/snapshots/bootstrap-0123456789abcdef-20261201-100000-s1-1796000000")


def text(commands) -> str:
    return "\n".join(str(c) for c in commands)


def steps_for(inventory, service=None, failed=()):
    plans = {n.name: HostPlan(node=n, unit="k3s" if n.role == "server" else "k3s-agent", service=service)
             for n in inventory.nodes}
    return converge_steps(inventory, plans, set(failed), restore=("s1", SNAPSHOT))


def test_with_s3_configured_the_local_snapshot_is_restored_with_etcd_s3_false():
    """k3s looks the restore path up in S3 while etcd-s3 is set (pkg/etcd/etcd.go, Reset)."""
    inventory = parse_inventory(HA.format(extra="k3s: {snapshots: {s3: {bucket: snaps}}}\n"))
    (restore,) = [s for s in steps_for(inventory) if s.name == "restore etcd snapshot on s1"]
    script = text(restore.commands["s1"])
    assert ("k3s server --cluster-reset --cluster-reset-restore-path=/var/lib/rancher/k3s/server/db/snapshots/"
            f"{SNAPSHOT.name} --etcd-s3=false") in script
    plain = text(next(s for s in steps_for(parse_inventory(HA.format(extra=""))) if s.name.startswith("restore")
                      ).commands["s1"])
    assert "--etcd-s3" not in plain and "--cluster-reset-restore-path=" in plain


def test_reset_command_quotes_the_path():
    assert reset_command("/x/a b", False) == "k3s server --cluster-reset --cluster-reset-restore-path='/x/a b'"


def test_the_other_servers_lose_their_etcd_data_before_the_restore_and_start_after_it():
    inventory = parse_inventory(HA.format(extra=""))
    steps = steps_for(inventory)  # their plans start nothing: config and binary are unchanged
    names = [s.name for s in steps]
    clear = names.index("clear etcd data on the other servers")
    assert clear < names.index("restore etcd snapshot on s1") < names.index("start server s1") < \
        names.index("join server s2") < names.index("join server s3") < names.index("join agents")
    peers = steps[clear].commands
    assert set(peers) == {"s2", "s3"}
    script = text(peers["s2"])
    assert script.index("systemctl stop k3s") < script.index("rm -rf /var/lib/rancher/k3s/server/db")
    for name in ("s2", "s3"):
        join = steps[names.index(f"join server {name}")].commands[name]
        assert "systemctl start --no-block $u" in text(join)
    assert not steps[names.index("join agents")].commands  # the agents' plans start nothing


def test_a_server_that_did_not_answer_is_not_touched():
    inventory = parse_inventory(HA.format(extra=""))
    plans = {n.name: HostPlan(node=n, unit="k3s") for n in inventory.nodes if n.name != "s3"}
    steps = converge_steps(inventory, plans, set(), restore=("s1", SNAPSHOT))
    assert set(next(s for s in steps if s.name.startswith("clear")).commands) == {"s2"}
