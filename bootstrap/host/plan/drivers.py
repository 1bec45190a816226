"""Which NVIDIA driver packages `gpu.driver: host` installs, per distribution. Pure."""

from __future__ import annotations

from bootstrap.errors import BootstrapError
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory

DEFAULT_BRANCH = "580"  # the current long-term-support branch (CUDA 13.x)


def driver_packages(inventory: Inventory, facts: HostFacts) -> list[str]:
    """Empty unless the tool installs the driver and the host has none working."""
    if inventory.gpu.driver != "host" or facts.has_gpu:
        return []
    branch = inventory.gpu.driver_branch or DEFAULT_BRANCH
    kernel = facts.kernel or ""
    if facts.os_id == "ubuntu":
        # Ubuntu's signed, prebuilt server drivers; the open kernel modules are what
        # Hopper and newer need (and NVIDIA recommends from Turing on).
        return [f"nvidia-driver-{branch}-server-open", f"linux-modules-nvidia-{branch}-server-open-{kernel}"
                if kernel else f"nvidia-dkms-{branch}-server-open"]
    if facts.os_id == "debian":
        # Debian ships one branch in non-free (535 on bookworm), built by DKMS.
        if inventory.gpu.driver_branch and inventory.gpu.driver_branch != "535":
            raise BootstrapError(f"Debian 12 packages only driver branch 535, not {inventory.gpu.driver_branch}",
                                 "remove gpu.driver_branch, or install the driver yourself and use "
                                 "gpu.driver: preinstalled")
        return ["nvidia-driver", "firmware-misc-nonfree", f"linux-headers-{kernel}"]
    return []
