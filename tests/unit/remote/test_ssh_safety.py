"""SSH safety without test hosts: inventory strings never become ssh_config, no secret on a
command line, known_hosts replaced atomically, a silent port named with its time-out."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from clirun import run_bootstrap

from bootstrap.remote import hostkeys

# Builds an inventory in Python (past the checker, as a bug in it would let through) and
# opens a session over it, as every host command does.
HOSTILE_SESSION = """
import sys
from gevent import monkey
monkey.patch_all()
from dataclasses import replace
from bootstrap.remote.session import HostSession
from bootstrap.inventory.loader import parse_inventory
from bootstrap.state.folder import StateDir

state, address, jump = sys.argv[1:4]
inventory = parse_inventory(
    "cluster: hostile\\nstate_dir: " + state + "\\nssh: {user: ubuntu, connect_timeout: 2}\\n"
    "nodes: [{name: cp-1, address: 127.0.0.1, role: server}]\\n")
node = replace(inventory.nodes[0], address=address, ssh={"jump": jump})
inventory = replace(inventory, nodes=(node,))
with HostSession(inventory, StateDir(inventory)) as session:
    print(sorted(session.failures))
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where", ["address", "jump"])
def test_hostile_inventory_strings_run_nothing_locally_and_write_no_ssh_config(tmp_path, where):
    marker = tmp_path / "pwned"
    payload = f"\nHost *\n  ProxyCommand touch {marker}\n  ProxyJump x"
    address = "fe80::1%x" + payload if where == "address" else "127.0.0.1"
    jump = f"ubuntu@127.0.0.1:{closed_port()}" + (payload if where == "jump" else "")
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-c", HOSTILE_SESSION, str(state), address, jump],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "['cp-1']" in proc.stdout  # the host failed, as it should
    assert not marker.exists()
    assert not (state / "ssh_config").exists() and list(state.glob("*ssh_config*")) == []


def test_sudo_goes_through_sudo_n_and_the_password_stays_out_of_commands(tmp_path, monkeypatch):
    from pyinfra.api import Config, Inventory as PyInventory, State, StringCommand
    from pyinfra.api.arguments import pop_global_arguments
    from pyinfra.connectors.util import make_unix_command_for_host

    from bootstrap.remote.session import host_data
    from bootstrap.inventory.loader import parse_inventory
    from bootstrap.state.folder import StateDir

    monkeypatch.setenv("LAB_SSH_PASSWORD", "hunter2-Secret")
    inventory = parse_inventory(
        f"cluster: pw\nstate_dir: {tmp_path}\nssh: {{user: ubuntu, password_env: LAB_SSH_PASSWORD}}\n"
        "nodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n", str(tmp_path / "inv.yaml"))
    data = host_data(inventory, StateDir(inventory), inventory.nodes[0])
    assert data["ssh_password"] == "hunter2-Secret"  # SSH login still uses it
    assert [k for k, v in data.items() if "hunter2" in repr(v)] == ["ssh_password"]
    state = State(PyInventory(([("cp-1", data)], {})), Config())
    host = state.inventory.get_host("cp-1")
    arguments, _ = pop_global_arguments(state, host, {})
    connector_arguments = {k: v for k, v in arguments.items() if k.startswith(("_sudo", "_su_", "_use_"))}
    command = make_unix_command_for_host(state, host, StringCommand("true"), **connector_arguments)
    text = command.get_raw_value()
    assert "sudo -H -n" in text and "hunter2" not in text and "ASKPASS" not in text


def test_known_hosts_is_replaced_atomically_and_stays_private(tmp_path):
    import paramiko

    known = tmp_path / "known_hosts"
    key_a, key_b = paramiko.RSAKey.generate(1024), paramiko.RSAKey.generate(1024)
    hostkeys.pin(known, "10.0.0.1", key_a)
    first = known.stat()
    assert oct(first.st_mode & 0o777) == "0o600"
    hostkeys.pin(known, "[10.0.0.2]:2222", key_b)
    hostkeys.pin(known, "10.0.0.1", key_a)  # already pinned: one line each
    assert known.stat().st_ino != first.st_ino  # a new file took its place, never rewritten in place
    assert len(known.read_text().splitlines()) == 2
    before = known.stat().st_ino
    assert hostkeys.forget(known, "10.0.0.2", 2222)
    assert known.stat().st_ino != before and oct(known.stat().st_mode & 0o777) == "0o600"
    assert paramiko.HostKeys(str(known)).lookup("10.0.0.1") is not None
    assert "10.0.0.2" not in known.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["known_hosts"]  # no temp file left


def test_forget_finds_a_hashed_entry_as_openssh_and_paramiko_hash_it(tmp_path):
    import paramiko

    known = tmp_path / "known_hosts"
    key = paramiko.RSAKey.generate(1024)
    hashed = paramiko.HostKeys.hash_host("[10.0.0.3]:2222")
    known.write_text(f"{hashed} {key.get_name()} {key.get_base64()}\n"
                     f"{paramiko.HostKeys.hash_host('10.0.0.4')} {key.get_name()} {key.get_base64()}\n"
                     "# a comment\n|1|not base64!|x ssh-rsa AAAA\n")
    assert not hostkeys.forget(known, "10.0.0.3", 22)  # another port: another entry
    assert hostkeys.forget(known, "10.0.0.3", 2222)
    assert hashed not in known.read_text() and len(known.read_text().splitlines()) == 3


