"""A host's change command has a deadline (issue 32, item 17): an sshd that keeps the channel
open, never sending the command's end, held `up`, and the cluster's lock, for ever. Now that
host fails when its deadline passes, with a message, and the other hosts finish. Real
paramiko on both ends (tests/sshpair.py); the hosts' answers are the test's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sshpair import Host, SshPairs, echo

from bootstrap.remote import remote_output
from bootstrap.remote_data import RemoteDataError

TESTS = Path(__file__).resolve().parents[2]
SLACK_S = remote_output.POLL_S + 3  # a wait wakes each POLL_S to look at the clock


def never_ends(command: bytes, stdin: bytes):
    return None  # reads its stdin, then neither answers nor closes


class EndsItsOutputOnly(Host):
    """Sends the output's end (EOF) and nothing more: no exit status, the channel open."""

    def _answer(self, channel, command: bytes) -> None:
        while channel.recv(65536):
            pass
        channel.sendall(b"almost done\n")
        channel.shutdown_write()
        self.released.wait(3600)


@pytest.fixture
def pairs():
    made = SshPairs()
    yield made
    made.close()


def write(data: bytes):
    return lambda stream: stream.write(data)


@pytest.mark.parametrize("host, size", [
    pytest.param(lambda: Host(never_ends), 1024, id="reads its input, never ends"),
    # it takes what fits its channel's window (paramiko's: 2 MiB), which buys it 2 s more
    pytest.param(lambda: Host(never_ends, reads_stdin=False), 8 << 20, id="never reads its input"),
    pytest.param(lambda: EndsItsOutputOnly(), 1024, id="ends its output, never its command"),
])
def test_a_change_whose_channel_stays_open_fails_at_its_deadline(pairs, host, size):
    client = pairs.connect(host())
    started = time.monotonic()
    with pytest.raises(RemoteDataError, match=r"the host's change had not ended after [0-9]+ s \(the host kept "
                                              r"its channel open\): given up on this host") as caught:
        remote_output.run_with_input(client, "sh -c 'tar x'", write(b"x" * size), timeout=1)
    allowed = int(re.search(r"after ([0-9]+) s", str(caught.value)).group(1))
    assert allowed == 1 + size // remote_output.INPUT_BYTES_PER_S if size < 1 << 20 else 2 <= allowed <= 3
    assert time.monotonic() - started < allowed + SLACK_S


def test_the_deadline_grows_with_the_input_the_host_takes(pairs):
    """A second more per MiB taken (INPUT_BYTES_PER_S): a large archive on a slow link is no
    host that hangs."""
    client = pairs.connect(Host(never_ends))
    with pytest.raises(RemoteDataError, match=r"had not ended after 3 s"):
        remote_output.run_with_input(client, "sh -c 'tar x'", write(b"x" * (2 << 20)), timeout=1)


def test_a_change_that_ends_in_time_is_as_before(pairs):
    client = pairs.connect(Host(echo))
    status, stdout, stderr = remote_output.run_with_input(client, "sh -c 'tar x'", write(b"files"), timeout=5)
    assert (status, stdout, stderr) == (0, b"ran sh -c 'tar x' with files", b"")


# The executor on gevent with pyinfra's own SSH connector, as `up` runs it (bootstrap.cli
# patches before paramiko is used): a process of its own, since patching is process-wide.
STEPS_ON_GEVENT = r"""
from gevent import monkey
monkey.patch_all()
import io, json, sys, time
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
import paramiko
from pyinfra.api import Config, Inventory, State, StringCommand
from sshpair import Host, SshPairs, echo
from test_change_deadline import EndsItsOutputOnly, never_ends
from bootstrap.host.plan.steps import Step
from bootstrap.progress import JsonReporter
from bootstrap.remote import executor

pairs = SshPairs()
hosts = {"10.0.0.1": Host(never_ends), "10.0.0.2": EndsItsOutputOnly(), "10.0.0.3": Host(echo)}
names = {"late": "10.0.0.1", "eof": "10.0.0.2", "fine": "10.0.0.3"}

def connect(client, hostname, *args, **kwargs):
    client._transport = pairs.connect(hosts[hostname]).transport

paramiko.SSHClient.connect = connect
state = State(Inventory(([(name, {"ssh_hostname": address, "ssh_known_hosts_file": "/dev/null",
                                  "ssh_strict_host_key_checking": "accept-new"})
                          for name, address in names.items()], {})), Config())
for host in state.inventory:
    host.connect(raise_exceptions=True)

class Session:
    pyinfra_state, reporter, failures = state, JsonReporter(io.StringIO()), {}
    def active_nodes(self):
        return [SimpleNamespace(name=n) for n in names]
    def fail(self, name, message, hint=None, *, bad_answer=False):
        self.failures.setdefault(name, message)

session = Session()
started = time.monotonic()
results = executor.execute(session, [Step("change", {n: [StringCommand("true")] for n in names})], deadline_s=1)
print(json.dumps({"seconds": time.monotonic() - started, "failures": session.failures,
                  "status": {n: results[n]["change"].status for n in names}}))
"""


def test_one_hosts_command_past_its_deadline_fails_that_host_and_the_others_finish():
    proc = subprocess.run([sys.executable, "-c", STEPS_ON_GEVENT, str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=60, cwd=TESTS.parent, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["status"] == {"late": "failed", "eof": "failed", "fine": "changed"}
    for name in ("late", "eof"):
        assert out["failures"][name] == ("change: the command had not ended after 1 s (the host kept its "
                                         "channel open): given up on this host")
    assert out["seconds"] < 1 + SLACK_S


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
