"""What the cluster side compared last time (its paths, in the state folder), so that the next
run's connection made ahead reads them while the hosts are probed (client.warm_connections):
a run that changes nothing then has them when its cluster side starts."""

from __future__ import annotations

import json
import re

from bootstrap.state.folder import StateDir

READS_FILE = "cluster-reads.json"
# An API path as object_path makes them: what is read back is only ever requested, never run.
API_PATH = re.compile(r"/(api|apis)(/[A-Za-z0-9][A-Za-z0-9._-]*){1,8}")
MAX_PATHS = 256


def remembered(state: StateDir) -> list[str]:
    """The paths the last cluster side compared; [] when none, or the file is not as written."""
    path = state.path / READS_FILE
    try:
        if path.is_symlink() or path.stat().st_size > MAX_PATHS * 512:
            return []
        paths = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(paths, list) or len(paths) > MAX_PATHS:
        return []
    return [p for p in paths if isinstance(p, str) and API_PATH.fullmatch(p)]


def remember(state: StateDir, paths: list[str]) -> None:
    """Keep `paths` for the next run (written only when they differ: a no-op writes nothing)."""
    wanted = list(dict.fromkeys(p for p in paths if API_PATH.fullmatch(p)))[:MAX_PATHS]
    if wanted != remembered(state):
        state.ensure()
        state.write_file(READS_FILE, json.dumps(wanted, indent=1) + "\n")
