"""`bootstrap diagnose`: a support bundle, one .tar.gz (0600) in the state folder.

Per host, in parallel over the hosts session the other commands use, one round trip: the k3s
unit's state and journal, config.yaml, registries.yaml, containerd's generated config,
`nvidia-smi -q`, the Xid lines, addresses and routes, disk, memory, and the facts probe `up`
runs (bootstrap.diagnosis.host_script). From the cluster when its API answers: nodes,
events, every failing pod with its description and log tail, Helm releases. Then the tool's
recent run logs and the inventory. Every member goes through one Redactor (bootstrap.
redaction): the secrets the tool knows, by value, and whatever sits under a secret's key name.

It reads, never changes: a host that does not answer is named in the summary, an API that
does not answer leaves the host half; neither stops the bundle."""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import subprocess
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml

from bootstrap import __version__
from bootstrap import diagnosis as d
from bootstrap.cluster.client import LOG_READ_S, connect as connect_to_cluster, get, pod_log, reusing_ssh
from bootstrap.errors import BootstrapError
from bootstrap.remote.connections import open_hosts
from bootstrap.state.lock import cluster_lock
from bootstrap.redaction import Redactor, kubeconfig_secrets
from bootstrap.remote_data import RemoteDataError, decode, loads
from bootstrap.state.folder import write_atomically
from bootstrap.state.secrets import resolve
from bootstrap.topology import resolve_topology
from bootstrap.remote.remote_output import run_command, sh_command
from bootstrap.host.facts.pyinfra_fact import HostFactsFact
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.checks.preflight import gpu_health_findings
from bootstrap.cluster.helm import HelmError, helm_binary

STATE_SECRETS = ("token", "agent-token")
STATE_KUBECONFIGS = ("kubeconfig", "kubeconfig-tunnel")
MAX_STATE_FILE_BYTES = 1024 * 1024
HELM_TIMEOUT_S = 60
MAX_HELM_OUTPUT = 8 * 1024 * 1024
# A name that may go into an API path: a DNS subdomain (namespaces, pods) or label (containers).
_API_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
BUNDLE_NAME = re.compile(r"diagnose-\d{8}-\d{6}\.tar\.gz")


def diagnose(inventory, state, console, *, open_session=open_hosts, connect=connect_to_cluster,
             read_host=None, list_releases=None, now=time.time) -> tuple[Path, list[str]]:
    """Collect, redact, write the bundle: (its path, the summary's lines)."""
    read_host = read_host or read_over_ssh
    list_releases = list_releases or helm_releases
    redactor = known_secrets(inventory, state)
    stamp = time.gmtime(now())
    findings = d.Findings(inventory.cluster, time.strftime("%Y-%m-%d %H:%M:%S UTC", stamp), __version__,
                          hosts_total=len(inventory.nodes))
    with cluster_lock(state, "diagnose"):
        with open_session(inventory, list(inventory.nodes), "diagnose", console) as session:
            host_members, facts = collect_hosts(session, inventory, read_host, findings)
            cluster_members = collect_cluster(inventory, state, reusing_ssh(connect, session), list_releases,
                                              findings)
        findings.problems[:0] = gpu_health_problems(inventory, facts)
        # Printed as written into the bundle: redacted too (a pod's status message is anyone's text).
        summary = [redactor.apply(line) for line in d.summary(findings)]
        members = {"summary.txt": "\n".join(summary) + "\n"}
        members.update(host_members)
        members.update(cluster_members)
        members.update(run_logs(state))
        members["inventory.yaml"] = read_local(Path(inventory.source)) if inventory.source else ""
        path = state.path / f"diagnose-{time.strftime('%Y%m%d-%H%M%S', stamp)}.tar.gz"
        write_atomically(path, bundle({name: redactor.apply(text) for name, text in members.items()}, now()))
    return path, summary


# --- secrets -----------------------------------------------------------------------------

