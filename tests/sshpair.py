"""Real paramiko on both ends of an SSH connection, in-process, for tests of what the tool
does with a host's channels: the server end stands in for a host's sshd (what a command
answers is the test's `answer` function), the link between them is a pair of sockets that
delays every byte by half of `rtt_s` each way (latency, not bandwidth: a far host).

    pairs = SshPairs()
    client = pairs.connect(Host(answer), rtt_s=0.4)  # client.get_transport(), as SSHClient
    ...
    pairs.close()
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Callable

import paramiko


def echo(command: bytes, stdin: bytes) -> tuple[int, bytes]:
    return 0, b"ran " + command + (b" with " + stdin if stdin else b"")


class Vanish(Exception):
    """Raised by an `answer`: the host is gone mid-command (its connection closes, no exit
    status, no more output)."""


class Host(paramiko.ServerInterface):
    """An sshd that lets anyone in and runs each exec as `answer(command, stdin) -> (status,
    output)`; stdin is read to its end first unless `reads_stdin` is False. `answer`
    returning None: the command never ends (a host that hangs); a status None: the channel
    closes without one; raising Vanish: the connection closes."""

    def __init__(self, answer: Callable[[bytes, bytes], tuple[int, bytes] | None] = echo,
                 refuse_after: int | None = None, reads_stdin: bool = True, stall_after: int | None = None,
                 stall_exec: bool = False):
        """`refuse_after` / `stall_after`: channel openings after that many are refused / never
        answered (the host's whole connection then stalls: paramiko asks in its one thread);
        `stall_exec`: exec requests are never answered."""
        self.answer, self.refuse_after, self.reads_stdin = answer, refuse_after, reads_stdin
        self.stall_after, self.stall_exec, self.released = stall_after, stall_exec, threading.Event()
        self.opened, self.commands = 0, []

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        self.opened += 1
        if self.stall_after is not None and self.opened > self.stall_after:
            self.released.wait(3600)  # (until the test closes the pair)
        if self.refuse_after is not None and self.opened > self.refuse_after:
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.commands.append(command)
        if self.stall_exec:
            self.released.wait(3600)  # never answers the exec request (until the test ends)
        threading.Thread(target=self._run, args=(channel, command), daemon=True).start()
        return True

    def _run(self, channel, command: bytes) -> None:
        try:
            self._answer(channel, command)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the client closed the channel or the connection first (it gave up)

    def _answer(self, channel, command: bytes) -> None:
        time.sleep(0.05)  # after the transport's reply to the exec request (this runs beside it)
        stdin = b""
        if self.reads_stdin:
            while chunk := channel.recv(65536):
                stdin += chunk
        try:
            result = self.answer(command, stdin)
        except Vanish:
            return channel.get_transport().close()
        if result is None:
            return  # hangs: never answers, never closes
        status, output = result
        channel.sendall(output)
        if status is not None:  # None: the channel closes without an exit status
            channel.send_exit_status(status)
        channel.close()


class Client:
    """What the tool's code takes of a paramiko SSHClient: its transport."""

    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport


class SshPairs:
    def __init__(self):
        self._transports: list = []
        self._hosts: list[Host] = []

    def connect(self, host: Host, rtt_s: float = 0.0) -> Client:
        near, near_link = socket.socketpair()
        far_link, far = socket.socketpair()
        _delayed(near_link, far_link, rtt_s / 2)
        _delayed(far_link, near_link, rtt_s / 2)
        server = paramiko.Transport(far)
        server.add_server_key(paramiko.RSAKey.generate(1024))
        server.start_server(event=threading.Event(), server=host)  # negotiates in its own thread
        client = paramiko.Transport(near)
        client.start_client(timeout=10)
        client.auth_none("lab")
        self._transports += [client, server]
        self._hosts.append(host)
        return Client(client)

    def close(self) -> None:
        for host in self._hosts:
            host.released.set()
        for transport in self._transports:
            transport.close()


def _delayed(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
    """Forward source -> sink, each chunk `delay_s` after it was read, in order."""
    chunks: queue.Queue = queue.Queue()

    def read():
        while data := _recv(source):
            chunks.put((time.monotonic() + delay_s, data))
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
