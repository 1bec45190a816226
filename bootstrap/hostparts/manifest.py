"""The host's record of what the tool did: /var/lib/bootstrap/manifest.json.

It names the cluster (id and name: bootstrap.rules.ownership reads whose host this is) and
lists the files written, packages installed and held, sysctls changed and swap turned off,
so `down` undoes exactly that. It is written first, so a failed install leaves the record.
"""

from __future__ import annotations

import json
import shlex

from bootstrap.hostparts import placing
from bootstrap.hostparts.base import Action, Draft, text_file

STATE_DIR = "/var/lib/bootstrap"
MANIFEST = f"{STATE_DIR}/manifest.json"
PATHS = (MANIFEST,)
ID_KEY = "cluster_id"
NAME_KEY = "cluster"


def record(manifest: dict, cluster_id: str, cluster: str) -> dict:
    """The manifest with this cluster's identity in it."""
    return {**manifest, ID_KEY: cluster_id, NAME_KEY: cluster}


def plan(draft: Draft, paths: list[str], recorded: dict) -> None:
    """`paths`: the files this plan places; `recorded`: the manifest the host holds now."""
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
