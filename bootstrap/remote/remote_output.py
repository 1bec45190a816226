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


# A host's change (its files on a root script's stdin, the script's work) has this long, and
# a second more for each MiB of its files the host took: an hour covers the slowest honest
# change we know (packages from a slow mirror, a k3s start importing image archives:
# bootstrap.host.parts.k3s_images.start_timeout, 300 s and 60 s per GiB) with room to spare,
# and a link that carries the files at 1 MiB/s. A host whose sshd keeps the channel open
# without an end fails then, alone; before, it held `up`, and the cluster's lock, for ever.
CHANGE_DEADLINE_S = 3600.0
INPUT_BYTES_PER_S = 1024 * 1024


def run_with_input(client, command: str, write_input, *, tail_bytes: int = TAIL_BYTES,
                   timeout: float = CHANGE_DEADLINE_S, what: str = "the host's change") -> tuple[int, bytes, bytes]:
    """Run `command` on the host behind paramiko `client`, `write_input(stream)` writing its
    stdin (stream.write(bytes)), while its stdout and stderr are read apart, each in its own
    thread (a greenlet under gevent), so a command that prints while it reads never stalls.
    (status, last `tail_bytes` of stdout, of stderr). RemoteDataError when it has not ended
    (output closed and exit status sent) `timeout` seconds after it started, plus a second
    for each INPUT_BYTES_PER_S of input the host took; the channel is closed then. A command
    that ends before reading all of its input (tar failed, disk full) is not an error here:
    its status and output say why."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise RemoteDataError("the SSH connection is closed")
    channel = channels.session_channel(transport, 60)
    try:
        channels.start(channel, transport, command, 60)
        channel.settimeout(POLL_S)  # every wait below wakes to look at the deadline
        writer = _ChannelWriter(channel, time.monotonic() + timeout)
        stdout, stderr = _Tail(tail_bytes), _Tail(tail_bytes)
        readers = [threading.Thread(target=_drain, args=(channel.recv, stdout, writer), daemon=True),
                   threading.Thread(target=_drain, args=(channel.recv_stderr, stderr, writer), daemon=True)]
        for reader in readers:
            reader.start()
        try:
            write_input(writer)
        except SSH_ERRORS:
            pass  # the command stopped reading: its output says why (or it is late: below)
        finally:
            try:
                channel.shutdown_write()
            except SSH_ERRORS:
                pass
        for reader in readers:
            reader.join(max(writer.left(), 0) + POLL_S)
        if any(reader.is_alive() for reader in readers) or not channel.status_event.wait(max(writer.left(), 0)):
            raise RemoteDataError(f"{what} had not ended after {writer.allowed():.0f} s (the host kept its "
                                  "channel open): given up on this host")
        return channel.recv_exit_status(), stdout.value(), stderr.value()
    finally:
        channel.close()


class _Late(OSError):
    """The deadline passed while the host was taking the input (an SSH_ERRORS kind: the
    writer's caller stops writing, and the deadline check after it says why)."""


class _ChannelWriter:
    """The write() a tar stream needs, over a channel's stdin; it keeps the deadline, which
    each MiB the host takes moves on by a second (INPUT_BYTES_PER_S)."""

    def __init__(self, channel, deadline: float):
        self.channel, self.deadline, self.started, self.sent = channel, deadline, time.monotonic(), 0

    def left(self) -> float:
        return self.deadline + self.sent / INPUT_BYTES_PER_S - time.monotonic()

    def allowed(self) -> float:
        return self.deadline + self.sent / INPUT_BYTES_PER_S - self.started

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self.left() < 0:
                raise _Late()
            try:
                taken = self.channel.send(view[:CHUNK])
            except socket.timeout:
                continue
            self.sent += taken
            view = view[taken:]
        return len(data)


class _Tail:
    def __init__(self, keep: int):
        self.keep, self.data = keep, b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.keep:]

    def value(self) -> bytes:
        return self.data


def _drain(receive, tail: _Tail, clock: _ChannelWriter) -> None:
    try:
        while clock.left() >= 0:
            try:
                chunk = receive(CHUNK)
            except socket.timeout:
                continue
            if not chunk:
                return
            tail.add(chunk)
    except SSH_ERRORS:
        return  # the connection went: the exit status says so (-1)
