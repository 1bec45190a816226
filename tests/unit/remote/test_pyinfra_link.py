"""What bootstrap.remote.pyinfra_link relies on in the installed pyinfra, pinned: an upgrade
that changes it fails here, not on a host.

(The two process-wide settings are pinned where their behaviour is tested:
tests/unit/remote/test_ssh_safety.py, the sudo prompt; tests/unit/test_remote_data.py, the lenient decoding.)"""

from __future__ import annotations

import io

import paramiko
import pytest
from pyinfra.api import Config, Inventory, State, StringCommand

from bootstrap.remote import pyinfra_link


class _Transport:
    def __init__(self):
        self.sock = None
        self.active = True

    def is_active(self) -> bool:
        return self.active


def _connected_host(monkeypatch, sudo: bool = False):
    """A real pyinfra SSH host, "connected" with paramiko's own connect stubbed out."""
    def connect(client, hostname, *args, **kwargs):
        client._transport = _Transport()

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    state = State(Inventory(([("10.9.9.9", {"ssh_user": "ubuntu", "ssh_known_hosts_file": "/dev/null",
                                            "ssh_strict_host_key_checking": "accept-new", "_sudo": sudo})], {})),
                  Config())
    host = state.inventory.get_host("10.9.9.9")
    host.connect(raise_exceptions=True)
    return state, host


def test_the_paramiko_client_under_pyinfras_ssh_connection_is_found(monkeypatch):
    """pyinfra's SSH connector keeps its paramiko client at `connector.client`: the archive's
    stream, the facts probe, root files, the tunnel and the snapshot use that connection."""
    _, host = _connected_host(monkeypatch)
    client = pyinfra_link.ssh_client(host)
    assert isinstance(client, paramiko.SSHClient) and client is host.connector.client
    client.get_transport().active = False
    assert pyinfra_link.ssh_client(host) is None  # a dropped connection is no connection


def test_a_host_without_a_connection_has_no_client():
    state = State(Inventory((["10.9.9.8"], {})), Config())
    assert pyinfra_link.ssh_client(state.inventory.get_host("10.9.9.8")) is None


@pytest.mark.parametrize("sudo", [True, False])
def test_scripts_run_as_pyinfras_sudo_runs_a_string_command(monkeypatch, sudo):
    """The byte channel's command line is the one pyinfra makes for the same script and host."""
    from pyinfra.connectors.util import make_unix_command_for_host

    state, host = _connected_host(monkeypatch, sudo=sudo)
    script = "set -e\necho 'it''s' \"$x\" > /tmp/y"
    pyinfras = make_unix_command_for_host(state, host, StringCommand(script), _sudo=sudo).get_raw_value()
    assert pyinfra_link.shell_command(host, script) == pyinfras


def test_pyinfras_stdin_takes_text_only():
    """Why the archive has a channel of its own: pyinfra writes `_stdin` as text lines and
    refuses bytes. When this fails, pyinfra takes bytes: the archive could use `_stdin`."""
    from pyinfra.connectors.util import write_stdin

    with pytest.raises(TypeError):
        write_stdin(b"\x00\xff binary tar", io.BytesIO())
    written = io.BytesIO()
    written.close = lambda: None
    write_stdin("line", written)
    assert written.getvalue() == b"line\n"  # a newline added: not a byte stream either
