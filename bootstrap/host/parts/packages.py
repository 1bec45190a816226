"""Apt packages: those the components need, NVIDIA's container toolkit, and holds.

The tool records what it installed and held in the host manifest, so `down` removes only
those (drivers only with --purge-drivers, and their holds stay while they do).
"""

from __future__ import annotations

import re
import shlex

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import placing
from bootstrap.host.parts.base import Action, Draft
from bootstrap.host.parts.manifest import STATE_DIR
from bootstrap.inventory.model import Inventory

APT_ENV = "DEBIAN_FRONTEND=noninteractive"
TOOLKIT = "nvidia-container-toolkit"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/bootstrap-nvidia-container-toolkit.list"
TOOLKIT_KEYRING = "/usr/share/keyrings/bootstrap-nvidia-container-toolkit.asc"
NVIDIA_REPO = "https://nvidia.github.io/libnvidia-container"
PATHS = (TOOLKIT_SOURCE,)

# package -> whether a host needs it for the inventory's components (gpu: a GPU node).
COMPONENT_PACKAGES = {
    "nfs-common": lambda inventory, gpu: inventory.storage.default == "nfs" or bool(inventory.storage.nfs),
    "open-iscsi": lambda inventory, gpu: inventory.storage.default == "longhorn",
    "rdma-core": lambda inventory, gpu: bool(inventory.network.rdma) and gpu,
}
# A driver upgraded under a running node breaks NVML until reboot: these are held.
HOLD_PREFIXES = ("nvidia-", "libnvidia-", "cuda-drivers")
# What `down` keeps unless --purge-drivers (see bootstrap.host.plan.drivers).
DRIVER_PREFIXES = ("nvidia-driver", "nvidia-dkms", "linux-modules-nvidia", "nvidia-kernel", "firmware-misc-nonfree",
                   "cuda-drivers", "linux-headers")
# dpkg globs the probe asks about: the held families, the component packages, the driver build's.
PROBE_GLOBS = (*(f"{p}*" for p in HOLD_PREFIXES), *COMPONENT_PACKAGES, "linux-headers-*", "dkms")


# What an install brings beside the names asked for: NVIDIA's toolkit depends on
# nvidia-container-toolkit-base and libnvidia-container-tools (and that on libnvidia-container1),
# a driver on its libnvidia-* libraries. The probe before the install cannot name them, so the
# install's own command holds every NVIDIA package dpkg then has installed and not yet held:
# the next run finds nothing left to hold (a no-op `up` changes nothing). The names come from
# that host's dpkg, in that host's shell, so that command also records them (HELD_ON_HOST, one
# a line): the manifest was written before the install and cannot name them, and `down` must
# unhold every hold the tool placed before it purges (apt-get purge -y refuses to change a held
# package, "Held packages were changed and -y was used without --allow-change-held-packages",
# and then removes nothing of the whole list). One already held (the operator's) is not claimed.
INSTALLED_NVIDIA = ("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' "
                    + " ".join(f"'{p}*'" for p in HOLD_PREFIXES) + " 2>/dev/null | awk '/^[^h]i/ {print $2}'")
HELD_ON_HOST = f"{STATE_DIR}/packages-held.txt"
HOLD_WHAT_CAME_WITH = (f"came=$({INSTALLED_NVIDIA}); [ -z \"$came\" ] || {{ apt-mark hold $came >/dev/null && "
                       f"mkdir -p {STATE_DIR} && printf '%s\\n' $came >> {HELD_ON_HOST}; }}")
# dpkg's db:Status-Abbrev: the selection first ('h': on hold), then the state ('i': installed).
HELD_NOW = "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' $h 2>/dev/null | awk '/^h/ {print $2}'"
# The toolkit's dependencies (NVIDIA's packages since 1.17): `down` removes them with it.
TOOLKIT_DEPENDENCIES = ("nvidia-container-toolkit-base", "libnvidia-container-tools", "libnvidia-container1")


