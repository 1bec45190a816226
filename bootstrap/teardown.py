"""What `down` runs on a host: undo k3s and everything the tool recorded in its host manifest.

Pure: the script is built from the manifest the probe read back, so only what the tool
did is undone (packages it installed, packages it held, sysctls it changed, swap it turned off).
"""

from __future__ import annotations

import re
import shlex

from bootstrap.hostplan import desired as d

DRIVER_PREFIXES = ("nvidia-driver", "nvidia-dkms", "linux-modules-nvidia", "nvidia-kernel", "firmware-misc-nonfree",
                   "cuda-drivers", "linux-headers")
K3S_DIRS = ("/etc/rancher/k3s", "/etc/rancher/node", "/var/lib/rancher/k3s", "/var/lib/kubelet", "/run/k3s",
            "/run/flannel", "/var/lib/cni", "/var/log/pods", "/var/log/containers")
K3S_LINKS = ("cni0", "flannel.1", "flannel-v6.1", "flannel-wg", "flannel-wg-v6", "kube-ipvs0")


def is_driver_package(name: str) -> bool:
    return name.startswith(DRIVER_PREFIXES)


def apt_lists_prefix(source_line: str) -> str | None:
    """apt names list files after URI and suite: `http://10.0.0.1:8000/ ./` -> 10.0.0.1:8000_."""
    match = re.search(r"\s\w+://(\S+)\s+(\S+)", source_line)
    if not match:
        return None
    uri, suite = match.groups()
    return (uri.rstrip("/") + "/" + suite).rstrip("/").replace("/", "_")


def teardown_script(manifest: dict, *, purge_drivers: bool, toolkit_source: str | None = None) -> str:
    lines = [
        "for u in k3s k3s-agent; do systemctl stop $u.service 2>/dev/null; systemctl disable $u.service 2>/dev/null; done",
        # What k3s-killall.sh does: containers outlive the service (KillMode=process).
        "pkill -9 -f '/var/lib/rancher/k3s/data/[^/]*/bin/containerd' 2>/dev/null",
        "pkill -9 -x 'k3s|k3s-server|k3s-agent' 2>/dev/null",
        "for m in $(awk '$2 ~ \"^/(run/k3s|var/lib/rancher/k3s|var/lib/kubelet|run/netns/cni-)\" {print $2}' "
        "/proc/self/mounts | sort -r); do umount -l \"$m\" 2>/dev/null; done",
        f"for l in {' '.join(K3S_LINKS)}; do ip link delete $l 2>/dev/null; done",
        "for t in iptables ip6tables; do command -v $t-save >/dev/null 2>&1 || continue; "
        "$t-save | grep -viE 'KUBE-|CNI-|FLANNEL|flannel' | $t-restore; done",
        f"rm -rf {' '.join(K3S_DIRS)}",
    ]
    files = [f for f in manifest.get("files", []) if f != d.MANIFEST]
    files += [d.K3S_BINARY, d.unit_path_for("k3s"), d.unit_path_for("k3s-agent")]
    lines.append("rm -f " + " ".join(shlex.quote(f) for f in sorted(set(files))))
    lines.append("rmdir /etc/rancher /var/lib/rancher 2>/dev/null")
    lines.append("systemctl daemon-reload")
    for key, value in sorted(manifest.get("sysctl_before", {}).items()):
        lines.append(f"sysctl -q -w {key}={shlex.quote(str(value))} 2>/dev/null")
    if manifest.get("swap_disabled"):
        lines.append("sed -i -E 's/^# bootstrap-swapoff: //' /etc/fstab && rm -f /etc/fstab.bootstrap-bak && swapon -a")
    held = manifest.get("packages_held", [])
    installed = manifest.get("packages_installed", [])
    remove = [p for p in installed if purge_drivers or not is_driver_package(p)]
    unhold = [p for p in held if p in remove or p not in installed]  # keep holds on drivers we keep
    if unhold:
        lines.append(f"apt-mark unhold {' '.join(unhold)} >/dev/null")
    if remove:
        lines.append(f"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {' '.join(remove)} >/dev/null")
    prefix = apt_lists_prefix(toolkit_source) if toolkit_source else None
    if prefix and "nvidia-container-toolkit" in remove:
        lines.append(f"rm -f /var/lib/apt/lists/{shlex.quote(prefix)}_*")
    keep = [p for p in installed if p not in remove]
    if keep:
        # Drivers stay: keep the manifest of what remains ours so --purge-drivers can finish later.
        lines.append(f"printf '%s\\n' {shlex.quote(_json({'packages_installed': keep, 'packages_held': [p for p in held if p in keep]}))} > {d.MANIFEST}")
    else:
        lines.append("rm -rf /var/lib/bootstrap")
    return "\n".join(lines) + "\nexit 0\n"


def _json(value) -> str:
    import json

    return json.dumps(value, sort_keys=True)
