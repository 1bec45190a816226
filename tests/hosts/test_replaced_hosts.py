"""A spot VM re-created under its old name on test hosts: a new machine-id, new SSH host
keys, nothing of the old machine. k3s (here its stand-in, which refuses a new node
password as k3s-io/k3s pkg/nodepassword does) turns the newcomer away while the old Node
and its node-password secret exist, so `up` and `rebuild` remove them before the join.

The new host key is refused first, and the tool says how to let it in: `bootstrap
forget-host INVENTORY NODE`, which the user runs as the machine really was replaced."""

import pytest
from clirun import run_bootstrap
from labinv import write_inventory
from test_daytwo_hosts import api_nodes, ready

pytestmark = pytest.mark.hosts


def machine_id(host) -> str:
    return host.ssh("cat /etc/machine-id").stdout.strip()


def test_a_machine_recreated_under_its_name_joins_with_up_and_with_rebuild(lab, tmp_path, airgap):
    cp, a1, a2 = lab.start(["rp-cp", "rp-a1", "rp-a2"])
    # The old Nodes keep saying Ready (the stand-in's node controller grace, 20 s by default):
    # what a rebuild run soon after the loss sees.
    cp.ssh("echo K3S_STANDIN_NODE_GRACE=900 > /etc/default/k3s", user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", [cp, a1, a2], extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    old_id = machine_id(a1)
    assert api_nodes(inventory)["rp-a1"]["status"]["nodeInfo"]["machineID"] == old_id

    a1.recreate()  # same name and address; new machine-id and host keys
    assert machine_id(a1) != old_id
    refused = run_bootstrap("up", inventory, "--no-validate", timeout=600)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert f"bootstrap forget-host {inventory} rp-a1" in refused.stdout + refused.stderr
    forgot = run_bootstrap("forget-host", inventory, "rp-a1")
    assert forgot.returncode == 0, forgot.stderr
    up = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "rp-a1: a new machine under this name" in up.stdout
    nodes = api_nodes(inventory)
    assert ready(nodes["rp-a1"]) and nodes["rp-a1"]["status"]["nodeInfo"]["machineID"] == machine_id(a1)
    assert "Node password rejected" not in a1.ssh("journalctl -u k3s-agent --no-pager -o cat",
                                                  user="root").stdout

    a2.recreate()
    assert ready(api_nodes(inventory)["rp-a2"])  # its old Node still says Ready
    run_bootstrap("forget-host", inventory, "rp-a2")
    rebuild = run_bootstrap("rebuild", inventory, "--no-validate", timeout=900)
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    assert "lost rp-a2" in rebuild.stdout and "joined rp-a2" in rebuild.stdout
    assert "unchanged rp-cp, rp-a1" in rebuild.stdout
    nodes = api_nodes(inventory)
    assert ready(nodes["rp-a2"]) and nodes["rp-a2"]["status"]["nodeInfo"]["machineID"] == machine_id(a2)


def test_up_replace_waits_out_the_old_nodes_grace_then_lets_the_new_machine_in(lab, tmp_path, airgap):
    """The spot VM was re-created moments ago: its old Node still says Ready (the stand-in's
    node controller grace, 20 s). `up --replace NODE` waits until it does not, forgets that
    node's pinned key only, pins the new one and joins the new machine."""
    import time

    cp, a1, a2 = lab.start(["rq-cp", "rq-a1", "rq-a2"])
    inventory = write_inventory(tmp_path / "inv.yaml", [cp, a1, a2], extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    pinned = (tmp_path / "state" / "known_hosts").read_text()
    a1.recreate()
    started = time.monotonic()
    up = run_bootstrap("up", inventory, "--no-validate", "--replace", "rq-a1", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "rq-a1: forgot the pinned host key of the replaced machine" in up.stdout, up.stdout
    assert "rq-a1: a new machine under this name" in up.stdout
    assert time.monotonic() - started < 180
    nodes = api_nodes(inventory)
    assert ready(nodes["rq-a1"]) and nodes["rq-a1"]["status"]["nodeInfo"]["machineID"] == machine_id(a1)
    now = (tmp_path / "state" / "known_hosts").read_text()
    for host in (cp, a2):  # the other nodes' keys are the ones pinned before
        assert [l for l in pinned.splitlines() if l.startswith(f"{host.address} ")] == \
               [l for l in now.splitlines() if l.startswith(f"{host.address} ")]
    old_a1 = [l for l in pinned.splitlines() if l.startswith(f"{a1.address} ")]
    assert old_a1 and not set(old_a1) & set(now.splitlines())  # a1's new key replaced the old one
