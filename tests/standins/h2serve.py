"""HTTP/2 for the stand-in's supervisor/API port, as kube-apiserver serves it.

kube-apiserver's TLS offers ALPN "h2" then "http/1.1" and serves HTTP/2 with golang.org/x/net/http2
(kubernetes staging/src/k8s.io/apiserver/pkg/server/secure_serving.go, tag v1.33.5, Serve and
tlsConfig): Go clients (kubectl, Helm, client-go) take h2 and send every request of a session
as a stream of one connection, watches included. Through the tool's SSH tunnel that is one
channel and one TLS handshake for all of Helm's requests, where HTTP/1.1 needs a connection
per request in flight (a watch holds one).

The settings are that file's: IdleTimeout 90 s (GOAWAY after 90 s without a stream),
MaxUploadBufferPerStream and MaxReadFrameSize 256 KiB (resourceBody99Percentile),
MaxConcurrentStreams 100 (its default when --http2-max-streams-per-connection is not set),
MaxUploadBufferPerConnection = per stream x streams.

The protocol is the `h2` library's (Debian 12 python3-h2 on the test hosts, the `h2` wheel
where the sandbox runs); without it ALPN offers http/1.1 only (ALPN below). Each request runs
the same handler class as over HTTP/1.1 (k3s_standin.QuietHandler's subclasses), in a thread
of its own, through H2Exchange: the status and headers it sends become a HEADERS frame (the
hop-by-hop ones dropped: RFC 9113 8.2.2), what it writes DATA frames, within the client's
flow-control windows. One thread per connection owns the socket (ssl sockets are not safe to
read and write from two threads at once); request threads hand it frames through h2's buffer.
"""

import http.client
import io
import re
import selectors
import socket
import ssl
import threading
import time

try:
    import h2.config
    import h2.connection
    import h2.errors
    import h2.events
    import h2.exceptions
    import h2.settings
except ImportError:  # HTTP/1.1 only, as a server built without h2
    h2 = None

ALPN = ["h2", "http/1.1"] if h2 is not None else ["http/1.1"]

IDLE_TIMEOUT_S = 90.0
STREAM_WINDOW = 256 * 1024
MAX_FRAME = 256 * 1024
MAX_STREAMS = 100
# Go's http2.Server advertises MaxHeaderBytes (kube-apiserver: 1 MiB, secure_serving.go) plus
# 32 bytes for each of 10 typical fields (golang.org/x/net http2/server.go, maxHeaderListSize;
# the x/net that k3s v1.33's Kubernetes vendors).
MAX_HEADER_LIST = (1 << 20) + 10 * 32
# After its GOAWAY, Go's server reads for 1 s before it closes (golang.org/x/net http2/server.go,
# goAwayTimeout): a request already on the way then does not meet a TCP reset, which would
# lose the GOAWAY that tells the client to retry elsewhere.
GOAWAY_LINGER_S = 1.0
# kube-apiserver's MaxRequestBodyBytes (3 MiB): a larger body is answered 413.
MAX_BODY = 3 * 1024 * 1024
SEND_TIMEOUT_S = 30.0
# RFC 9113 8.2.2: connection-specific header fields are malformed in HTTP/2.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
# A field value Go's client would refuse ("invalid header field value"): Go's server drops
# such a field (golang.org/x/net http2/server.go, writeResHeaders: httpguts.ValidHeaderFieldValue).
BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class StreamGone(ConnectionResetError):
    """The client reset the stream or the connection ended: a handler's write fails as on a
    closed HTTP/1.1 connection (OSError), so its watch ends."""


class _Stream:
    def __init__(self, stream_id, headers):
        self.id = stream_id
        self.headers = headers
        self.body = bytearray()
        self.too_large = False
        self.gone = False
        self.ended = False  # END_STREAM sent
        self.answered = False  # HEADERS sent


class _StreamWriter(io.RawIOBase):
    """The handler's wfile: bytes written become DATA frames of its stream."""

    def __init__(self, conn, stream):
        super().__init__()
        self._conn, self._stream = conn, stream

    def writable(self):
        return True

    def write(self, data):
        self._conn.send_data(self._stream, bytes(data))
        return len(data)


