"""The CA hash the state folder keeps is never trusted forever (issue 32, item 7): after a CA
rotation every join naming the old hash is refused ("token CA hash does not match the Cluster
CA certificate hash", k3s-io/k3s pkg/clientaccess/token.go, validateCAHash). A run that joins a
node asks the server again first; a join refused anyway makes the tool read it again, keep it
and say so."""

import contextlib
import hashlib
import io
import subprocess
from dataclasses import replace

import yaml
from sandbox import k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_host_phase_flow import healthy_host
from test_join_tokens import VERSION, JoinSession, inventory_of

from bootstrap import progress
from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.host.facts.host_facts import FileState, K3sInstall, SystemdUnit
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.host.parts.k3s_service import CONFIG
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.join_tokens import CA_HASH_REFUSED, JoinTokens
from bootstrap.remote.interface import HostFailure
from bootstrap.state.folder import StateDir
from bootstrap.deploys.converge import wait_for_service_script

OLD = "01d" + "0" * 61  # the hash kept in the state folder
NEW = "5e7" + "0" * 61  # the first server's after `k3s certificate rotate-ca`
SERVER, AGENT = "server-secret-0123", "agent-secret-4567"


def rotated_cluster(k3s, tmp_path, running_server=True):
    """cp-1 and a1 run, configured with the kept hash; a2 is new and joins in this run."""
    inv = inventory_of(tmp_path, k3s, servers=1, agents=2)
    state = StateDir(inv)
    for name, text in (("token", SERVER), ("agent-token", AGENT), ("ca-hash", OLD)):
        state.write_secret(name, text + "\n")
    sha = hashlib.sha256(k3s.read_bytes()).hexdigest()
    kept = JoinTokens(SERVER, AGENT, OLD)
    facts = {"a2": replace(healthy_host("a2"), gpus=[])}
    for node in inv.nodes[:2]:
        unit = "k3s" if node.name == "cp-1" else "k3s-agent"
        config = k3sconfig.render(k3sconfig.node_config(inv, node, kept))
        active = running_server or node.name != "cp-1"
        facts[node.name] = replace(healthy_host(node.name), gpus=[],
                                   manifest={"cluster_id": state.cluster_id, "cluster": "t"},
                                   files={K3S_BINARY: FileState(0o755, sha),
                                          CONFIG: FileState(0o600, hashlib.sha256(config.encode()).hexdigest())},
                                   k3s=K3sInstall(K3S_BINARY, VERSION, True, [SystemdUnit(
                                       f"{unit}.service", "loaded", "active" if active else "inactive", "enabled")]))
    return inv, state, facts


def up(inv, state, session) -> str:
    out = io.StringIO()
    with contextlib.suppress(Exception), contextlib.redirect_stderr(out):
        bring_up(inv, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter(out)),
                 open_session=lambda *a: contextlib.nullcontext(session))
    return " ".join(out.getvalue().split())


def test_a_join_asks_the_server_for_its_hash_first_and_uses_the_rotated_one(k3s, tmp_path):  # noqa: F811
    inv, state, facts = rotated_cluster(k3s, tmp_path)
    session = JoinSession(inv, facts, state, token_file=f"K10{NEW}::server:{SERVER}\n")
    said = up(inv, state, session)
    assert session.token_reads == 1
    assert f"the cluster CA's hash kept in the state folder ({OLD[:12]}...) is not the one cp-1 has now " \
           f"({NEW[:12]}...): the CA was rotated" in said
    assert (state.path / "ca-hash").read_text().strip() == NEW
    assert yaml.safe_load(session.configs["a2"])["token"] == f"K10{NEW}::node:{AGENT}"
    # a1 runs on the old hash, which its next start would be refused with: it gets the new one
    assert yaml.safe_load(session.configs["a1"])["token"] == f"K10{NEW}::node:{AGENT}"


def test_a_run_where_nothing_joins_does_not_ask(k3s, tmp_path):  # noqa: F811
    """Only the first server (the one the hash is read from) in this run: no round trip for it."""
    inv, state, facts = rotated_cluster(k3s, tmp_path)
    inv = replace(inv, nodes=inv.nodes[:1])
    session = JoinSession(inv, {"cp-1": facts["cp-1"]}, state, token_file=f"K10{NEW}::server:{SERVER}\n")
    up(inv, state, session)
    assert session.executed and session.token_reads == 0 and (state.path / "ca-hash").read_text().strip() == OLD


class RefusingSession(JoinSession):
    """a2's start fails as the wait reports it when k3s refused the join for its CA hash."""

    def execute(self, steps, after=None):
        result = super().execute(steps, after)
        if any("a2" in s.commands for s in steps):
            self.failures.setdefault("a2", HostFailure(
                "a2", f"join agents: level=error msg=\"Failed to validate connection to cluster at "
                      f"https://10.0.0.1:6443: {CA_HASH_REFUSED}: {OLD} != {NEW}\""))
        return result


def test_a_refused_join_reads_the_hash_again_keeps_it_and_says_so(k3s, tmp_path):  # noqa: F811
    """cp-1 restarts in this run (its k3s was not running when planned): a2 joins with the
    kept hash and is refused; the server's own hash is read again and kept for the next run."""
    inv, state, facts = rotated_cluster(k3s, tmp_path, running_server=False)
    session = RefusingSession(inv, facts, state, token_file=f"K10{NEW}::server:{SERVER}\n")
    said = up(inv, state, session)
    assert f"a2: their join was refused for the cluster CA's hash ({OLD[:12]}...); read again from cp-1: " \
           f"{NEW[:12]}... (the CA was rotated), kept in the state folder: run `bootstrap up` again" in said
    assert (state.path / "ca-hash").read_text().strip() == NEW


def test_a_refusal_while_the_server_keeps_its_hash_names_an_impostor(k3s, tmp_path):  # noqa: F811
    inv, state, facts = rotated_cluster(k3s, tmp_path, running_server=False)
    session = RefusingSession(inv, facts, state, token_file=f"K10{OLD}::server:{SERVER}\n")
    said = up(inv, state, session)
    assert "a2: their join was refused for the cluster CA's hash, which cp-1 still has: the server they " \
           "reached at its address is not this cluster's" in said
    assert (state.path / "ca-hash").read_text().strip() == OLD


def test_the_start_wait_ends_on_k3s_refusal_and_names_it_last(tmp_path):
    """An agent refused for the CA hash retries forever and never becomes active: the wait stops
    when the unit's journal says so, and that line (a hash, no secret) is the reason given."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {
        "systemctl": "case \"$1\" in show) case \"$3\" in ActiveState) echo activating;; SubState) echo start;; "
                     "*) echo;; esac;; esac; exit 0",
        "journalctl": f"echo 'level=info msg=\"Starting k3s agent\"'; echo 'level=error msg=\"Failed to validate "
                      f"connection to cluster at https://10.0.0.1:6443: {CA_HASH_REFUSED}: {OLD} != {NEW}\"'",
        "sleep": "exit 0", "date": "echo 1700000000"}
    for name, body in scripts.items():
        (fake / name).write_text("#!/bin/sh\n" + body + "\n")
        (fake / name).chmod(0o755)
    done = subprocess.run(["sh", "-c", wait_for_service_script("k3s-agent", "start", timeout=300)],
                          env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "k3s-agent did not become active (activating after 4s)" in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"{CA_HASH_REFUSED}: {OLD} != {NEW}\"")
