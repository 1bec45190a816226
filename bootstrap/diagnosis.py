"""`bootstrap diagnose`: the pure parts. What each host runs (one script, one round trip),
how its answer is cut into sections, what looks wrong (the summary), and the archive's
member names. I/O lives in bootstrap.flows.diagnose.

A host's answer is untrusted: it is capped (bootstrap.remote.remote_output reads at most
MAX_HOST_BYTES), cut only at a boundary the tool chose for this run, and only the sections
the tool asked for are kept, each capped again. Member names are built here from the
inventory's node names (DNS labels) and the tool's own section names; names that come from
the API (pods) are reduced to a safe alphabet first.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from bootstrap.console_text import printable
from bootstrap.host.parts.k3s_service import CONFIG, CONTAINERD_CONFIG
from bootstrap.host.parts.registries import REGISTRIES

KIB = 1024
MIB = 1024 * KIB
# section -> (what it is, the shell that prints it, the most kept)
HOST_SECTIONS: dict[str, tuple[str, str, int]] = {
    "k3s-unit": ("the k3s unit's state",
                 "systemctl show k3s.service k3s-agent.service --no-pager "
                 "-p Id,LoadState,ActiveState,SubState,Result,NRestarts,ExecMainStatus,StateChangeTimestamp",
                 64 * KIB),
    "k3s-journal": ("the k3s unit's journal, last 400 lines",
                    "journalctl -u k3s.service -u k3s-agent.service -n 400 --no-pager -o short-iso", 2 * MIB),
    "config.yaml": ("k3s's config.yaml", f"cat {CONFIG}", 256 * KIB),
    "registries.yaml": ("k3s's registries.yaml", f"cat {REGISTRIES}", 256 * KIB),
    "containerd-config.toml": ("containerd's config, as k3s generated it", f"cat {CONTAINERD_CONFIG}", 512 * KIB),
    "nvidia-smi-q": ("nvidia-smi -q",
                     "if command -v nvidia-smi >/dev/null 2>&1; then timeout 60 nvidia-smi -q; "
                     "else echo 'nvidia-smi: not installed'; fi", 4 * MIB),
    "xid": ("the kernel's NVIDIA Xid lines, last 200",
            "{ dmesg 2>/dev/null || journalctl -k -b --no-pager; } | grep 'NVRM: Xid' | tail -n 200", 256 * KIB),
    "network": ("addresses and routes", "ip addr; echo; ip route show table all; echo; ip -6 route", 512 * KIB),
    "disk": ("disk usage", "df -hT; echo; df -i", 128 * KIB),
    "memory": ("memory", "free -m; echo; cat /proc/pressure/memory 2>/dev/null; uptime", 64 * KIB),
}
FACTS_SECTION = "facts"  # the facts probe `up` uses, run in the same round trip
SECTION_BYTES_CAP = {name: cap for name, (_, _, cap) in HOST_SECTIONS.items()}
SECTION_BYTES_CAP[FACTS_SECTION] = 16 * MIB
# What the tool reads from one host at most: every section at its cap, and headers.
MAX_HOST_BYTES = sum(SECTION_BYTES_CAP.values()) + 64 * KIB
HOST_TIMEOUT_S = 300
TRUNCATED = "\n[bootstrap diagnose: cut at {cap} bytes]\n"

# API: what is read about each failing pod, and how many are described.
LOG_TAIL_LINES = 200
LOG_LIMIT_BYTES = 256 * KIB
MAX_PODS_DESCRIBED = 50
# A pod's containers are what its spec lists, and a node's kubelet makes the spec of each
# mirror pod it runs: the logs of this many containers of a pod are read (the GPU Operator's
# validator, the largest the tool installs, has 5), in at most LOGS_S for all pods together.
# Before, 50 failing pods of thousands of containers each were read whole: hours with the
# cluster's lock held, and gigabytes.
MAX_CONTAINERS_LOGGED = 8
LOGS_S = 600
MAX_EVENTS = 1000
CRASHLOOP_RESTARTS = 3
SUMMARY_MAX_LINES = 200
RUN_LOGS_KEPT = 10
RUN_LOG_BYTES = 4 * MIB
_BOUNDARY = re.compile(r"[0-9a-f]{32}")


def host_script(boundary: str, facts_probe: str) -> str:
    """One POSIX sh script printing every section after a line `<boundary> <section>`; each
    command's output capped on the host too (the tool's own cap is the one that counts)."""
    if not _BOUNDARY.fullmatch(boundary):
        raise ValueError("the boundary is 32 hex digits")
    parts = []
    for name, (_, command, cap) in HOST_SECTIONS.items():
        parts.append(f"printf '\\n%s %s\\n' {boundary} {name}\n( {command} ) 2>&1 | head -c {cap}")
    parts.append(f"printf '\\n%s %s\\n' {boundary} {FACTS_SECTION}\nsh -c {shlex.quote(facts_probe)} 2>&1")
    return "\n".join(parts) + "\nexit 0\n"


def split_sections(output: bytes, boundary: str) -> dict[str, bytes]:
    """{section: bytes} for the sections the tool asked for, first occurrence each (a host
    that prints the boundary itself only garbles its own answer), each cut at its cap."""
    marker = re.compile(rb"^" + re.escape(boundary.encode()) + rb" ([\w.-]{1,40})\r?$", re.MULTILINE)
    found: dict[str, bytes] = {}
    matches = list(marker.finditer(output))
    for index, match in enumerate(matches):
        name = match.group(1).decode()
        if name not in SECTION_BYTES_CAP or name in found:
            continue
        end = matches[index + 1].start() if index + 1 < len(matches) else len(output)
        body = output[match.end() + 1:end]
        cap = SECTION_BYTES_CAP[name]
        found[name] = body[:cap] + (TRUNCATED.format(cap=cap).encode() if len(body) > cap else b"")
    return found


# --- unit state --------------------------------------------------------------------------

def parse_units(text: str) -> list[dict[str, str]]:
    """`systemctl show` of several units: one dict per unit (blank-line separated)."""
    units, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                units.append(current)
            current = {}
            continue
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z]{1,40}", key):
            current[key] = value
    if current:
        units.append(current)
    return units


def unit_problems(units: list[dict[str, str]]) -> list[str]:
    """The k3s unit that is installed but not running, or restarting over and over."""
    problems = []
    for unit in units:
        if unit.get("LoadState") != "loaded":
            continue
        name = unit.get("Id", "k3s")
        restarts = int(unit["NRestarts"]) if unit.get("NRestarts", "").isdigit() else 0
        state = f"{unit.get('ActiveState', '?')}/{unit.get('SubState', '?')}"
        if unit.get("ActiveState") not in ("active", "reloading") or unit.get("SubState") == "auto-restart":
            problems.append(f"{name} is {state} (result {unit.get('Result', '?')}, {restarts} restarts)")
        elif restarts >= CRASHLOOP_RESTARTS:
            problems.append(f"{name} restarted {restarts} times (crash loop?); now {state}")
    return problems


# --- cluster -----------------------------------------------------------------------------

def node_problems(node: dict) -> list[str]:
    """A Node that is not Ready, or has a pressure condition, named with the reason."""
    name = node.get("metadata", {}).get("name", "?")
    problems = []
    for condition in node.get("status", {}).get("conditions", []) or []:
        kind, status = condition.get("type"), condition.get("status")
        why = condition.get("reason") or ""
        if kind == "Ready" and status != "True":
            problems.append(f"node {name}: NotReady ({why}: {condition.get('message', '')})")
        elif kind != "Ready" and status == "True":
            problems.append(f"node {name}: {kind} ({why})")
    if node.get("spec", {}).get("unschedulable"):
        problems.append(f"node {name}: cordoned")
    return problems


def pod_failing(pod: dict) -> bool:
    """Not Running or Succeeded, or Running with a container that is not ready and waiting
    (CrashLoopBackOff, ImagePullBackOff) or restarting over and over."""
    status = pod.get("status", {})
    if status.get("phase") not in ("Running", "Succeeded"):
        return True
    if status.get("phase") == "Succeeded":
        return False
    for container in status.get("containerStatuses", []) or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting or (container.get("restartCount") or 0) >= CRASHLOOP_RESTARTS and not container.get("ready"):
            return True
    return False


def pod_problem(pod: dict) -> str:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    reasons = []
    for container in status.get("containerStatuses", []) or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") or container.get("restartCount"):
            reasons.append(f"{container.get('name')}: {waiting.get('reason') or 'not ready'}, "
                           f"{container.get('restartCount') or 0} restarts")
    phase = status.get("phase") or "?"
    detail = "; ".join(reasons) or status.get("reason") or status.get("message") or ""
    return f"pod {meta.get('namespace')}/{meta.get('name')}: {phase}" + (f" ({detail})" if detail else "")


def release_problem(release: dict) -> str | None:
    status = release.get("status")
    if status == "deployed":
        return None
    return f"helm release {release.get('namespace')}/{release.get('name')}: {status} ({release.get('chart')})"


def event_line(event: dict) -> str:
    involved = event.get("involvedObject", {}) or event.get("regarding", {}) or {}
    when = event.get("lastTimestamp") or event.get("eventTime") or event.get("metadata", {}).get("creationTimestamp")
    return (f"{when} {event.get('type', '?')} {involved.get('kind', '?')}/{involved.get('namespace', '')}/"
            f"{involved.get('name', '?')} {event.get('reason', '')}: {event.get('message') or event.get('note', '')}"
            f" (x{event.get('count') or 1})")


def sorted_events(events: list[dict]) -> list[dict]:
    def when(event):
        return str(event.get("lastTimestamp") or event.get("eventTime")
                   or event.get("metadata", {}).get("creationTimestamp") or "")

    return sorted(events, key=when)[-MAX_EVENTS:]


# --- summary -----------------------------------------------------------------------------

@dataclass
class Findings:
    """What the summary says, gathered while collecting."""

    cluster: str
    taken_at: str
    version: str
    hosts_total: int = 0
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why
    problems: list[str] = field(default_factory=list)
    api: str | None = None  # None: the API answered; else why not
    notes: list[str] = field(default_factory=list)  # what could not be collected, not a fault


def summary(findings: Findings) -> list[str]:
    """The summary's lines: printable, one per thing that looks wrong, capped."""
    answered = findings.hosts_total - len(findings.unreachable)
    lines = [f"bootstrap diagnose: cluster {findings.cluster}, {findings.taken_at}, bootstrap {findings.version}",
             f"hosts: {answered} of {findings.hosts_total} answered",
             "API: " + ("answered" if findings.api is None else f"no answer ({findings.api}): host half only")]
    problems = [f"host {name}: did not answer ({why})" for name, why in sorted(findings.unreachable.items())]
    problems += findings.problems
    if problems:
        lines.append(f"looks wrong ({len(problems)}):")
        lines += [f"  - {problem}" for problem in problems[:SUMMARY_MAX_LINES]]
        if len(problems) > SUMMARY_MAX_LINES:
            lines.append(f"  ... and {len(problems) - SUMMARY_MAX_LINES} more")
    else:
        lines.append("nothing looks wrong")
    lines += [f"note: {note}" for note in findings.notes]
    return [printable(line) for line in lines]


# --- member names ------------------------------------------------------------------------

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str, limit: int = 100) -> str:
    """A name from the API or a file name as a path part: a safe alphabet, never `.` or `..`."""
    cleaned = re.sub(r"\.{2,}", ".", _SAFE.sub("_", str(text)))[:limit].lstrip(".")
    return cleaned or "_"


def host_member(node: str, section: str) -> str:
    suffix = "" if section.endswith((".yaml", ".toml")) else ".json" if section == FACTS_SECTION else ".txt"
    return f"hosts/{safe_name(node)}/{section}{suffix}"


def pod_member(index: int, namespace: str, name: str) -> str:
    return f"cluster/pods/{index:03d}-{safe_name(namespace, 63)}_{safe_name(name, 120)}.txt"
