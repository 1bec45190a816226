"""The tunnel's forwarding threads end quietly when the SSH connection is cut under them.

paramiko raises EOFError from `Channel.sendall` once the transport is gone
(paramiko/packet.py `write_all`), and from `Channel.close` too, which sends a close message
on the same dead transport (CI saw both); an uncaught exception in a thread prints a traceback to
the operator's terminal (CI saw one in the cut-at-cluster-side fault test).
"""

from __future__ import annotations

import socket
import threading

import paramiko
import pytest

from bootstrap.remote.sshlink import PortForward


class _CutChannel:
    """A channel whose SSH transport was cut: it selects as idle, and sending fails."""

    def __init__(self, error: BaseException, close_raises: bool = False):
        self._error = error
        self.close_raises = close_raises
        self._reader, self._writer = socket.socketpair()
        self.closed = False

    def fileno(self):
        return self._reader.fileno()

    def sendall(self, data):
        raise self._error

    def recv(self, size):
        return b""

    def close(self):
        self.closed = True
        self._reader.close()
        self._writer.close()
        if self.close_raises:  # paramiko's Channel.close sends a message on the dead transport
            raise EOFError()


@pytest.mark.parametrize("close_raises", [False, True])
@pytest.mark.parametrize("error", [EOFError(), paramiko.SSHException("Socket is closed"),
                                   ConnectionResetError(104, "reset")])
def test_a_cut_connection_ends_the_pump_without_a_traceback(error, close_raises):
    tunnel = PortForward(client=None, remote_port=6443)
    local, client_side = socket.socketpair()
    client_side.sendall(b"GET /api/v1/nodes HTTP/1.1\r\n\r\n")
    channel = _CutChannel(error, close_raises)
    seen: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    try:
        pump = threading.Thread(target=tunnel._pump, args=(local, channel))
        pump.start()
        pump.join(10)
    finally:
        threading.excepthook = previous
    assert not pump.is_alive()
    assert seen == []
    assert channel.closed and local.fileno() == -1
    client_side.close()
