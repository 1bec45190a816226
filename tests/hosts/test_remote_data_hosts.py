"""Issue 23 item 5 on test hosts: a host whose answers are hostile stops nobody else.

The lying host holds a manifest of the wrong types ({"cluster_id": null, "files": [{}]}) and
prints bytes that are not UTF-8 in its probe output. Before, `up` and `down` raised TypeError
while building every host's plan or teardown script (so no host was changed or removed), and
the bytes killed pyinfra's strict UTF-8 reader of the probe's output.
"""

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts

HOSTILE_MANIFEST = '{"cluster_id": null, "files": [{}]}\n'


def lie(host) -> None:
    host.ssh("mkdir -p /var/lib/bootstrap && printf '%s' '" + HOSTILE_MANIFEST.strip() + "' > "
             "/var/lib/bootstrap/manifest.json && chmod 0644 /var/lib/bootstrap/manifest.json && "
             # Bytes that are not UTF-8 in a line the probe prints (its os-release section).
             "printf 'BOOTSTRAP_NOTE=\\377\\376 not utf-8\\n' >> /etc/os-release", user="root")


def test_up_and_down_finish_for_the_others_and_name_the_liars_reason(lab, tmp_path, airgap):
    server, honest, liar = lab.start(["rd-cp", "rd-a1", "rd-liar"])
    lie(liar)
    inventory = write_inventory(tmp_path / "inv.yaml", [server, honest, liar], extra={"k3s": {"airgap": str(airgap)}})

    facts = run_bootstrap("facts", inventory, "--json")
    assert facts.returncode == 0, facts.stdout + facts.stderr  # the liar's facts are data too
    assert '"manifest_error": "/var/lib/bootstrap/manifest.json: cluster_id is null' in facts.stdout

    up = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "rd-liar: owner: its /var/lib/bootstrap/manifest.json: cluster_id is null" in up.stdout, up.stdout
    assert "FAILED rd-liar" in up.stderr and "Traceback" not in up.stderr
    for host, unit in ((server, "k3s"), (honest, "k3s-agent")):
        assert host.ssh(f"systemctl is-active {unit}", check=False).stdout.strip() == "active", up.stdout + up.stderr
    assert liar.ssh("test -e /etc/rancher/k3s/config.yaml", check=False).returncode != 0  # never changed
    # k3s.yaml was read back from the server (as bytes, bootstrap.remote.remote_output) while the agents joined.
    assert "client-certificate-data" in (tmp_path / "state" / "kubeconfig").read_text()

    down = run_bootstrap("down", inventory, "--yes", timeout=600)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "rd-liar: its /var/lib/bootstrap/manifest.json: cluster_id is null" in down.stderr, down.stderr
    assert "Traceback" not in down.stderr
    for host in (server, honest):
        assert host.ssh("test -e /usr/local/bin/k3s", check=False).returncode != 0, down.stdout + down.stderr
    assert liar.ssh("cat /var/lib/bootstrap/manifest.json").stdout == HOSTILE_MANIFEST.strip()