def known_secrets(inventory, state) -> Redactor:
    """Every secret the tool can know of: the state folder's tokens and kubeconfig keys, and
    the credentials the inventory names (read where they can be; one that cannot is one the
    hosts cannot have got from the tool either)."""
    redactor = Redactor()
    for name in STATE_SECRETS:
        redactor.add(read_local(state.path / name), name.replace("-", " "))
    snapshots = state.path / "snapshots"
    for token_file in sorted(snapshots.glob("*.token")) if snapshots.is_dir() else ():
        redactor.add(read_local(token_file), "snapshot token")
    for name in STATE_KUBECONFIGS:
        text = read_local(state.path / name)
        try:
            config = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            config = None
        for value, what in kubeconfig_secrets(config):
            redactor.add(value, what)
    references = []
    s3 = inventory.k3s.snapshots.s3
    if s3 is not None:
        references += [(s3.access_key, "S3 access key"), (s3.secret_key, "S3 secret key")]
    for host, auth in inventory.registries.auth.items():
        references += [(auth.password, "registry password"), (auth.token, "registry token")]
    for node in inventory.nodes:
        ssh = inventory.ssh_for(node)
        references += [(ssh.password, "ssh password"), (ssh.key_passphrase, "ssh key passphrase")]
    for ref, what in references:
        if ref is None:
            continue
        try:
            redactor.add(ref.value or resolve(ref, what), what)
        except BootstrapError:
            continue
    return redactor


def read_local(path: Path, limit: int = MAX_STATE_FILE_BYTES, *, tail: bool = False) -> str:
    """A local file's text ('' when absent or unreadable), never through a symlink, capped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        if tail:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(size - limit, 0))
        data = handle.read(limit)
    return data.decode("utf-8", "replace")


# --- hosts -------------------------------------------------------------------------------

def read_over_ssh(session, inventory, node, script: str) -> bytes:
    """The script's output from `node` over the session's own connection, as root (sudo -n
    where the inventory says so), capped and with a deadline (bootstrap.remote.remote_output)."""
    client = session.ssh_client(node.name)
    if client is None:
        raise RemoteDataError("no SSH connection to run it on")
    sudo = "sudo -H -n " if inventory.ssh_for(node).use_sudo else ""
    return run_command(client, sudo + sh_command(script), max_bytes=d.MAX_HOST_BYTES, timeout=d.HOST_TIMEOUT_S,
                       what="the diagnose probe")[1]


def collect_hosts(session, inventory, read_host, findings: d.Findings) -> tuple[dict[str, str], dict]:
    """({member: text}, {node: HostFacts}); every host at once, one round trip each."""
    boundary = secrets.token_hex(16)
    script = d.host_script(boundary, HostFactsFact().command(health=True))
    for name, failure in session.failures.items():
        findings.unreachable[name] = failure.render()
    nodes = [n for n in inventory.nodes if n.name not in session.failures]

    def read(node):
        try:
            return node, read_host(session, inventory, node, script), None
        except RemoteDataError as exc:
            return node, None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a dropped connection: this host's answer is missing
            return node, None, f"SSH error ({type(exc).__name__})"

    members: dict[str, str] = {}
    facts: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        answers = list(pool.map(read, nodes))
    for node, output, error in answers:
        if output is None:
            findings.unreachable[node.name] = f"the diagnose probe failed: {error}"
            continue
        sections = d.split_sections(output, boundary)
        for section in d.HOST_SECTIONS:
            members[d.host_member(node.name, section)] = decode(sections.get(section, b"(no output)\n"),
                                                               limit=d.MAX_HOST_BYTES, what=section)
        units = d.parse_units(members[d.host_member(node.name, "k3s-unit")])
        findings.problems += [f"{node.name}: {problem}" for problem in d.unit_problems(units)]
        host_facts = parse_facts(sections.get(d.FACTS_SECTION))
        if host_facts is None:
            findings.notes.append(f"{node.name}: the facts probe's output could not be read")
        else:
            facts[node.name] = host_facts
            members[d.host_member(node.name, d.FACTS_SECTION)] = json.dumps(
                host_facts.to_dict(), indent=1, sort_keys=True, default=str) + "\n"
    return members, facts


def parse_facts(output: bytes | None):
    if not output:
        return None
    try:
        return parse_host_facts(output, received_at=time.time())
    except Exception:  # noqa: BLE001 - a parser's trouble with one host's bytes: that host's facts only
        return None


def gpu_health_problems(inventory, facts: dict) -> list[str]:
    """Health errors as `bootstrap health` finds them (checked even where the inventory turned
    the probe off: asked for explicitly)."""
    strict = replace(inventory, gpu=replace(inventory.gpu, health="strict"))
    try:
        found = gpu_health_findings(strict, facts, resolve_topology(inventory, facts).gpu_nodes_of(inventory))
    except Exception:  # noqa: BLE001 - the bundle matters more than this line of its summary
        return []
    return [f"{node}: GPU health: {f.message}" for node, items in found.items() for f in items
            if f.severity == "health-error"]


# --- cluster -----------------------------------------------------------------------------

def collect_cluster(inventory, state, connect, list_releases, findings: d.Findings) -> dict[str, str]:
    """The cluster's members; with no API, none, and why in the summary."""
    members: dict[str, str] = {}
    try:
        with connect(inventory, state) as cluster:
            read_cluster(cluster, list_releases, members, findings)
    except BootstrapError as exc:
        if not members:
            findings.api = exc.message
        else:
            findings.notes.append(f"the API stopped answering midway: {exc.message}")
    return members


