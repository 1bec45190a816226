"""The names of this tool's etcd snapshots: what the state folder (bootstrap.state.folder) needs
of them without the snapshot code (bootstrap.state.snapshots, which needs the state folder)."""

from __future__ import annotations

import re
from pathlib import Path

# What k3s appends to --name: "-<node name>-<unix time>", and ".zip" when compressed
# (k3s-io/k3s pkg/etcd/snapshot.go, snapshotName / compressSnapshot).
K3S_SUFFIX = r"-[a-z0-9]([a-z0-9.-]*[a-z0-9])?-[0-9]+(\.zip)?"


def name_prefix(cluster_id: str) -> str:
    return f"bootstrap-{cluster_id}-"


def adopt_legacy(folder: Path, cluster_id: str) -> None:
    """Snapshots named before clusters had ids (`bootstrap-YYYYmmdd-HHMMSS-...`) in `folder` get
    this cluster's prefix: they came from the only cluster this folder ever held."""
    if not folder.is_dir():
        return
    legacy = re.compile(r"bootstrap-([0-9]{8}-[0-9]{6}" + K3S_SUFFIX + r")(\.token)?", re.ASCII)
    for path in folder.iterdir():
        match = legacy.fullmatch(path.name)
        if match:
            path.rename(path.with_name(name_prefix(cluster_id) + path.name[len("bootstrap-"):]))
