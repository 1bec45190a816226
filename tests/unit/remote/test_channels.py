"""A host's next command finds its SSH channel already open (bootstrap.remote.channels).

Real paramiko on both ends, in-process, over a link that delays every byte by half of
RTT_S each way (latency, not bandwidth: a far host). A command that opens its own channel
pays a round trip more than one that finds it open (open, then exec and its answer).
"""

from __future__ import annotations

import time

import paramiko
import pytest
from sshpair import Host, SshPairs

from bootstrap.remote import channels
from bootstrap.remote.remote_output import run_command

RTT_S = 0.4


@pytest.fixture
def connection():
    pairs = SshPairs()
    yield lambda host: pairs.connect(host, rtt_s=RTT_S)  # (commands that do not read stdin, as the probe)
    pairs.close()


def run(client, command: str) -> tuple[float, bytes]:
    started = time.monotonic()
    status, output = run_command(client, command, max_bytes=1024, timeout=10, what=command)
    assert status == 0
    return time.monotonic() - started, output


def test_the_next_command_takes_the_channel_opened_while_the_last_one_ran(connection):
    server = Host(reads_stdin=False)
    client = connection(server)
    first, output = run(client, "probe")
    assert output == b"ran probe" and first >= 2 * RTT_S  # open; exec and its answer: nothing opened ahead
    time.sleep(RTT_S + 0.2)  # the command after it comes later (the plans are made meanwhile)
    second, output = run(client, "change")
    assert output == b"ran change"
    assert RTT_S <= second < 2 * RTT_S, second  # exec and its answer only
    assert server.commands == [b"probe", b"change"]
    time.sleep(RTT_S)  # the next one's opening leaves once the command's exec is out: it arrives now
    assert server.opened == 3  # one for each command, one ahead for the next (never more than one)


def test_a_channel_still_opening_is_waited_for_not_opened_twice(connection):
    server = Host(reads_stdin=False)
    client = connection(server)
    run(client, "probe")
    run(client, "change")  # at once: the channel ahead is still opening
    time.sleep(RTT_S + 0.2)
    assert server.opened == 3


def test_a_refused_channel_ahead_leaves_the_command_to_open_its_own_and_fail_as_before(connection):
    server = Host(refuse_after=1, reads_stdin=False)
    client = connection(server)
    run(client, "probe")
    time.sleep(RTT_S + 0.2)
    with pytest.raises(paramiko.ChannelException):
        run(client, "change")  # the host refuses channels now: the command's own open says so
    assert server.commands == [b"probe"]


def test_a_channel_ahead_the_host_closed_is_not_used(connection):
    server = Host(reads_stdin=False)
    client = connection(server)
    run(client, "probe")
    time.sleep(RTT_S + 0.2)
    ahead = channels._ahead[client.transport]
    ahead.channel.close()
    _, output = run(client, "change")
    time.sleep(RTT_S)  # (the opening after it, on its way)
    assert output == b"ran change" and server.opened == 4


def test_nothing_is_opened_ahead_on_a_closed_connection(connection):
    client = connection(Host(reads_stdin=False))
    client.transport.close()
    channels.open_ahead(client.transport)
    assert client.transport not in channels._ahead


def test_a_host_that_stops_answering_channel_openings_costs_the_command_its_time_out_once(connection):
    """The channel opened ahead is still unanswered when the command comes: the command
    waits for it up to its own time-out and fails then, without asking again (a second
    opening would wait as long once more)."""
    client = connection(Host(reads_stdin=False, stall_after=1))
    run(client, "probe")  # opens #1; once its exec is out, #2 goes ahead: never answered
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout opening channel"):
        run_command(client, "start", max_bytes=1024, timeout=1.0, what="start")
    assert time.monotonic() - started < 1.8


def test_a_host_that_never_answers_a_commands_start_fails_it_at_its_time_out(connection):
    """paramiko waits for the answer to an exec request without a time-out: the channel is
    closed at the command's time-out instead of the command waiting for ever."""
    client = connection(Host(reads_stdin=False, stall_exec=True))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout starting the command"):
        run_command(client, "probe", max_bytes=1024, timeout=1.0, what="probe")
    assert time.monotonic() - started < 3 * RTT_S + 1.5
