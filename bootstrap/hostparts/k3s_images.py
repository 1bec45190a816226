"""Images in k3s's containerd: the air-gap folder's archives, and the images pre-pulled.

k3s imports the archives in agent/images when it starts; a node that keeps running
imports a new one at once, so adding images restarts nothing. GPU nodes pull the images
validation and the first jobs need before `up` ends.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bootstrap.artifacts import K3sArtifacts, airgap_folder, image_archives
from bootstrap.facts.host_facts import HostFacts
from bootstrap.hostparts.base import Action, Draft, FileSpec
from bootstrap.images import missing
from bootstrap.inventory.model import Inventory

IMAGES_DIR = "/var/lib/rancher/k3s/agent/images"
ARCHES = ("amd64", "arm64")  # the arches whose archives the probe asks after


def archive_path(archive: Path) -> str:
    return f"{IMAGES_DIR}/{archive.name}"


def paths(inventory: Inventory) -> set[str]:
    """Every archive a host of this inventory may hold (none without an air-gap folder)."""
    if not inventory.k3s.airgap:
        return set()
    folder = airgap_folder(inventory)
    return {archive_path(p) for arch in ARCHES for p in image_archives(folder, arch)}


def files(artifacts: K3sArtifacts) -> list[FileSpec]:
    return [FileSpec(archive_path(a.path), 0o644, a.sha256, local=a.path, image_archive=True)
            for a in artifacts.images]


def plan_import(draft: Draft) -> None:
    """k3s runs and keeps running: import what it would only read at its next start."""
    archives = [u.path for u in draft.plan.uploads if u.image_archive]
    if archives and draft.plan.service is None:
        draft.add(Action.IMPORT_IMAGES,
                  [f"k3s ctr -n k8s.io images import {shlex.quote(a)} >/dev/null" for a in archives],
                  f"import images from {', '.join(a.rsplit('/', 1)[-1] for a in archives)}")


def plan_prepull(draft: Draft, wanted: list[str], facts: HostFacts) -> None:
    draft.plan.prepull = missing(wanted, facts.images)
    if draft.plan.prepull:
        draft.plan.actions.add(Action.PULL_IMAGES)
        draft.plan.changes.append(f"pull images {', '.join(draft.plan.prepull)}")
