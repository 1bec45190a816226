"""The host's record of what the tool did: /var/lib/bootstrap/manifest.json.

It names the cluster (id and name: bootstrap.checks.ownership reads whose host this is) and
lists the files written, packages installed and held, sysctls changed and swap turned off,
so `down` undoes exactly that. It is written first, so a failed install leaves the record.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from typing import Any

from bootstrap.host.parts import placing
from bootstrap.host.parts.base import Action, Draft, text_file
from bootstrap.remote_data import RemoteDataError, expect, loads

STATE_DIR = "/var/lib/bootstrap"
MANIFEST = f"{STATE_DIR}/manifest.json"
PATHS = (MANIFEST,)
ID_KEY = "cluster_id"
NAME_KEY = "cluster"
# What the tool writes there (bootstrap.state.folder.new_cluster_id: 8 random bytes in hex; the
# inventory's cluster name is a DNS label), and what a host may hold that the tool reads.
CLUSTER_ID = re.compile(r"[0-9a-f]{16}")
CLUSTER_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_PATH = re.compile(r"/[A-Za-z0-9._/+-]+")  # what the probe accepts for managed paths
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,127}")  # Debian policy 5.6.1
_SYSCTL = re.compile(r"[a-z0-9_][a-z0-9_./-]{0,127}")
_SYSCTL_VALUE = re.compile(r"[\x20-\x7e\t]{0,256}")
_UNITS = ("k3s", "k3s-agent")
MAX_ENTRIES = 4096
MAX_CHARS = 256 * 1024  # a real manifest is under 2 KiB


def parse(text: str | bytes) -> dict:
    """The manifest a host returned -> the record `read` accepts; {} when there is none
    (an empty file). RemoteDataError(reason) for anything the tool would not have written."""
    if not text.strip():
        return {}
    return read(loads(text, what=MANIFEST, max_chars=MAX_CHARS, max_depth=4))


def read(value: Any) -> dict:
    """A manifest's JSON value, checked field by field and normalised: only the keys the tool
    writes, each of the type and form it writes. A missing cluster id is a manifest from
    before ids existed; a null or malformed one is refused, never read as this cluster's."""
    data = expect(value, dict, MANIFEST)
    record: dict[str, Any] = {}
    if ID_KEY in data:
        record[ID_KEY] = _matching(data[ID_KEY], CLUSTER_ID, f"{MANIFEST}: {ID_KEY}")
    if NAME_KEY in data:
        record[NAME_KEY] = _matching(data[NAME_KEY], CLUSTER_NAME, f"{MANIFEST}: {NAME_KEY}")
    if "files" in data:
        record["files"] = [_path(f, f"{MANIFEST}: files[{i}]") for i, f in enumerate(_list(data, "files"))]
    for key in ("packages_installed", "packages_held"):
        if key in data:
            record[key] = [_matching(p, _PACKAGE, f"{MANIFEST}: {key}[{i}]") for i, p in enumerate(_list(data, key))]
    if "unit" in data:
        unit = expect(data["unit"], str, f"{MANIFEST}: unit")
        if unit not in _UNITS:
            raise RemoteDataError(f"{MANIFEST}: unit is not one of {', '.join(_UNITS)}")
        record["unit"] = unit
    if "swap_disabled" in data:
        record["swap_disabled"] = expect(data["swap_disabled"], bool, f"{MANIFEST}: swap_disabled")
    if "sysctl_before" in data:
        before = expect(data["sysctl_before"], dict, f"{MANIFEST}: sysctl_before")
        if len(before) > MAX_ENTRIES:
            raise RemoteDataError(f"{MANIFEST}: sysctl_before has more than {MAX_ENTRIES} entries")
        record["sysctl_before"] = {
            _matching(key, _SYSCTL, f"{MANIFEST}: a sysctl_before key"):
                _matching(str(expect(v, (str, int), f"{MANIFEST}: sysctl_before value")), _SYSCTL_VALUE,
                          f"{MANIFEST}: a sysctl_before value")
            for key, v in before.items()}
    return record


def _list(data: dict, key: str) -> list:
    items = expect(data[key], list, f"{MANIFEST}: {key}")
    if len(items) > MAX_ENTRIES:
        raise RemoteDataError(f"{MANIFEST}: {key} has more than {MAX_ENTRIES} entries")
    return items


def _matching(value: Any, pattern: re.Pattern, where: str) -> str:
    text = expect(value, str, where)
    if not pattern.fullmatch(text):
        raise RemoteDataError(f"{where} is not of the form the tool writes")
    return text


def _path(value: Any, where: str) -> str:
    path = _matching(value, _PATH, where)
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise RemoteDataError(f"{where} is not a normalised absolute path")
    return path


def record(manifest: dict, cluster_id: str, cluster: str) -> dict:
    """The manifest (checked again: `read`) with this cluster's identity in it."""
    return {**read(manifest), ID_KEY: cluster_id, NAME_KEY: cluster}


def plan(draft: Draft, paths: list[str], recorded: dict) -> None:
    """`paths`: the files this plan places; `recorded`: the manifest the host holds now
    (RemoteDataError when it is not one the tool wrote)."""
    recorded = read(recorded)
    manifest = draft.manifest
    manifest["files"] = sorted(set(manifest.get("files", [])) | set(paths))
    manifest["unit"] = draft.plan.unit
    if manifest != recorded:
        draft.plan.actions.add(Action.WRITE_MANIFEST)
        draft.plan.uploads.insert(0, text_file(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n"))


def teardown(kept: dict) -> list[str]:
    """`kept`: what stays the tool's (drivers `down` keeps), recorded so --purge-drivers can
    finish later; with nothing kept the whole folder goes."""
    if kept:
        text = shlex.quote(json.dumps(kept, sort_keys=True))
        return [placing.write_text(text, 0o644, MANIFEST)]
    return [f"rm -rf {STATE_DIR}"]
