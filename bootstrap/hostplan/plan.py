"""Compare what a host should hold with what its facts say it holds: the changes to make.

Pure. The result says, per host, which files to write, what to run as root to prepare the
host, and whether k3s must start or restart, so `up` on a converged host does nothing and
`plan` can show the same answer without changing anything.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from bootstrap.facts.model import HostFacts
from bootstrap.hostplan import desired as d
from bootstrap.images import missing
from bootstrap.inventory.model import Node
from bootstrap.rules import ownership

TOOLKIT = "nvidia-container-toolkit"


@dataclass
class HostPlan:
    node: Node
    unit: str
    uploads: list[d.FileSpec] = field(default_factory=list)
    prepare: list[str] = field(default_factory=list)  # shell lines run as root after files are placed
    service: str | None = None  # None | "start" | "restart"
    changes: list[str] = field(default_factory=list)  # for people: what will change (no secrets)
    verify_nvidia_runtime: bool = False
    prepull: list[str] = field(default_factory=list)  # images to pull once k3s runs

    @property
    def changed(self) -> bool:
        return bool(self.uploads or self.prepare or self.service or self.prepull)


def plan_host(node: Node, desired: d.Desired, facts: HostFacts, cluster_id: str, cluster: str) -> HostPlan:
    """`cluster_id`/`cluster`: recorded in the host's manifest, so a later `down` or another
    cluster's `up` knows whose host this is."""
    plan = HostPlan(node=node, unit=d.unit_name(node))
    manifest = ownership.record(facts.manifest, cluster_id, cluster)
    restart = False

    for spec in desired.files:
        current = facts.files.get(spec.path)
        if current is None or current.sha256 != spec.sha256:
            plan.uploads.append(spec)
            plan.changes.append(f"{'create' if current is None else 'update'} {spec.path}")
            restart |= spec.restarts_k3s
        elif current.mode != spec.mode:
            plan.prepare.append(f"chmod {spec.mode:o} {shlex.quote(spec.path)}")
            plan.changes.append(f"chmod {spec.mode:o} {spec.path}")

    if desired.k3s_download is not None:
        installed = facts.k3s.version if facts.k3s else None
        if installed != desired.k3s_download.version:
            plan.prepare += download_k3s(desired.k3s_download)
            plan.changes.append(f"download k3s {desired.k3s_download.version} ({installed or 'not installed'})")
            restart = True

    if facts.swap_mib:
        plan.prepare.append(SWAP_OFF)
        plan.changes.append(f"turn off {facts.swap_mib} MiB swap (and its /etc/fstab lines)")
        manifest["swap_disabled"] = True
    missing_modules = [m for m in d.MODULES if m not in facts.modules]
    if missing_modules:
        plan.prepare.append(f"modprobe -a {' '.join(missing_modules)}")
        plan.changes.append(f"load kernel modules {', '.join(missing_modules)}")
    sysctl_before = dict(manifest.get("sysctl_before", {}))
    for key, value in d.SYSCTLS.items():
        current = facts.sysctls.get(key)
        if current != value:
            if current is not None:
                sysctl_before.setdefault(key, current)
            plan.prepare.append(f"sysctl -q -w {key}={value}")
            plan.changes.append(f"set {key}={value} (was {current if current is not None else 'unset'})")
    if sysctl_before:
        manifest["sysctl_before"] = sysctl_before

    installed_by_us = set(manifest.get("packages_installed", []))
    to_install = [p for p in desired.packages if p not in facts.packages]
    if to_install:
        plan.prepare.append(f"{APT_ENV} apt-get update -q && {APT_ENV} apt-get install -y -q "
                            f"--no-install-recommends {' '.join(shlex.quote(p) for p in to_install)}")
        plan.changes.append(f"install packages {', '.join(to_install)}")
        installed_by_us |= set(to_install)
    if desired.toolkit_source and TOOLKIT not in facts.packages:
        plan.prepare += install_toolkit(desired)
        plan.changes.append(f"install {TOOLKIT}")
        installed_by_us.add(TOOLKIT)
        restart = True  # k3s detects the nvidia runtime when it starts
    if installed_by_us:
        manifest["packages_installed"] = sorted(installed_by_us)

    # A driver upgraded under a running node breaks NVML until reboot: hold NVIDIA packages.
    nvidia = [p for p in facts.packages if p.startswith(("nvidia-", "libnvidia-", "cuda-drivers"))]
    if desired.toolkit_source and TOOLKIT not in facts.packages:
        nvidia.append(TOOLKIT)
    to_hold = sorted(set(nvidia) - set(facts.held_packages))
    if to_hold:
        plan.prepare.append(f"apt-mark hold {' '.join(to_hold)} >/dev/null")
        plan.changes.append(f"hold {', '.join(to_hold)} against unattended upgrades")
        manifest["packages_held"] = sorted(set(manifest.get("packages_held", [])) | set(to_hold))

    if any(u.path == d.unit_path(node) for u in plan.uploads):
        plan.prepare.append("systemctl daemon-reload")
    unit = facts.k3s.unit(f"{plan.unit}.service") if facts.k3s else None
    if unit is None or unit.unit_file_state != "enabled":
        plan.prepare.append(f"systemctl enable {plan.unit}.service 2>/dev/null")
        plan.changes.append(f"enable {plan.unit}.service")
    if unit is None or not unit.active:
        plan.service = "start"
        plan.changes.append(f"start {plan.unit}")
    elif restart:
        plan.service = "restart"
        plan.changes.append(f"restart {plan.unit} (its configuration changed)")

    archives = [u.path for u in plan.uploads if u.image_archive]
    if archives and plan.service is None:
        # k3s runs and keeps running: import what it would only read at its next start.
        plan.prepare += [f"k3s ctr -n k8s.io images import {shlex.quote(a)} >/dev/null" for a in archives]
        plan.changes.append(f"import images from {', '.join(a.rsplit('/', 1)[-1] for a in archives)}")

    manifest["files"] = sorted(set(manifest.get("files", [])) | set(desired.paths()))
    manifest["unit"] = plan.unit
    if manifest != facts.manifest:
        # First: if a later install fails, the record of what may be ours is already there.
        plan.uploads.insert(0, d.text_file(d.MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n"))
    plan.prepull = missing(desired.prepull, facts.images)
    if plan.prepull:
        plan.changes.append(f"pull images {', '.join(plan.prepull)}")
    if desired.gpu and d.needs_host_toolkit_runtime(desired):
        runtimes = facts.containerd.runtimes if facts.containerd else []
        plan.verify_nvidia_runtime = plan.service is not None or "nvidia" not in runtimes
    return plan


APT_ENV = "DEBIAN_FRONTEND=noninteractive"
SWAP_OFF = ("swapoff -a && sed -i.bootstrap-bak -E "
            "'/^[^#].*[[:space:]]swap[[:space:]]/ s/^/# bootstrap-swapoff: /' /etc/fstab")


def install_toolkit(desired: d.Desired) -> list[str]:
    lines = []
    if d.TOOLKIT_KEYRING in desired.toolkit_source:
        lines.append(f"curl -fsSL {d.NVIDIA_REPO}/gpgkey -o {d.TOOLKIT_KEYRING}")
    # Refresh only this source: fast, and does not stall on unreachable distribution mirrors.
    lines.append(f"{APT_ENV} apt-get update -q -o Dir::Etc::sourcelist={d.TOOLKIT_SOURCE} "
                 "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
    lines.append(f"{APT_ENV} apt-get install -y -q --no-install-recommends {TOOLKIT}")
    return lines


def download_k3s(artifacts) -> list[str]:
    name = "k3s" if artifacts.arch == "amd64" else f"k3s-{artifacts.arch}"
    return [
        "tmp=$(mktemp -d)",
        f"curl -fsSL -o \"$tmp/{name}\" {shlex.quote(artifacts.download_url)}",
        f"curl -fsSL -o \"$tmp/sums\" {shlex.quote(artifacts.checksums_url)}",
        f"(cd \"$tmp\" && grep -E ' \\*?{name}$' sums | sha256sum -c --quiet -)",
        f"install -m 0755 \"$tmp/{name}\" {d.K3S_BINARY}",
        "rm -rf \"$tmp\"",
    ]
