"""Run the installed `bootstrap` command the way a user does: from another folder."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

BOOTSTRAP = Path(sys.executable).parent / "bootstrap"
# The real Helm on PATH, as a user runs it (inventories from labinv name lab chart archives).


def run_bootstrap(*args, env=None, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    command = [str(BOOTSTRAP)] if BOOTSTRAP.exists() else [sys.executable, "-m", "bootstrap"]
    merged = {**os.environ, **(env or {})}
    return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=merged, cwd=cwd or tempfile.gettempdir())


def run_bootstrap_on_terminal(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    """As `run_bootstrap`, with stdout on a pseudo-terminal: what an operator sees live."""
    import pty

    command = [str(BOOTSTRAP)] if BOOTSTRAP.exists() else [sys.executable, "-m", "bootstrap"]
    merged = {**os.environ, "TERM": "xterm", "COLUMNS": "160",
              **(env or {})}
    master, slave = pty.openpty()
    proc = subprocess.Popen(command + [str(a) for a in args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=subprocess.PIPE, env=merged, cwd=tempfile.gettempdir())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command closed its terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.wait(timeout=timeout)
    stderr = proc.stderr.read().decode()
    return subprocess.CompletedProcess(proc.args, proc.returncode, b"".join(chunks).decode(), stderr)
