"""A whole cluster behind a bastion: every connection the tool opens (pyinfra's sessions,
the API tunnel, the kubeconfig fetch, snapshots) goes through `ssh.jump`, one remote layer
(bootstrap/remote/sshlink.py). The nodes drop SSH from anything but the bastion, so a
connection that bypassed it would fail."""

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts


def test_up_validate_snapshot_and_rebuild_through_a_bastion(lab, tmp_path, airgap):
    bastion, server, agent = lab.start(["bj-bastion", "bj-cp", "bj-a1"])
    jump = {"jump": f"{testhosts.SSH_USER}@{bastion.address}"}
    for node in (server, agent):
        # Last: it also cuts the tests' own back door to these two.
        node.ssh(f"iptables -A INPUT -p tcp --dport 22 ! -s {bastion.address} -j DROP", user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", [server, agent], extra={
        "k3s": {"airgap": str(airgap)},
        "ssh": {"user": testhosts.SSH_USER, "key": str(testhosts.key_path()), "sudo": True,
                "connect_timeout": 5, **jump}})
    up = run_bootstrap("up", inventory, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "validate" in up.stdout.lower() and "snapshot:" in up.stdout
    state = tmp_path / "state"
    assert (state / "kubeconfig").exists()
    pinned = (state / "known_hosts").read_text()
    assert all(h.address in pinned for h in (bastion, server, agent))

    validate = run_bootstrap("validate", inventory, timeout=600)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    snapshot = run_bootstrap("snapshot", inventory, timeout=600)
    assert snapshot.returncode == 0, snapshot.stdout + snapshot.stderr
    (state / "kubeconfig").unlink()  # fetched again, through the bastion
    fetched = run_bootstrap("kubeconfig", inventory, timeout=300)
    assert fetched.returncode == 0, fetched.stderr
    rebuild = run_bootstrap("rebuild", inventory, "--no-validate", timeout=600)
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    assert "lost none" in rebuild.stdout and "unchanged bj-cp, bj-a1" in rebuild.stdout
    status = run_bootstrap("status", inventory, timeout=300)
    assert status.returncode == 0, status.stdout + status.stderr
