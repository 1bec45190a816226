"""Every file the host parts may write, in one list: the probe reports their mode and hash."""

from __future__ import annotations

from bootstrap.host.parts import k3s_binary, k3s_images, k3s_service, kernel, manifest, packages, registries
from bootstrap.inventory.model import Inventory

# The parts whose paths do not depend on the inventory.
FIXED = (kernel, packages, k3s_binary, k3s_service, registries, manifest)


def managed_paths(inventory: Inventory) -> list[str]:
    return sorted({p for part in FIXED for p in part.PATHS} | k3s_images.paths(inventory))