def component_packages(inventory: Inventory, gpu: bool) -> list[str]:
    return [name for name, needed in COMPONENT_PACKAGES.items() if needed(inventory, gpu)]


def is_driver_package(name: str) -> bool:
    return name.startswith(DRIVER_PREFIXES)


def needs_host_toolkit(inventory: Inventory) -> bool:
    # With driver: operator the GPU Operator installs its own toolkit.
    return inventory.gpu.driver != "operator"


def toolkit_source_line(inventory: Inventory, arch: str) -> str:
    if inventory.gpu.container_toolkit.apt_source:
        return inventory.gpu.container_toolkit.apt_source
    return f"deb [signed-by={TOOLKIT_KEYRING}] {NVIDIA_REPO}/stable/deb/{arch} /"


def install_toolkit(source_line: str) -> list[str]:
    lines = []
    if TOOLKIT_KEYRING in source_line:
        lines += [placing.SCRATCH, f"curl -fsSL {NVIDIA_REPO}/gpgkey -o \"$scratch/gpgkey\"",
                  placing.place('"$scratch"/gpgkey', 0o644, TOOLKIT_KEYRING)]
    # Refresh only this source: fast, and does not stall on unreachable distribution mirrors.
    lines.append(f"{APT_ENV} apt-get update -q -o Dir::Etc::sourcelist={TOOLKIT_SOURCE} "
                 "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
    lines.append(f"{APT_ENV} apt-get install -y -q --no-install-recommends {TOOLKIT}")
    return lines


def plan(draft: Draft, packages: list[str], toolkit_source: str | None, facts: HostFacts) -> None:
    """Install what is missing, then hold every NVIDIA package (the toolkit included)."""
    installed_by_us = set(draft.manifest.get("packages_installed", []))
    to_install = [p for p in packages if p not in facts.packages]
    if to_install:
        draft.add(Action.INSTALL_PACKAGES,
                  [f"{APT_ENV} apt-get update -q && {APT_ENV} apt-get install -y -q "
                   f"--no-install-recommends {' '.join(shlex.quote(p) for p in to_install)}"],
                  f"install packages {', '.join(to_install)}")
        installed_by_us |= set(to_install)
    new_toolkit = bool(toolkit_source) and TOOLKIT not in facts.packages
    if new_toolkit:
        draft.add(Action.INSTALL_TOOLKIT, install_toolkit(toolkit_source), f"install {TOOLKIT}")
        installed_by_us.add(TOOLKIT)
        draft.restart = True  # k3s detects the nvidia runtime when it starts
    if installed_by_us:
        draft.manifest["packages_installed"] = sorted(installed_by_us)

    nvidia = [p for p in facts.packages if p.startswith(HOLD_PREFIXES)] + ([TOOLKIT] if new_toolkit else [])
    to_hold = sorted(set(nvidia) - set(facts.held_packages))
    brings_nvidia = new_toolkit or any(p.startswith(HOLD_PREFIXES) or is_driver_package(p) for p in to_install)
    if to_hold or brings_nvidia:
        lines = [f"apt-mark hold {' '.join(shlex.quote(p) for p in to_hold)} >/dev/null"] if to_hold else []
        lines += [HOLD_WHAT_CAME_WITH] if brings_nvidia else []
        what = " and ".join(filter(None, [", ".join(to_hold), "the NVIDIA packages the install brings" if brings_nvidia else ""]))
        draft.add(Action.HOLD_PACKAGES, lines, f"hold {what} against unattended upgrades")
    # Every hold placed that the plan can name: the driver an install brings (gpu.driver: host)
    # is held by HOLD_WHAT_CAME_WITH once installed, and must be unheld before `down` purges it.
    placed = set(to_hold) | {p for p in to_install if p.startswith(HOLD_PREFIXES)}
    if placed:
        draft.manifest["packages_held"] = sorted(set(draft.manifest.get("packages_held", [])) | placed)


def apt_lists_prefix(source_line: str) -> str | None:
    """apt names list files after URI and suite: `http://10.0.0.1:8000/ ./` -> 10.0.0.1:8000_."""
    match = re.search(r"\s\w+://(\S+)\s+(\S+)", source_line)
    if not match:
        return None
    uri, suite = match.groups()
    return (uri.rstrip("/") + "/" + suite).rstrip("/").replace("/", "_")


def unhold_recorded_on_host() -> str:
    """The line that unholds what the installs held and recorded on the host (HELD_ON_HOST),
    where dpkg still has it on hold. Only names of a package's form are read from that file,
    and nothing runs without one: dpkg-query without names would list every package."""
    return (f"if [ -f {HELD_ON_HOST} ]; then h=$(awk '/^[a-z0-9][a-z0-9.+-]*$/' {HELD_ON_HOST} | sort -u); "
            f"[ -z \"$h\" ] || h=$({HELD_NOW}); [ -z \"$h\" ] || apt-mark unhold $h >/dev/null 2>&1 || true; fi")


def teardown(manifest: dict, purge_drivers: bool, toolkit_source: str | None) -> tuple[list[str], dict]:
    """The lines that remove what the tool installed, and what of it stays the tool's
    (drivers kept without --purge-drivers, with their holds) for the manifest to keep."""
    held = manifest.get("packages_held", [])
    installed = manifest.get("packages_installed", [])
    remove = [p for p in installed if purge_drivers or not is_driver_package(p)]
    keep = [p for p in installed if p not in remove]
    # Keep holds on drivers we keep; a package purged is unheld first whoever held it (a
    # manifest from before the driver's hold was recorded does not list it).
    unhold = [p for p in held if p in remove or p not in installed]
    unhold += [p for p in remove if p not in unhold]
    lines = []
    if not keep:
        lines.append(unhold_recorded_on_host())
    # The names were read back from the host: quoted like any host string.
    if unhold:
        lines.append(f"apt-mark unhold {' '.join(shlex.quote(p) for p in unhold)} >/dev/null 2>&1 || true")
    if remove:
        lines.append(f"purge_failed=; {APT_ENV} apt-get purge -y -q {' '.join(shlex.quote(p) for p in remove)} >/dev/null "
                     "|| purge_failed=1")
    prefix = apt_lists_prefix(toolkit_source) if toolkit_source else None
    if TOOLKIT in remove:
        # what its install brought and held (HOLD_WHAT_CAME_WITH), where dpkg has it
        deps = " ".join(TOOLKIT_DEPENDENCIES)
        lines.append(f"deps=$(dpkg-query -W -f='${{db:Status-Abbrev}} ${{Package}}\\n' {deps} 2>/dev/null | awk '/^.i/ {{print $2}}'); "
                     f"[ -z \"$deps\" ] || {{ apt-mark unhold $deps >/dev/null; {APT_ENV} apt-get purge -y -q $deps >/dev/null "
                     "|| purge_failed=1; }")
    if prefix and TOOLKIT in remove:
        lines.append(f"rm -f /var/lib/apt/lists/{shlex.quote(prefix)}_*")
    if TOOLKIT in remove:
        lines.append(f"rm -f {TOOLKIT_KEYRING}")  # fetched by curl when NVIDIA's repository is used
    if remove:
        # A purge that failed (apt's error is on stderr) keeps the record of what the tool
        # installed and fails the host: removed, the next `down --purge-drivers` could not
        # know what to finish, and `exit 0` had said the host was clean.
        lines.append(PURGE_FAILED_STOPS)
    kept = {"packages_installed": keep, "packages_held": [p for p in held if p in keep]} if keep else {}
    return lines, kept


PURGE_FAILED_STOPS = ('[ -z "$purge_failed" ] || { echo "apt-get purge failed (its error is above): the record of '
                      'what bootstrap installed is kept; run bootstrap down again once apt works" >&2; '
                      'exit 1; }')