def read_cluster(cluster, list_releases, members: dict[str, str], findings: d.Findings) -> None:
    nodes = (get(cluster, "/api/v1/nodes") or {}).get("items", []) or []
    members["cluster/nodes.json"] = as_json([node_view(n) for n in nodes])
    for node in nodes:
        findings.problems += d.node_problems(node)
    events = d.sorted_events((get(cluster, "/api/v1/events") or {}).get("items", []) or [])
    members["cluster/events.txt"] = "".join(d.event_line(e) + "\n" for e in events)
    pods = (get(cluster, "/api/v1/pods") or {}).get("items", []) or []
    members["cluster/pods.txt"] = "".join(
        f"{p.get('metadata', {}).get('namespace')}/{p.get('metadata', {}).get('name')} "
        f"{p.get('status', {}).get('phase')} node={p.get('spec', {}).get('nodeName')}\n" for p in pods)
    failing = [p for p in pods if d.pod_failing(p)]
    logs_until = time.monotonic() + d.LOGS_S
    for index, pod in enumerate(failing[:d.MAX_PODS_DESCRIBED]):
        findings.problems.append(d.pod_problem(pod))
        meta = pod.get("metadata", {})
        members[d.pod_member(index, meta.get("namespace", ""), meta.get("name", ""))] = describe_pod(
            cluster, pod, [e for e in events if (e.get("involvedObject") or {}).get("uid") == meta.get("uid")],
            logs_until)
    if len(failing) > d.MAX_PODS_DESCRIBED:
        findings.notes.append(f"{len(failing) - d.MAX_PODS_DESCRIBED} more failing pods not described")
    try:
        releases = list_releases(cluster.kubeconfig)
    except BootstrapError as exc:
        findings.notes.append(f"Helm releases not listed: {exc.message}")
        return
    members["cluster/helm-releases.json"] = as_json(releases)
    findings.problems += [p for p in (d.release_problem(r) for r in releases) if p]


def node_view(node: dict) -> dict:
    status = node.get("status", {})
    return {"name": node.get("metadata", {}).get("name"), "labels": node.get("metadata", {}).get("labels"),
            "taints": node.get("spec", {}).get("taints"), "unschedulable": node.get("spec", {}).get("unschedulable"),
            "conditions": status.get("conditions"), "addresses": status.get("addresses"),
            "nodeInfo": status.get("nodeInfo"), "capacity": status.get("capacity"),
            "allocatable": status.get("allocatable")}


