"""Session channels opened one command ahead, so a command on the critical path does not wait
for its channel.

Opening an SSH session channel is a round trip of its own (the client must learn the
server's channel number before it can send the exec request: RFC 4254 section 5.1), and every
remote command needs a fresh one (a session channel runs one command). A host's commands in
`up` come one after another (facts probe, reachability, its change, its start), so while one
runs, the next one's channel is opened beside it: when that command comes, its channel is
there and the command costs its exec request and its answer only.

At most one channel is kept ahead per connection; it is closed with the connection (an
unused one costs the host an idle sshd session, nothing runs in it). A channel opened ahead
that the host dropped meanwhile is not used: a new one is opened then, as without this.
The host learns nothing from an open channel it did not already know, and what it sends on
one before the exec is read as that command's output, which the host controls anyway.
"""

from __future__ import annotations

import threading
import weakref

from bootstrap.remote.sshlink import SSH_ERRORS

OPEN_S = 60  # the most a channel's opening may take (paramiko's open_session default is 3600 s)


class _Ahead:
    """A channel being opened (or opened) beside the command that runs now."""

    def __init__(self, transport):
        self.ready = threading.Event()
        self.channel = None
        threading.Thread(target=self._open, args=(transport,), name="ssh-channel-ahead", daemon=True).start()

    def _open(self, transport) -> None:
        try:
            self.channel = transport.open_session(timeout=OPEN_S)
        except SSH_ERRORS:
            self.channel = None  # the taker opens its own and sees the connection's error itself
        finally:
            self.ready.set()

    def take(self, wait_s: float):
        """The channel when it opened within `wait_s` seconds and is still usable, else None.
        A host that has not answered its opening by then is not asked again (that would
        double the command's wait): TimeoutError, as a channel's opening that timed out; a
        late one is closed when it comes."""
        if not self.ready.wait(wait_s):
            threading.Thread(target=self._close_when_open, daemon=True).start()
            raise TimeoutError("timeout opening channel (the host did not answer)")
        channel = self.channel
        return channel if channel is not None and channel.active and not channel.closed else None

    def _close_when_open(self) -> None:
        self.ready.wait(OPEN_S + 5)
        if self.channel is not None:
            try:
                self.channel.close()
            except SSH_ERRORS:
                pass


_lock = threading.Lock()
_ahead: "weakref.WeakKeyDictionary[object, _Ahead]" = weakref.WeakKeyDictionary()


def session_channel(transport, timeout: float):
    """A session channel on `transport` for the next command: the one opened ahead when there
    is one, else a new one (paramiko's errors as open_session raises them). Its command goes
    through `start`, which opens the one after."""
    with _lock:
        ahead = _ahead.pop(transport, None)
    channel = ahead.take(min(timeout, OPEN_S)) if ahead is not None else None
    if channel is None:
        channel = transport.open_session(timeout=min(timeout, OPEN_S))
    return channel


def open_ahead(transport) -> None:
    """Start opening a channel on `transport` for its next command (unless one is on its way)."""
    if transport is None or not transport.is_active():
        return
    with _lock:
        if transport not in _ahead:
            _ahead[transport] = _Ahead(transport)


def start(channel, transport, command: str, timeout: float) -> None:
    """`command` started on `channel`, then the next channel opened ahead (the exec goes out
    first). paramiko waits for the host's answer to an exec request without a time-out
    (Channel._wait_for_event): a host that never answers would hold the command for ever, so
    the channel is closed at `timeout` (at most OPEN_S) and TimeoutError says why."""
    fired = threading.Event()

    def give_up() -> None:
        fired.set()
        channel.close()

    watchdog = threading.Timer(min(timeout, OPEN_S), give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        channel.exec_command(command)
    except SSH_ERRORS:
        if fired.is_set():
            raise TimeoutError("timeout starting the command (the host did not answer)") from None
        raise
    finally:
        watchdog.cancel()
    open_ahead(transport)