class H2Exchange:
    """Mixed in before the handler class for one HTTP/2 request: what BaseHTTPRequestHandler
    would write as an HTTP/1.1 status line and headers goes out as one HEADERS frame."""

    def send_response_only(self, code, message=None):
        self._h2_status = code
        self._h2_headers = []

    def send_header(self, keyword, value):
        if keyword.lower() not in HOP_BY_HOP and not BAD_VALUE.search(str(value)):
            self._h2_headers.append((keyword.lower(), str(value)))

    def end_headers(self):
        self._h2_conn.send_headers(self._h2_stream, self._h2_status, self._h2_headers)

    def flush_headers(self):
        return

    def write_chunk(self, data):
        """A piece of a streamed answer (a watch's event); empty ends the stream."""
        if data:
            self.wfile.write(data)
        else:
            self._h2_conn.end_stream(self._h2_stream)


class Connection:
    """One HTTP/2 connection: this thread reads and writes the socket, a thread per request
    runs the handler."""

    def __init__(self, sock, client_address, server, handler_class):
        self.sock, self.client_address, self.server = sock, client_address, server
        self.handler_class = type("H2" + handler_class.__name__, (H2Exchange, handler_class), {})
        self.lock = threading.Condition()
        self.streams = {}
        self.closed = False
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        # Header bytes as Go's server takes them (not necessarily UTF-8): decoded as latin-1 below.
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        # kube-apiserver's settings, in force from the first frame as in Go's server (it reads
        # by them once it has sent them); h2 would apply settings changed later only at the
        # client's ACK, and its frame reader's limit only at the next read.
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
        })
        self.h2.max_inbound_frame_size = MAX_FRAME
        self.h2.decoder.max_header_list_size = MAX_HEADER_LIST

    # --- called by request threads -------------------------------------------------------

    def _wake(self):
        try:
            self.wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already woken, or the connection is gone

    def send_headers(self, stream, status, headers):
        with self.lock:
            if stream.gone or self.closed:
                raise StreamGone("stream %d is gone" % stream.id)
            try:
                self.h2.send_headers(stream.id, [(":status", str(status))] + headers)
            except h2.exceptions.StreamClosedError:
                raise StreamGone("stream %d is closed" % stream.id)
            stream.answered = True
        self._wake()

    def send_data(self, stream, data):
        view = memoryview(data)
        with self.lock:
            while view:
                if stream.gone or self.closed:
                    raise StreamGone("stream %d is gone" % stream.id)
                try:
                    room = min(self.h2.local_flow_control_window(stream.id), self.h2.max_outbound_frame_size)
                except (h2.exceptions.StreamClosedError, h2.exceptions.NoSuchStreamError):
                    raise StreamGone("stream %d is closed" % stream.id)
                if room <= 0:  # the client's window is spent: wait for its WINDOW_UPDATE
                    self.lock.wait(1.0)
                    continue
                self.h2.send_data(stream.id, view[:room].tobytes())
                view = view[room:]
                self._wake()

    def end_stream(self, stream):
        with self.lock:
            if stream.ended or stream.gone or self.closed:
                return
            stream.ended = True
            try:
                if stream.answered:
                    self.h2.end_stream(stream.id)
                else:  # a handler that wrote nothing: Go's server answers 200 with no body
                    self.h2.send_headers(stream.id, [(":status", "200")], end_stream=True)
            except h2.exceptions.ProtocolError:
                return
        self._wake()

    # --- the connection's own thread ------------------------------------------------------

    def serve(self):
        with self.lock:
            self.h2.initiate_connection()
            # MaxUploadBufferPerConnection: the connection window grows from 65535 to it
            self.h2.increment_flow_control_window(STREAM_WINDOW * MAX_STREAMS - 65535)
        idle_since = time.monotonic()
        events = selectors.DefaultSelector()  # not select(): file numbers over 1023 work too
        events.register(self.sock, selectors.EVENT_READ)
        events.register(self.wake_r, selectors.EVENT_READ)
        try:
            while not self.closed:
                self._flush()
                with self.lock:
                    busy = any(not s.gone for s in self.streams.values())
                if busy:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > IDLE_TIMEOUT_S:
                    with self.lock:
                        self.h2.close_connection()
                        self.closed = True
                    break
                if not getattr(self.sock, "pending", lambda: 0)():  # TLS: bytes already decrypted
                    ready = [key.fileobj for key, _ in events.select(1.0)]
                    if self.wake_r in ready:
                        try:
                            while self.wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    if self.sock not in ready:
                        continue
                try:
                    self.sock.settimeout(0)
                    data = self.sock.recv(65536)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    continue
                except (OSError, ssl.SSLError):
                    return
                if not data:
                    return
                self._receive(data)
            self._flush()
            self._linger()
        finally:
            events.close()
            with self.lock:
                self.closed = True
                for stream in self.streams.values():
                    stream.gone = True
                self.lock.notify_all()
            for s in (self.wake_r, self.wake_w):
                s.close()

    def _linger(self):
        """After this side's GOAWAY: read and drop what still arrives, for GOAWAY_LINGER_S."""
        deadline = time.monotonic() + GOAWAY_LINGER_S
        self.sock.settimeout(0.1)
        while time.monotonic() < deadline:
            try:
                if not self.sock.recv(65536):
                    return
            except (TimeoutError, socket.timeout, ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                continue
            except (OSError, ssl.SSLError):
                return

    def _flush(self):
        with self.lock:
            out = self.h2.data_to_send()
        if out:
            self.sock.settimeout(SEND_TIMEOUT_S)
            try:
                self.sock.sendall(out)
            except (OSError, ssl.SSLError):
                with self.lock:
                    self.closed = True

    def _receive(self, data):
        start = []
        with self.lock:
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True  # h2 has queued the GOAWAY: flushed by the loop, then a linger
                events = []
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    self.streams[event.stream_id] = _Stream(event.stream_id, event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    stream = self.streams.get(event.stream_id)
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    if stream is not None and not stream.too_large:
                        stream.body += event.data
                        if len(stream.body) > MAX_BODY:
                            stream.too_large, stream.body = True, bytearray()
                elif isinstance(event, h2.events.StreamEnded):
                    stream = self.streams.get(event.stream_id)
                    if stream is not None:
                        start.append(stream)
                elif isinstance(event, h2.events.StreamReset):
                    stream = self.streams.pop(event.stream_id, None)
                    if stream is not None:
                        stream.gone = True
                elif isinstance(event, h2.events.ConnectionTerminated):
                    # The client's GOAWAY. Go's server would let the streams in flight end;
                    # h2 sends nothing more once it has one (Go's Transport sends it only
                    # when it shuts down, its requests done).
                    self.closed = True
            self.lock.notify_all()  # window updates and resets reach waiting writers
        for stream in start:
            threading.Thread(target=self._run, args=(stream,), daemon=True).start()

    def _run(self, stream):
        handler = self.handler_class.__new__(self.handler_class)
        try:
            self._handle(handler, stream)
        except StreamGone:
            pass
        except Exception:  # as Go's server: a handler's panic resets its stream, not the connection
            with self.lock:
                if not stream.gone and not self.closed:
                    try:
                        self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    except h2.exceptions.ProtocolError:
                        pass
            self._wake()
            raise
        finally:
            with self.lock:
                stream.gone = True
                self.streams.pop(stream.id, None)
            self._wake()

    def _handle(self, handler, stream):
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in stream.headers]
        fields = dict((k, v) for k, v in headers if k.startswith(":"))
        message = http.client.HTTPMessage()
        for key, value in headers:
            if not key.startswith(":"):
                message[key] = value
        if fields.get(":authority") and "host" not in message:
            message["Host"] = fields[":authority"]
        handler._h2_conn, handler._h2_stream = self, stream
        handler.server, handler.client_address = self.server, self.client_address
        handler.request = handler.connection = self.sock  # the client certificate (getpeercert)
        handler.command, handler.path = fields.get(":method", ""), fields.get(":path", "/")
        handler.request_version = "HTTP/2.0"
        handler.requestline = "%s %s HTTP/2.0" % (handler.command, handler.path)
        handler.headers = message
        handler.body = bytes(stream.body)
        handler.rfile = io.BytesIO(handler.body)
        handler.wfile = _StreamWriter(self, stream)
        handler.close_connection = False
        if stream.too_large:
            handler.send_error(413, "request body too large")
        else:
            method = getattr(handler, "do_" + handler.command, None)
            if method is None:
                handler.send_error(501, "Unsupported method (%r)" % handler.command)
            else:
                method()
        self.end_stream(stream)


def serve_h2(sock, client_address, server, handler_class):
    """Serve one TLS connection whose ALPN chose "h2", until it ends."""
    Connection(sock, client_address, server, handler_class).serve()
