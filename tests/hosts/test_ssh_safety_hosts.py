"""SSH safety against booted test hosts: a node reachable only through a bastion, a port
that drops SSH, a failed root script that must not leave the join token behind."""

import json
import time

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts


def drop_ssh_except(host, allowed: str | None) -> None:
    """iptables on the host: SSH only from `allowed` (None: from nobody). Last, as it also
    cuts the tests' own back door."""
    rule = f"! -s {allowed} " if allowed else ""
    host.ssh(f"iptables -A INPUT -p tcp --dport 22 {rule}-j DROP", user="root")


def test_facts_through_a_bastion_reach_a_node_only_it_can_reach(lab, tmp_path):
    bastion, target = lab.start(["sj-bastion", "sj-target"])
    drop_ssh_except(target, bastion.address)
    inventory = write_inventory(tmp_path / "inv.yaml", [target],
                                node_extra={"sj-target": {"ssh": {"jump": f"{testhosts.SSH_USER}@{bastion.address}"}}})
    (tmp_path / "direct").mkdir()
    direct = write_inventory(tmp_path / "direct" / "inv.yaml", [target], cluster="direct")
    refused = run_bootstrap("facts", direct)
    assert refused.returncode == 1 and f"no SSH answer from {target.address}:22 in 5 s" in refused.stderr

    result = run_bootstrap("facts", inventory, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hosts"]["sj-target"]["hostname"] == "sj-target"
    state = tmp_path / "state"
    pinned = (state / "known_hosts").read_text()
    assert bastion.address in pinned and target.address in pinned  # both keys pinned
    assert not list(state.glob("*ssh_config*")) and not list(state.glob(".known_hosts*"))

    # The API tunnel's client goes through the bastion too.
    from bootstrap.remote.tunnel import connect_ssh
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory)
    client = connect_ssh(inv, inv.nodes[0], StateDir(inv))
    try:
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == "sj-target"
    finally:
        client.close()


def test_a_port_that_drops_ssh_is_named_with_its_timeout(lab, tmp_path):
    (host,) = lab.start(["sj-silent"])
    drop_ssh_except(host, None)
    inventory = write_inventory(tmp_path / "inv.yaml", [host], extra={"ssh": {
        "user": testhosts.SSH_USER, "key": str(testhosts.key_path()), "connect_timeout": 3}})
    started = time.monotonic()
    result = run_bootstrap("facts", inventory)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert f"FAILED sj-silent: no SSH answer from {host.address}:22 in 3 s" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "No existing session" not in result.stderr
    print(f"silent port: facts ended after {elapsed:.1f} s (timeout 3 s)")
    assert elapsed < 3 + 5, elapsed


def test_a_failed_root_script_leaves_no_staging_dir_and_no_token(lab, tmp_path, airgap):
    (host,) = lab.start(["sj-fail"])
    # /etc/rancher as a file: installing /etc/rancher/k3s/config.yaml fails in the root script
    host.ssh("touch /etc/rancher", user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", [host], extra={"k3s": {"airgap": str(airgap)}})
    result = run_bootstrap("up", inventory, "--hosts-only")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED sj-fail" in result.stderr
    token = (tmp_path / "state" / "token").read_text().strip()
    assert host.ssh("ls -d /tmp/bootstrap-stage-* 2>/dev/null", check=False).stdout.strip() == ""
    leftovers = [p for p in host.upper.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leftovers == []
