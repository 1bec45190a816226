"""One command at a time per cluster: an flock on the state folder, released even on a crash.

Every command that connects to hosts takes it, the read-only ones (facts, plan, status,
validate, kubeconfig) too: a first contact pins the host's key in known_hosts, and that
file is written under this lock only (forget-host takes it as well).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from bootstrap.errors import BootstrapError
from bootstrap.state.folder import StateDir


class ClusterBusy(BootstrapError):
    pass


@contextlib.contextmanager
def cluster_lock(state: StateDir, command: str):
    """The folder is prepared (created 0700, or checked), the lock taken, and only then the
    cluster's identity read or created: two commands started together on a new folder would
    otherwise each make an id of their own."""
    state.prepare()
    path = state.path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(fd, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        try:
            holder = json.loads(handle.read(4096) or "{}")
        except ValueError:
            holder = {}
        holder = holder if isinstance(holder, dict) else {}
        handle.close()
        try:
            since = time.strftime("%H:%M:%S", time.localtime(float(holder["since"])))
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            since = "?"
        raise ClusterBusy(
            f"another bootstrap command is already working on this cluster "
            f"(`{holder.get('command', '?')}`, pid {holder.get('pid', '?')}, since {since})",
            "wait for it to finish; the lock is released automatically if it crashes") from None
    try:
        state.ensure()
        state.clean_leftovers()
    except BaseException:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))
    handle.flush()
    try:
        yield
    finally:
        handle.truncate(0)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