def describe_pod(cluster, pod: dict, events: list[dict], logs_until: float | None = None) -> str:
    """The pod (without managedFields), its events, the log tail of each of its first
    MAX_CONTAINERS_LOGGED containers, read until `logs_until` (time.monotonic())."""
    meta = dict(pod.get("metadata", {}))
    meta.pop("managedFields", None)
    parts = [as_json(dict(pod, metadata=meta)), "\n--- events\n", "".join(d.event_line(e) + "\n" for e in events)]
    namespace, name = meta.get("namespace", ""), meta.get("name", "")
    containers = [c.get("name", "") for c in (pod.get("spec", {}).get("initContainers") or [])
                  + (pod.get("spec", {}).get("containers") or [])]
    if len(containers) > d.MAX_CONTAINERS_LOGGED:
        parts.append(f"\n--- {len(containers) - d.MAX_CONTAINERS_LOGGED} more containers: their logs not read\n")
    for container in containers[:d.MAX_CONTAINERS_LOGGED]:
        parts.append(f"\n--- log of container {d.safe_name(container)}, last {d.LOG_TAIL_LINES} lines\n")
        if logs_until is not None and time.monotonic() > logs_until:
            parts.append(f"(not read: diagnose's {d.LOGS_S} s for pod logs were spent)\n")
            continue
        if not all(_API_NAME.fullmatch(str(n)) for n in (namespace, name, container)):
            parts.append("(a name the API should not have accepted: not read)\n")
            continue
        try:
            # A read begun just before the budget's end ends with it (a trickling kubelet).
            read_s = LOG_READ_S if logs_until is None else min(LOG_READ_S, max(logs_until - time.monotonic(), 1.0))
            status, text = pod_log(cluster, f"/api/v1/namespaces/{namespace}/pods/{name}", container=container,
                                   max_bytes=d.LOG_LIMIT_BYTES, tail_lines=d.LOG_TAIL_LINES, read_s=read_s)
        except BootstrapError as exc:
            parts.append(f"(not read: {exc.message})\n")
            continue
        text = str(text)[-d.LOG_LIMIT_BYTES:]
        parts.append(text if status < 300 else f"(the API answered {status}: {text[:500]})\n")
    return "".join(parts)


def helm_releases(kubeconfig: Path) -> list[dict]:
    """`helm list` of every release in every namespace, any status, as JSON."""
    # Status filters rather than --all, which Helm 4 dropped (it lists every status by default).
    argv = [helm_binary(), "list", "--all-namespaces", "--deployed", "--failed", "--pending", "--uninstalling",
            "--output", "json", "--kubeconfig", str(kubeconfig)]
    try:
        result = subprocess.run(argv, capture_output=True, timeout=HELM_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelmError(f"helm list failed ({type(exc).__name__})") from None
    if result.returncode != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[:500]
        raise HelmError(f"helm list failed: {said or f'exit status {result.returncode}'}")
    try:
        releases = loads(result.stdout or b"[]", what="helm list", max_chars=MAX_HELM_OUTPUT)
    except RemoteDataError as exc:
        raise HelmError(str(exc)) from None
    return [r for r in releases if isinstance(r, dict)] if isinstance(releases, list) else []


# --- the rest ----------------------------------------------------------------------------

def run_logs(state) -> dict[str, str]:
    """The newest run logs of the tool, the tail of each."""
    folder = state.path / "logs"
    if not folder.is_dir() or folder.is_symlink():
        return {}
    logs = sorted((p for p in folder.iterdir() if p.is_file() and not p.is_symlink()),
                  key=lambda p: p.stat().st_mtime)[-d.RUN_LOGS_KEPT:]
    return {f"logs/{d.safe_name(p.name)}": read_local(p, d.RUN_LOG_BYTES, tail=True) for p in logs}


def as_json(value) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str) + "\n"


def bundle(members: dict[str, str], mtime: float) -> bytes:
    """A .tar.gz of `members` in order (summary.txt first): regular files, 0600, no owner."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in members.items():
            data = text.encode("utf-8", "replace")
            info = tarfile.TarInfo(f"diagnose/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(mtime)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
