"""Issue 11 on test hosts: no command loses a cluster or touches what is not its own.

Each test fails on the code before: `rebuild` restored a healthy control plane on any API
error, `down` deleted the only join token while a server was unreachable, and `down`/`up`
wiped or rewrote hosts of another cluster.
"""

import base64
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
    # A stale kubeconfig: the API refuses its user (403). The etcd data is fine. (Not a token
    # user for a 401: the tool refuses a kubeconfig with a token; and the stand-in's TLS,
    # unlike Go's, fails the handshake on a certificate of another CA instead of a 401.)
    config = yaml.safe_load((state / "kubeconfig").read_text())
    chain, key = _client_certificate(hosts[0], tmp_path / "stale", "stale-user")
    for user in config["users"]:
        user["user"] = {"client-certificate-data": base64.b64encode(chain).decode(),
                        "client-key-data": base64.b64encode(key).decode()}
    (state / "kubeconfig").write_text(yaml.safe_dump(config))
    result = run_bootstrap("rebuild", inventory, "--restore", "--yes", timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the control plane is not lost" in result.stderr and "hc-cp" in result.stderr
    assert "403" in result.stderr or "Forbidden" in result.stderr  # the cause, not a verdict
    assert "restore" not in result.stdout.lower()
    assert unit_invocation(hosts[0]) == before, "k3s on the server was restarted"
    # The stale kubeconfig is fixed as the hint says; the cluster was never reset.
    fetched = run_bootstrap("kubeconfig", inventory)
    assert fetched.returncode == 0, fetched.stderr
    status = run_bootstrap("status", inventory, "--json")
    assert status.returncode == 0, status.stdout + status.stderr


def _client_certificate(server, folder, name: str) -> tuple[bytes, bytes]:
    """(chain, key) of a user the cluster's client CA signed, in no group: one the API knows
    and refuses (403)."""
    from standins import k3s_pki

    folder.mkdir()
    for part in ("crt", "key"):
        text = server.ssh(f"sudo cat /var/lib/rancher/k3s/server/tls/client-ca.{part}").stdout
        (folder / f"client-ca.{part}").write_text(text)
    key_path = str(folder / "user.key")
    chain = k3s_pki._leaf(str(folder), "client-ca", name, [], "clientAuth", [], key_path)
    return chain, (folder / "user.key").read_bytes()


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


def test_a_server_whose_k3s_yaml_carries_an_exec_plugin_runs_nothing_here(lab, tmp_path):
    """Issue 23: the server's operator writes its k3s.yaml. `bootstrap kubeconfig --merge`
    used to save and merge its `exec` plugin, which kubectl, Helm and the tool's own client
    then ran on this machine. Now the file is refused, naming the host and the field, and
    nothing is saved or merged."""
    from kubeconfigs import k3s_yaml

    hosts = lab.start(["hk-cp"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    marker = tmp_path / "ran-on-the-operators-machine"
    hostile = k3s_yaml(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
                                      "args": ["-c", f"touch {marker}"]}})
    hosts[0].ssh("sudo mkdir -p /etc/rancher/k3s && sudo tee /etc/rancher/k3s/k3s.yaml >/dev/null", input=hostile)
    kube = tmp_path / "home" / ".kube" / "config"
    result = run_bootstrap("kubeconfig", inventory, "--merge",
                           env={"HOME": str(tmp_path / "home"), "KUBECONFIG": str(kube)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "hk-cp" in result.stderr and "'exec'" in result.stderr and "Traceback" not in result.stderr
    assert not kube.exists() and not (tmp_path / "state" / "kubeconfig").exists() and not marker.exists()
