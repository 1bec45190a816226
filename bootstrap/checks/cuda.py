"""Which NVIDIA driver a CUDA version needs (NVIDIA CUDA Toolkit release notes, Table 3, Linux x86_64).

The GA minimum of each minor is used: with only the family minimum ("minor-version
compatibility"), PTX JIT and newer features fail at run time, which is the failure a
user of a rented VM can least afford to debug.
"""

from __future__ import annotations

# CUDA minor -> minimum Linux driver of its GA release.
MIN_DRIVER: dict[tuple[int, int], str] = {
    (11, 0): "450.51.05", (11, 1): "455.23", (11, 2): "460.27.03", (11, 3): "465.19.01",
    (11, 4): "470.42.01", (11, 5): "495.29.05", (11, 6): "510.39.01", (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06", (13, 1): "590.44.01", (13, 2): "595.45.04",
}
# The driver branch that first supports each CUDA 13 minor (release notes), for minors newer
# than the table's exact rows.
BRANCH_FOR_MINOR: dict[tuple[int, int], int] = {(13, 3): 610, (13, 4): 615}
FAMILY_MIN_BRANCH = {11: 450, 12: 525, 13: 580}


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.strip().split(".") if part.isdigit())


def required_driver(cuda: str) -> str | None:
    """The lowest driver that supports `cuda` ("12.4"), or None when we have no data for it."""
    key = parse_version(cuda)[:2]
    if key in MIN_DRIVER:
        return MIN_DRIVER[key]
    if key in BRANCH_FOR_MINOR:
        return str(BRANCH_FOR_MINOR[key])
    return None


def driver_problem(driver: str, cuda_wanted: str, cuda_supported: str | None = None) -> str | None:
    """Why `driver` cannot run CUDA `cuda_wanted` workloads, or None when it can.

    `cuda_supported` is the "CUDA Version" nvidia-smi prints: the highest the driver supports.
    """
    wanted = parse_version(cuda_wanted)[:2]
    minimum = required_driver(cuda_wanted)
    if minimum is not None:
        if parse_version(driver) < parse_version(minimum):
            return f"driver {driver} is too old for CUDA {cuda_wanted} (needs {minimum} or newer)"
        return None
    if cuda_supported and parse_version(cuda_supported)[:2] >= wanted:
        return None
    family = FAMILY_MIN_BRANCH.get(wanted[0]) if wanted else None
    if cuda_supported:
        return f"driver {driver} supports CUDA up to {cuda_supported}, not {cuda_wanted}"
    if family and parse_version(driver)[:1] < (family,):
        return f"driver {driver} is too old for CUDA {cuda_wanted} (the {wanted[0]}.x family needs {family}+)"
    return None


def upgrade_hint(cuda_wanted: str) -> str:
    minimum = required_driver(cuda_wanted)
    branch = minimum.split(".")[0] if minimum else None
    if branch:
        return (f"install driver branch {branch} or newer on the host (or set gpu.driver: host with "
                f"driver_branch: \"{branch}\", or gpu.driver: operator), or lower gpu.cuda")
    return "install a newer NVIDIA driver, or lower gpu.cuda"