def test_merging_keys_from_a_session_file_keeps_each_line_once(tmp_path):
    known, session = tmp_path / "known_hosts", tmp_path / "session"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA1\n")
    session.write_text("10.0.0.1 ssh-ed25519 AAAA1\n10.0.0.2 ssh-ed25519 AAAA2\n10.0.0.2 ssh-ed25519 AAAA2\n")
    hostkeys.merge(known, session.read_text())
    assert known.read_text() == "10.0.0.1 ssh-ed25519 AAAA1\n10.0.0.2 ssh-ed25519 AAAA2\n"


class SilentListener:
    """Accepts TCP connections and never says a word (a hung sshd, a half-open firewall)."""

    def __init__(self, accept: bool = True):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0 if not accept else 16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        if accept:
            threading.Thread(target=self._accept, daemon=True).start()
        else:  # fill the accept queue: the kernel then drops new SYNs, as a DROP rule does
            for _ in range(3):
                c = socket.socket()
                c.setblocking(False)
                c.connect_ex(("127.0.0.1", self.port))
                self.held.append(c)
            time.sleep(0.2)

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self):
        for c in self.held:
            c.close()
        self.sock.close()


def silent_inventory(tmp_path, port: int):
    path = tmp_path / "inv.yaml"
    path.write_text(f"cluster: silent\nstate_dir: {tmp_path / 'state'}\n"
                    f"ssh: {{user: ubuntu, port: {port}, connect_timeout: 2}}\n"
                    "nodes: [{name: cp-1, address: 127.0.0.1, role: server}]\n")
    return path


@pytest.mark.parametrize("accept", [True, False], ids=["accepts-never-speaks", "never-accepts"])
def test_silent_ssh_port_is_named_with_its_timeout(tmp_path, accept):
    listener = SilentListener(accept=accept)
    try:
        inventory = silent_inventory(tmp_path, listener.port)
        started = time.monotonic()
        result = run_bootstrap("facts", inventory, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    assert result.returncode == 1
    assert f"no SSH answer from 127.0.0.1:{listener.port} in 2 s" in result.stderr, result.stderr
    assert "No existing session" not in result.stderr and "Traceback" not in result.stderr
    assert elapsed < 2 + 6, elapsed  # the time-out once (plus start-up), not per retry or paramiko's 15 s


def test_silent_ssh_port_through_the_tunnel_is_named_with_its_timeout(tmp_path):
    from bootstrap.remote.tunnel import TunnelError, connect_ssh
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    listener = SilentListener()
    try:
        inventory = load_inventory(silent_inventory(tmp_path, listener.port))
        started = time.monotonic()
        with pytest.raises(TunnelError) as caught:
            connect_ssh(inventory, inventory.nodes[0], StateDir(inventory))
        elapsed = time.monotonic() - started
    finally:
        listener.close()
    assert f"no SSH answer from 127.0.0.1:{listener.port} in 2 s" in str(caught.value)
    assert elapsed < 4, elapsed


def test_plan_names_unreachable_hosts_instead_of_resolving_the_channel(tmp_path):
    path = tmp_path / "inv.yaml"  # no k3s.version: the channel would be resolved online
    path.write_text(f"cluster: gone\nstate_dir: {tmp_path / 'state'}\n"
                    f"ssh: {{user: ubuntu, port: {closed_port()}, connect_timeout: 2}}\n"
                    "nodes: [{name: cp-1, address: 127.0.0.1, role: server}]\n")
    result = run_bootstrap("plan", path, env={"https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"})
    assert result.returncode == 1
    assert "cannot resolve k3s channel" not in result.stdout + result.stderr
    assert "FAILED cp-1: cannot connect to SSH at 127.0.0.1" in result.stderr, result.stderr


def test_pyinfra_never_prompts_for_a_sudo_password_to_put_on_a_command_line():
    """pyinfra re-runs a command with the password in its environment after a prompt; the
    session answers the prompt with nothing, so the re-run fails as sudo -n did."""
    from pyinfra.connectors import util

    from bootstrap.remote.pyinfra_link import never_prompt_for_sudo

    never_prompt_for_sudo()
    calls = []

    class Line:
        line = "sudo: a password is required"

    class Output:
        combined_lines = [Line()]

    class Host:
        print_prefix = "[gpu-1] "
        connector_data: dict = {}

    def execute():
        calls.append(Host.connector_data.get("prompted_sudo_password"))
        return 1, Output()

    code, _ = util.execute_command_with_sudo_retry(Host(), {}, execute)
    assert code == 1 and calls == [None, ""]
    assert not Host.connector_data["prompted_sudo_password"]
