"""What the host parts share: a file to place, the typed actions of a plan, a plan in the making."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bootstrap.host.plan.host_plan import HostPlan


@dataclass(frozen=True)
class FileSpec:
    path: str
    mode: int
    sha256: str
    content: bytes | None = None  # small files rendered here
    local: Path | None = None  # large files uploaded from the control machine
    secret: bool = False  # never shown, staged in a private directory
    restarts_k3s: bool = False
    image_archive: bool = False  # an image archive (or image list) for k3s's containerd
    size: int = 0  # bytes, when known (image archives: what k3s's import time grows with)


def text_file(path: str, text: str, mode: int = 0o644, **kw) -> FileSpec:
    data = text.encode()
    return FileSpec(path, mode, hashlib.sha256(data).hexdigest(), content=data, **kw)


class Action(Enum):
    """What a plan does to a host, for code to read (`HostPlan.changes` is for people)."""

    PLACE_FILES = "place files"
    REPLACE_BINARY = "replace the k3s binary"  # what makes a running node's plan an upgrade
    TURN_OFF_SWAP = "turn off swap"
    LOAD_MODULES = "load kernel modules"
    SET_SYSCTLS = "set sysctls"
    INSTALL_PACKAGES = "install packages"
    INSTALL_TOOLKIT = "install the NVIDIA container toolkit"
    HOLD_PACKAGES = "hold packages"
    ENABLE_UNIT = "enable the k3s unit"
    AWAIT_IMAGE_IMPORT = "wait for k3s to import image archives"
    WRITE_MANIFEST = "write the host manifest"
    PULL_IMAGES = "pull images"


@dataclass
class Draft:
    """A host's plan while the parts add to it, with what the parts tell each other: the
    manifest the host will record, and whether what changed needs k3s restarted."""

    plan: HostPlan
    manifest: dict
    restart: bool = False

    def add(self, action: Action, lines: list[str], change: str) -> None:
        self.plan.actions.add(action)
        self.plan.prepare += lines
        self.plan.changes.append(change)
