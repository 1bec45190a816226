"""The stand-in's HTTP/2 (tests/standins/h2serve.py) against the `h2` library as a client, over a
socket pair (the TLS and ALPN around it are the real clients' tests: test_real_clients.py):
flow control as a Go client's windows demand it, streams that do not wait for each other, a
reset stream that ends its writer, a body over kube-apiserver's limit, a client that sends
garbage, and the idle GOAWAY."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

h2 = pytest.importorskip("h2")
import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.events  # noqa: E402

from standins import h2serve  # noqa: E402

BIG = bytes(range(256)) * 4096  # 1 MiB: beyond a client's default 64 KiB window


class Handler(http.server.BaseHTTPRequestHandler):
    released = threading.Event()
    watch_ended = threading.Event()

    def log_message(self, *args):
        return

    def do_GET(self):
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(BIG)))
            self.send_header("Connection", "keep-alive")
            self.end_headers()
            self.wfile.write(BIG)
        elif self.path == "/watch":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    self.write_chunk(b'{"type": "BOOKMARK"}\n')
                    time.sleep(0.05)
            except OSError:
                Handler.watch_ended.set()
        elif self.path == "/nothing":
            return  # a handler that writes nothing
        elif self.path == "/bad-header":
            self.send_response(200)
            self.send_header("X-Injected", "a\r\nSet-Cookie: b")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        elif self.path == "/slow":
            Handler.released.wait(10)
            self.reply(b"slow")
        else:
            self.reply(self.path.encode())

    def do_POST(self):
        self.reply(b"%d" % len(self.body))

    def reply(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Client:
    """An HTTP/2 client on one end of a socket pair; the stand-in serves the other end."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.sock.settimeout(10)
        self.server = threading.Thread(target=h2serve.serve_h2, args=(theirs, ("127.0.0.1", 1), None, Handler),
                                       daemon=True)
        self.server.start()
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.flush()
        self.answers: dict[int, dict] = {}
        self.terminated = None

    def flush(self):
        self.sock.sendall(self.h2.data_to_send())

    def request(self, method, path, body=b""):
        stream = self.h2.get_next_available_stream_id()
        headers = [(":method", method), (":path", path), (":scheme", "https"), (":authority", "k3s")]
        self.h2.send_headers(stream, headers + ([("content-length", str(len(body)))] if body else []),
                             end_stream=not body)
        view = memoryview(body)
        while view:  # within the server's windows: 256 KiB a stream, as kube-apiserver
            room = min(self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size, len(view))
            if room == 0:
                self.pump()
                continue
            self.h2.send_data(stream, view[:room].tobytes(), end_stream=room == len(view))
            view = view[room:]
            self.flush()
        self.flush()
        self.answers[stream] = {"headers": None, "data": bytearray(), "ended": False}
        return stream

    def pump(self):
        data = self.sock.recv(65536)
        if not data:
            self.terminated = self.terminated or "closed"
            return
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.answers[event.stream_id]["headers"] = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                self.answers[event.stream_id]["data"] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.answers[event.stream_id]["ended"] = True
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = event
        try:
            self.flush()
        except OSError:  # the server has ended the connection (its GOAWAY is read above)
            self.terminated = self.terminated or "closed"

    def until(self, done, timeout=10):
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, self.answers
            self.pump()


def test_a_large_answer_crosses_in_the_clients_windows_without_hop_by_hop_headers():
    client = Client()
    stream = client.request("GET", "/big")
    client.until(lambda: client.answers[stream]["ended"])
    answer = client.answers[stream]
    assert answer["data"] == BIG
    assert answer["headers"][":status"] == "200" and answer["headers"]["content-length"] == str(len(BIG))
    assert "connection" not in answer["headers"]  # RFC 9113 8.2.2


