"""A command's output from a rented host as untrusted bytes: capped, with a deadline.

pyinfra hands a command's output over as text its SSH layer decoded as strict UTF-8: one byte
that is not UTF-8 kills the reader mid-output (and a filter on the host, such as `tr`, runs
where the host's operator decides what it does). So what the tool parses from a host is
read here instead, over the session's own SSH connection, as bytes: stderr merged into
stdout, at most `max_bytes` kept, the channel closed at the deadline. The parsers decode it
(invalid UTF-8 becomes U+FFFD) and never trust it.
"""

from __future__ import annotations

import shlex
import socket
import threading
import time

from bootstrap.remote import channels
from bootstrap.remote.sshlink import SSH_ERRORS
from bootstrap.remote_data import RemoteDataError

CHUNK = 65536
POLL_S = 2.0  # how often a silent channel is checked against the deadline
# A root script's output is kept for its failure's line and the run log: its last 64 KiB per
# stream (a host that floods costs the channel's reading, not the operator's memory).
TAIL_BYTES = 64 * 1024


def sh_command(script: str) -> str:
    """`script` run by POSIX sh, as pyinfra runs a fact whose shell_executable is sh."""
    return f"sh -c {shlex.quote(script)}"


def read_command(client, command: str, *, max_bytes: int, timeout: float, what: str) -> bytes:
    """Run `command` on the host behind paramiko `client` and return its output (stdout and
    stderr together) as bytes, whatever its exit status. RemoteDataError when it prints more
    than `max_bytes` or has not finished after `timeout` seconds: that host's failure, with
    the reason."""
    return run_command(client, command, max_bytes=max_bytes, timeout=timeout, what=what)[1]


def run_command(client, command: str, *, max_bytes: int, timeout: float, what: str,
                stdin: bytes = b"") -> tuple[int, bytes]:
    """As read_command, with the command's exit status: (status, output). `stdin`: what the
    command reads (a secret goes there, never on its command line); a host that stops reading
    it fails the command like one that stops answering."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise RemoteDataError(f"{what}: the SSH connection is closed")
    channel = channels.session_channel(transport, timeout)
    try:
        channel.set_combine_stderr(True)  # one stream: a flood on stderr cannot stall stdout
        channel.settimeout(POLL_S)
        channels.start(channel, transport, command, timeout)
        deadline = time.monotonic() + timeout
        if stdin:
            _send_all(channel, stdin, deadline, timeout, what)
        channel.shutdown_write()
        output = _read_all(channel, max_bytes, deadline, timeout, what)
        # The status follows the output's end; a host that withholds it is as late as one
        # that keeps printing.
        if not channel.status_event.wait(max(deadline - time.monotonic(), 0)):
            raise RemoteDataError(f"{what} did not finish in {timeout:.0f} s")
        return channel.recv_exit_status(), output
    finally:
        channel.close()


def _send_all(channel, data: bytes, deadline: float, timeout: float, what: str) -> None:
    """`data` on the channel's stdin, as far as the host takes it before the deadline."""
    view = memoryview(data)
    while view:
        if time.monotonic() > deadline:
            raise RemoteDataError(f"{what} did not finish in {timeout:.0f} s")
        try:
            view = view[channel.send(view[:CHUNK]):]
        except socket.timeout:
            continue


def _read_all(channel, max_bytes: int, deadline: float, timeout: float, what: str) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise RemoteDataError(f"{what} did not finish in {timeout:.0f} s")
        try:
            data = channel.recv(CHUNK)
        except socket.timeout:
            continue
        if not data:
            return b"".join(chunks)
        size += len(data)
        if size > max_bytes:
            raise RemoteDataError(f"{what} printed more than {_size(max_bytes)}")
        chunks.append(data)


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count // 1024} KiB"


def run_with_input(client, command: str, write_input, *, tail_bytes: int = TAIL_BYTES) -> tuple[int, bytes, bytes]:
    """Run `command` on the host behind paramiko `client`, `write_input(stream)` writing its
    stdin (stream.write(bytes)), while its stdout and stderr are read apart, each in its own
    thread (a greenlet under gevent), so a command that prints while it reads never stalls.
    (status, last `tail_bytes` of stdout, of stderr). No deadline: a host change takes as
    long as its own time-outs allow. A command that ends before reading all of its input
    (tar failed, disk full) is not an error here: its status and output say why."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise RemoteDataError("the SSH connection is closed")
    channel = channels.session_channel(transport, 60)
    try:
        channels.start(channel, transport, command, 60)
        stdout, stderr = _Tail(tail_bytes), _Tail(tail_bytes)
        readers = [threading.Thread(target=_drain, args=(channel.recv, stdout), daemon=True),
                   threading.Thread(target=_drain, args=(channel.recv_stderr, stderr), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            write_input(_ChannelWriter(channel))
        except SSH_ERRORS:
            pass  # the command stopped reading: its output says why
        finally:
            try:
                channel.shutdown_write()
            except SSH_ERRORS:
                pass
        for reader in readers:
            reader.join()
        return channel.recv_exit_status(), stdout.value(), stderr.value()
    finally:
        channel.close()


class _ChannelWriter:
    """The write() a tar stream needs, over a channel's stdin."""

    def __init__(self, channel):
        self.channel = channel

    def write(self, data: bytes) -> int:
        self.channel.sendall(data)
        return len(data)


class _Tail:
    def __init__(self, keep: int):
        self.keep, self.data = keep, b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.keep:]

    def value(self) -> bytes:
        return self.data


def _drain(receive, tail: _Tail) -> None:
    try:
        while True:
            chunk = receive(CHUNK)
            if not chunk:
                return
            tail.add(chunk)
    except SSH_ERRORS:
        return  # the connection went: the exit status says so (-1)
