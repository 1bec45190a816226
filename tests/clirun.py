"""Run the installed `bootstrap` command the way a user does: from another folder."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

BOOTSTRAP = Path(sys.executable).parent / "bootstrap"
# No chart can be downloaded here: tests use the recording Helm stand-in unless told otherwise.
HELM_RECORDER = Path(__file__).resolve().parent / "standins" / "helm_recorder.py"


def run_bootstrap(*args, env=None, timeout=300, cwd=None) -> subprocess.CompletedProcess:
    command = [str(BOOTSTRAP)] if BOOTSTRAP.exists() else [sys.executable, "-m", "bootstrap"]
    merged = {"BOOTSTRAP_HELM": str(HELM_RECORDER), **os.environ, **(env or {})}
    return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=merged, cwd=cwd or tempfile.gettempdir())
