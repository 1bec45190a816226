"""Issue 23 on test hosts: lab hosts that lie, as a marketplace host's operator can.

- an agent whose os-release and whose failed step's output carry terminal escape sequences
  (an OSC 52 clipboard write, a screen clear and a fake success line);
- an agent whose /var/lib/bootstrap/manifest.json has the wrong types;
- a server whose k3s.yaml carries an exec credential plugin that would run on this machine.

`facts`, `up`, `status`, `kubeconfig` and `down` finish for the honest hosts, name the
liar with the reason, print no raw escape byte, show no traceback, and nothing runs here.
"""

import json
import re
import uuid

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts

ATTACK = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[H\u2713 all hosts converged\u202e"
HOSTILE_OS_RELEASE = (
    'PRETTY_NAME="Debian GNU/Linux 12 ' + ATTACK.replace('"', '') + '"\n'
    'NAME="Debian GNU/Linux"\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n')
# sudo's secure_path puts /usr/local/sbin first: the tool's `sysctl -w` meets this one. Reads
# pass through, so the probe (which reads /proc/sys) sees an ordinary host.
HOSTILE_SYSCTL = ("#!/bin/sh\n"
                  "case \"$*\" in *-w*) cat >&2 <<'EOF'\n" + ATTACK + "\nEOF\n  exit 1;; esac\n"
                  "exec /usr/sbin/sysctl \"$@\"\n")
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_clean(result, *, what):
    for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        found = RAW_CONTROL.search(text)
        assert found is None, f"{what}: a raw control character {found.group()!r} reached {stream}:\n{text}"
        assert "Traceback" not in text, f"{what}: a traceback on {stream}:\n{text}"


def test_lying_hosts_cannot_stop_the_others_reach_this_machine_or_its_terminal(lab, tmp_path, airgap):
    marker = tmp_path / f"exec-ran-{uuid.uuid4().hex}"
    liar = testhosts.HostSpec("ly-bad", extra_files={
        "/etc/os-release": HOSTILE_OS_RELEASE,
        "/usr/local/sbin/sysctl": (HOSTILE_SYSCTL, 0o755),
    })
    server, good, bad, damaged = lab.start(["ly-cp", "ly-good", liar, "ly-man"])
    inventory = write_inventory(tmp_path / "inv.yaml", [server, good, bad, damaged],
                                extra={"k3s": {"airgap": str(airgap)}})
    state = tmp_path / "state"

    facts = run_bootstrap("facts", inventory, timeout=300)
    assert_clean(facts, what="facts")
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "\\x1b" in facts.stdout, "the liar's os name is shown, its escapes made visible"

    # The liar's step fails with hostile output; the other three converge.
    up = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert_clean(up, what="up")
    assert up.returncode != 0, up.stdout + up.stderr
    assert "ly-bad" in up.stdout + up.stderr
    assert "\\x1b]52;c;" in up.stdout + up.stderr, "the failed step's output is shown, made visible"
    for host in (server, good, damaged):
        unit = "k3s" if host is server else "k3s-agent"
        assert host.ssh(f"systemctl is-active {unit}", check=False).stdout.strip() == "active", host.name

    # An agent rewrites the tool's manifest with the wrong types.
    damaged.ssh("printf '%s' '{\"cluster_id\": null, \"files\": [{}]}' > /var/lib/bootstrap/manifest.json",
                user="root")
    status = run_bootstrap("status", inventory, timeout=300)
    assert_clean(status, what="status")
    assert "ly-good" in status.stdout and "ly-cp" in status.stdout

    # The server offers a kubeconfig whose user runs a command on this machine.
    k3s_yaml = yaml.safe_load(server.ssh("cat /etc/rancher/k3s/k3s.yaml", user="root").stdout)
    k3s_yaml["users"][0]["user"]["exec"] = {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "/bin/sh",
        "args": ["-c", f"touch {marker}"], "interactiveMode": "Never"}
    hostile = json.dumps(k3s_yaml)  # JSON is YAML; one line, safe inside single quotes
    assert "'" not in hostile
    server.ssh(f"printf '%s' '{hostile}' > /etc/rancher/k3s/k3s.yaml", user="root")
    (state / "kubeconfig").unlink()
    fetched = run_bootstrap("kubeconfig", inventory, timeout=300)
    assert_clean(fetched, what="kubeconfig")
    assert fetched.returncode != 0, fetched.stdout + fetched.stderr
    assert "exec" in fetched.stderr, fetched.stderr
    assert not (state / "kubeconfig").exists()

    again = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert_clean(again, what="second up")
    assert again.returncode != 0
    assert "ly-man" in again.stdout + again.stderr  # its manifest is named, not a crash
    assert not marker.exists(), "the server's exec plugin ran on the operator's machine"

    down = run_bootstrap("down", inventory, "--yes", timeout=600)
    assert_clean(down, what="down")
    assert down.returncode != 0, down.stdout + down.stderr
    assert "ly-man" in down.stderr
    for host in (server, good):
        unit = "k3s" if host is server else "k3s-agent"
        assert host.ssh(f"systemctl is-active {unit}", check=False).stdout.strip() != "active", host.name
    assert not marker.exists(), "the server's exec plugin ran on the operator's machine"
