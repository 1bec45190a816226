"""Issue 11 on test hosts: no command loses a cluster or touches what is not its own.

Each test fails on the code before: `rebuild` restored a healthy control plane on any API
error, `down` deleted the only join token while a server was unreachable, and `down`/`up`
wiped or rewrote hosts of another cluster.
"""

import re

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts


def unit_invocation(host, unit="k3s"):
    return host.ssh(f"systemctl show -p InvocationID --value {unit}").stdout.strip()


def test_rebuild_never_restores_a_healthy_control_plane_on_an_api_error(lab, tmp_path, airgap):
    hosts = lab.start(["hc-cp", "hc-a1"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    state = tmp_path / "state"
    assert list((state / "snapshots").glob("bootstrap-*[0-9]")), "up took no snapshot"
    before = unit_invocation(hosts[0])
    # A stale kubeconfig: the API answers 401. The etcd data is fine.
    config = yaml.safe_load((state / "kubeconfig").read_text())
    for user in config["users"]:
        user["user"] = {"token": "stale-" + "0" * 40}
    (state / "kubeconfig").write_text(yaml.safe_dump(config))
    result = run_bootstrap("rebuild", inventory, "--restore", "--yes", timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the control plane is not lost" in result.stderr and "hc-cp" in result.stderr
    assert "401" in result.stderr or "Unauthorized" in result.stderr  # the cause, not a verdict
    assert "restore" not in result.stdout.lower()
    assert unit_invocation(hosts[0]) == before, "k3s on the server was restarted"
    # The stale kubeconfig is fixed as the hint says; the cluster was never reset.
    fetched = run_bootstrap("kubeconfig", inventory)
    assert fetched.returncode == 0, fetched.stderr
    status = run_bootstrap("status", inventory, "--json")
    assert status.returncode == 0, status.stdout + status.stderr


def test_down_keeps_the_token_while_a_server_is_unreachable(lab, tmp_path, airgap):
    hosts = lab.start(["dk-cp", "dk-a1"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    state = tmp_path / "state"
    token = (state / "token").read_text()
    hosts[0].stop_sshd()
    down = run_bootstrap("down", inventory, "--yes", timeout=600)
    assert down.returncode == 1, down.stdout + down.stderr
    assert (state / "token").read_text() == token and (state / "kubeconfig").exists()
    assert re.search(r"kept the join token and kubeconfig .* k3s may still run on dk-cp", down.stderr), down.stderr
    assert hosts[1].ssh("systemctl is-active k3s-agent", check=False).stdout.strip() == "inactive"


def test_another_clusters_host_is_neither_changed_by_up_nor_wiped_by_down(lab, tmp_path, airgap):
    owned, fresh = lab.start(["oc-cp", "oc-new"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_inventory(tmp_path / "a" / "inv.yaml", [owned], cluster="alpha", extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", a, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    config_before = owned.ssh("sudo sha256sum /etc/rancher/k3s/config.yaml").stdout
    running = unit_invocation(owned)
    # Cluster beta's inventory names alpha's server by mistake.
    b = write_inventory(tmp_path / "b" / "inv.yaml", [owned, fresh], cluster="beta",
                        extra={"k3s": {"airgap": str(airgap)}})
    up = run_bootstrap("up", b, "--no-validate", timeout=600)
    assert up.returncode == 1, up.stdout + up.stderr
    assert re.search(r"oc-cp: owner: it belongs to another cluster set up by bootstrap \('alpha'", up.stdout), up.stdout
    assert fresh.created_files() == set()
    down = run_bootstrap("down", b, "--yes", timeout=600)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "REFUSED oc-cp" in down.stderr and "nothing was changed" in down.stderr
    assert owned.ssh("sudo sha256sum /etc/rancher/k3s/config.yaml").stdout == config_before
    assert unit_invocation(owned) == running
    # Alpha itself is still whole.
    assert run_bootstrap("status", a).returncode == 0


def test_down_leaves_a_host_with_a_hand_installed_k3s_alone_unless_forced(lab, tmp_path, airgap):
    server, other = lab.start(["hk-cp", "hk-own"])
    # Someone else's k3s: a binary and a unit the tool did not write.
    other.ssh("cat > /tmp/k3s <<'EOF'\n#!/bin/sh\necho 'k3s version v1.30.0+k3s1 (hand)'\nEOF\n"
              "install -m 0755 /tmp/k3s /usr/local/bin/k3s && mkdir -p /var/lib/kubelet && touch /var/lib/kubelet/theirs",
              user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", [server, other], extra={"k3s": {"airgap": str(airgap)}})
    down = run_bootstrap("down", inventory, "--yes", timeout=600)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "REFUSED hk-own: k3s is installed on it, but not by bootstrap" in down.stderr
    assert other.ssh("test -f /var/lib/kubelet/theirs && test -x /usr/local/bin/k3s", check=False).returncode == 0
    forced = run_bootstrap("down", inventory, "--yes", "--force", timeout=600)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert other.ssh("test -e /usr/local/bin/k3s", check=False).returncode != 0
