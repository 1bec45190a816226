"""A host's next command finds its SSH channel already open (bootstrap.remote.channels).

Real paramiko on both ends, in-process, over a link that delays every byte by half of
RTT_S each way (latency, not bandwidth: a far host). A command that opens its own channel
pays a round trip more than one that finds it open (open, then exec and its answer).
"""

from __future__ import annotations

import queue
import socket
import threading
import time

import paramiko
import pytest

from bootstrap.remote import channels
from bootstrap.remote.remote_output import run_command

RTT_S = 0.4


def _delayed(source: socket.socket, sink: socket.socket) -> None:
    """Forward source -> sink, each chunk RTT_S / 2 after it was read (in order)."""
    chunks: queue.Queue = queue.Queue()

    def read():
        while data := _recv(source):
            chunks.put((time.monotonic() + RTT_S / 2, data))
        chunks.put((0, b""))

    def write():
        while True:
            due, data = chunks.get()
            try:
                if not data:
                    return sink.shutdown(socket.SHUT_WR)
                time.sleep(max(0.0, due - time.monotonic()))
                sink.sendall(data)
            except OSError:
                return  # the test closed its end

    for target in (read, write):
        threading.Thread(target=target, daemon=True).start()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


class _Server(paramiko.ServerInterface):
    def __init__(self, refuse_after: int | None = None):
        self.opened, self.commands, self.refuse_after = 0, [], refuse_after

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        self.opened += 1
        if self.refuse_after is not None and self.opened > self.refuse_after:
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.commands.append(command)
        threading.Thread(target=self._answer, args=(channel, command), daemon=True).start()
        return True

    @staticmethod
    def _answer(channel, command):
        time.sleep(0.05)  # after the transport's reply to the exec request (this runs beside it)
        channel.sendall(b"ran " + command)
        channel.send_exit_status(0)
        channel.close()


class _Client:
    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport


@pytest.fixture
def connection():
    made = []

    def connect(server: _Server):
        near, near_link = socket.socketpair()
        far_link, far = socket.socketpair()
        _delayed(near_link, far_link)
        _delayed(far_link, near_link)
        host = paramiko.Transport(far)
        host.add_server_key(paramiko.RSAKey.generate(1024))
        host.start_server(event=threading.Event(), server=server)  # negotiates in its own thread
        client = paramiko.Transport(near)
        client.start_client(timeout=10)
        client.auth_none("lab")
        made.extend([client, host])
        return _Client(client)

    yield connect
    for transport in made:
        transport.close()


def run(client, command: str) -> tuple[float, bytes]:
    started = time.monotonic()
    status, output = run_command(client, command, max_bytes=1024, timeout=10, what=command)
    assert status == 0
    return time.monotonic() - started, output


def test_the_next_command_takes_the_channel_opened_while_the_last_one_ran(connection):
    server = _Server()
    client = connection(server)
    first, output = run(client, "probe")
    assert output == b"ran probe" and first >= 2 * RTT_S  # open; exec and its answer: nothing opened ahead
    time.sleep(RTT_S + 0.2)  # the command after it comes later (the plans are made meanwhile)
    second, output = run(client, "change")
    assert output == b"ran change"
    assert RTT_S <= second < 2 * RTT_S, second  # exec and its answer only
    assert server.commands == [b"probe", b"change"]
    assert server.opened == 3  # one for each command, one ahead for the next (never more than one)


def test_a_channel_still_opening_is_waited_for_not_opened_twice(connection):
    server = _Server()
    client = connection(server)
    run(client, "probe")
    run(client, "change")  # at once: the channel ahead is still opening
    time.sleep(RTT_S + 0.2)
    assert server.opened == 3


def test_a_refused_channel_ahead_leaves_the_command_to_open_its_own_and_fail_as_before(connection):
    server = _Server(refuse_after=1)
    client = connection(server)
    run(client, "probe")
    time.sleep(RTT_S + 0.2)
    with pytest.raises(paramiko.ChannelException):
        run(client, "change")  # the host refuses channels now: the command's own open says so
    assert server.commands == [b"probe"]


def test_a_channel_ahead_the_host_closed_is_not_used(connection):
    server = _Server()
    client = connection(server)
    run(client, "probe")
    time.sleep(RTT_S + 0.2)
    ahead = channels._ahead[client.transport]
    ahead.channel.close()
    _, output = run(client, "change")
    assert output == b"ran change" and server.opened == 4


def test_nothing_is_opened_ahead_on_a_closed_connection(connection):
    client = connection(_Server())
    client.transport.close()
    channels.open_ahead(client.transport)
    assert client.transport not in channels._ahead