def test_a_request_body_arrives_whole_and_one_over_the_limit_is_413(monkeypatch):
    monkeypatch.setattr(h2serve, "MAX_BODY", 300 * 1024)
    client = Client()
    fits, too_big = client.request("POST", "/x", b"a" * (300 * 1024)), client.request("POST", "/x", b"a" * (300 * 1024 + 1))
    client.until(lambda: client.answers[fits]["ended"] and client.answers[too_big]["ended"])
    assert bytes(client.answers[fits]["data"]) == b"307200"
    assert client.answers[too_big]["headers"][":status"] == "413"


def test_a_stream_in_flight_does_not_hold_the_next_and_a_reset_ends_a_watch():
    Handler.released.clear()
    Handler.watch_ended.clear()
    client = Client()
    slow, watch = client.request("GET", "/slow"), client.request("GET", "/watch")
    quick = client.request("GET", "/quick")
    client.until(lambda: client.answers[quick]["ended"] and len(client.answers[watch]["data"]) > 40)
    assert bytes(client.answers[quick]["data"]) == b"/quick" and not client.answers[slow]["ended"]
    assert "transfer-encoding" not in client.answers[watch]["headers"]
    assert client.answers[watch]["data"].startswith(b'{"type": "BOOKMARK"}\n{"type"')  # no chunk framing
    client.h2.reset_stream(watch)
    client.flush()
    assert Handler.watch_ended.wait(5)
    Handler.released.set()
    client.until(lambda: client.answers[slow]["ended"])
    assert bytes(client.answers[slow]["data"]) == b"slow"


def test_garbage_from_a_client_ends_its_connection_with_a_goaway():
    client = Client()
    client.sock.sendall(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01" + b"\xff" * 64)  # GOAWAY on stream 1: illegal
    client.until(lambda: client.terminated is not None)
    assert isinstance(client.terminated, h2.events.ConnectionTerminated) and client.terminated.error_code == 1
    client.server.join(5)
    assert not client.server.is_alive()


def test_an_idle_connection_gets_a_goaway(monkeypatch):
    monkeypatch.setattr(h2serve, "IDLE_TIMEOUT_S", 0.3)
    client = Client()
    stream = client.request("GET", "/one")
    client.until(lambda: client.answers[stream]["ended"])
    started = time.monotonic()
    client.until(lambda: client.terminated is not None, timeout=5)
    assert isinstance(client.terminated, h2.events.ConnectionTerminated) and time.monotonic() - started < 3


def test_a_handler_that_writes_nothing_answers_200_and_a_field_go_would_refuse_is_dropped():
    client = Client()
    nothing, bad = client.request("GET", "/nothing"), client.request("GET", "/bad-header")
    client.until(lambda: client.answers[nothing]["ended"] and client.answers[bad]["ended"])
    assert client.answers[nothing]["headers"] == {":status": "200"} and client.answers[nothing]["data"] == b""
    assert "x-injected" not in client.answers[bad]["headers"] and client.answers[bad]["data"] == b"ok"


def test_frames_as_large_as_the_settings_allow_are_read_from_the_first_one():
    """kube-apiserver's 256 KiB frames hold from its first SETTINGS frame: a client's ACK and a
    large DATA frame in one read are taken (h2 alone would apply the size at the ACK)."""
    client = Client()
    client.h2.receive_data(client.sock.recv(65536))  # the server's SETTINGS: the ACK is queued, not sent
    body = b"b" * (40 * 1024)  # over the 16 KiB default; whole within the server's one read
    assert client.h2.max_outbound_frame_size >= len(body)
    stream = client.h2.get_next_available_stream_id()
    client.h2.send_headers(stream, [(":method", "POST"), (":path", "/x"), (":scheme", "https"),
                                    (":authority", "k3s")])
    client.h2.send_data(stream, body, end_stream=True)  # one frame, after the ACK, in one write
    client.answers[stream] = {"headers": None, "data": bytearray(), "ended": False}
    client.flush()
    client.until(lambda: client.answers[stream]["ended"])
    assert bytes(client.answers[stream]["data"]) == b"40960"
