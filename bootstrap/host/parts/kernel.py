"""Kernel settings k3s needs: modules, sysctls, swap off.

Persisted in files the tool owns, so they survive a reboot. The sysctl values it changed
and the swap it turned off are recorded in the host manifest, so `down` puts them back.
"""

from __future__ import annotations

import shlex

from bootstrap import templates
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.base import Action, Draft, FileSpec, text_file

MODULES_FILE = "/etc/modules-load.d/bootstrap-k3s.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-bootstrap-k3s.conf"
PATHS = (MODULES_FILE, SYSCTL_FILE)

# module -> the probe's other sign that it is there: a built-in one has no /sys/module entry.
LOADED_SIGN = {
    "br_netfilter": "[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]",
    "overlay": "grep -qw overlay /proc/filesystems",
}
MODULES = tuple(LOADED_SIGN)
IPV6_FORWARDING = "net.ipv6.conf.all.forwarding"
SYSCTLS = {  # every setting the probe reads; sysctls() says which a cluster wants
    "net.ipv4.ip_forward": "1",
    IPV6_FORWARDING: "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}


def sysctls(ipv6_pods: bool) -> dict[str, str]:
    """IPv6 forwarding only where pods have IPv6 addresses: on a host that takes its IPv6
    address by SLAAC, all.forwarding=1 makes the kernel ignore router advertisements
    (accept_ra=1 applies only to non-forwarding hosts), and the host loses its IPv6 route
    when its lease runs out (k3s itself sets it only for IPv6 clusters: k3s-io/k3s
    pkg/agent/syssetup/setup.go, Configure(enableIPv6, ...))."""
    return {k: v for k, v in SYSCTLS.items() if ipv6_pods or k != IPV6_FORWARDING}
# Commented out, not deleted, so `down` can give the machine its swap back.
FSTAB_MARK = "# bootstrap-swapoff: "
SWAP_OFF = ("swapoff -a && sed -i.bootstrap-bak -E "
            f"'/^[^#].*[[:space:]]swap[[:space:]]/ s/^/{FSTAB_MARK}/' /etc/fstab")
SWAP_ON = f"sed -i -E 's/^{FSTAB_MARK}//' /etc/fstab && rm -f /etc/fstab.bootstrap-bak && swapon -a"


def probe_functions() -> str:
    """The probe's modules and sysctl sections (shell functions p_modules, p_sysctl)."""
    checks = "".join(f"  {{ [ -d /sys/module/{m} ] || {sign}; }} && echo {m}\n" for m, sign in LOADED_SIGN.items())
    return (f"p_modules() {{\n{checks}  return 0\n}}\n"
            "p_sysctl() {\n"
            f"  for k in {' '.join(SYSCTLS)}; do f=/proc/sys/$(echo \"$k\" | tr . /); "
            "[ -r \"$f\" ] && echo \"$k=$(cat \"$f\")\"; done; return 0\n}")


def files(wanted: dict[str, str]) -> list[FileSpec]:
    return [text_file(MODULES_FILE, templates.render("host/modules-k3s.conf")),
            text_file(SYSCTL_FILE, templates.render("host/sysctl-k3s.conf.j2", sysctls=wanted))]


def plan(draft: Draft, facts: HostFacts, wanted: dict[str, str]) -> None:
    """Apply now what the files make permanent; record what was there before. A setting
    the tool changed earlier and no longer wants gets its old value back."""
    if facts.swap_mib:
        draft.add(Action.TURN_OFF_SWAP, [SWAP_OFF], f"turn off {facts.swap_mib} MiB swap (and its /etc/fstab lines)")
        draft.manifest["swap_disabled"] = True
    missing = [m for m in MODULES if m not in facts.modules]
    if missing:
        draft.add(Action.LOAD_MODULES, [f"modprobe -a {' '.join(missing)}"],
                  f"load kernel modules {', '.join(missing)}")
    before = dict(draft.manifest.get("sysctl_before", {}))
    for key in [k for k in before if k not in wanted]:
        value = before.pop(key)
        if facts.sysctls.get(key) != str(value):
            draft.add(Action.SET_SYSCTLS, [f"sysctl -q -w {key}={shlex.quote(str(value))}"],
                      f"set {key}={value} back (this cluster does not need it)")
    for key, value in wanted.items():
        current = facts.sysctls.get(key)
        if current != value:
            if current is not None:
                before.setdefault(key, current)
            draft.add(Action.SET_SYSCTLS, [f"sysctl -q -w {key}={value}"],
                      f"set {key}={value} (was {current if current is not None else 'unset'})")
    if before:
        draft.manifest["sysctl_before"] = before
    else:
        draft.manifest.pop("sysctl_before", None)


def teardown(manifest: dict) -> list[str]:
    """Put back the sysctl values and the swap the manifest says the tool changed."""
    lines = [f"sysctl -q -w {shlex.quote(f'{key}={value}')} 2>/dev/null"
             for key, value in sorted(manifest.get("sysctl_before", {}).items())]
    if manifest.get("swap_disabled"):
        lines.append(SWAP_ON)
    return lines
