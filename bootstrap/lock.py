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
from bootstrap.statedir import StateDir


class ClusterBusy(BootstrapError):
    pass


@contextlib.contextmanager
def cluster_lock(state: StateDir, command: str):
    state.ensure()
    path = state.path / "lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        try:
            holder = json.loads(handle.read() or "{}")
        except ValueError:
            holder = {}
        handle.close()
        since = time.strftime("%H:%M:%S", time.localtime(holder.get("since", 0))) if holder else "?"
        raise ClusterBusy(
            f"another bootstrap command is already working on this cluster "
            f"(`{holder.get('command', '?')}`, pid {holder.get('pid', '?')}, since {since})",
            "wait for it to finish; the lock is released automatically if it crashes") from None
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
