"""Preflight: everything that would make `up` fail, found before any host is changed.

Pure: inventory + facts in, findings out. Every error carries its fix; `up` changes
nothing on any host while one remains.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from bootstrap.console_text import printable
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.k3s_service import PROCESSES as K3S_PROCESSES, RANCHER_DIR
from bootstrap.inventory.kube import parse_taint
from bootstrap.inventory.model import Inventory, Node, Role
from bootstrap.checks import cuda, machine_kind, mig
from bootstrap.topology import Topology, named_gpu_node, resolve_topology
from bootstrap.host.parts.manifest import MANIFEST
from bootstrap.checks.ownership import ownership
from bootstrap.checks.gpu_health import health_issues
from bootstrap.checks.node_addresses import candidates, choose, on_host
from bootstrap.checks.providers import group_of, provider_groups, quorum_loss_by_provider

SUPPORTED_OS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}
SUPPORTED_ARCH = ("amd64", "arm64")
MIN_FREE_GIB = {"cpu": 10.0, "gpu": 30.0}  # CUDA images are several GB each
# port -> (proto, who needs it free)
PORTS = {6443: ("tcp", Role.SERVER), 10250: ("tcp", "all"), 8472: ("udp", "all")}
WIREGUARD_PORT = 51820  # flannel wireguard-native (IPv4)
EMBEDDED_MIRROR_PORT = 5001  # the embedded registry mirror's peer-to-peer port (Spegel)
OUR_PROCESSES = (*K3S_PROCESSES, "containerd")


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    message: str
    fix: str | None = None
    # error | warning | info | health-error, host-error (these two block their node only)
    severity: str = "error"

    def render(self) -> str:
        tag = {"error": "FAIL", "warning": "WARN", "info": "ok  ", "health-error": "FAIL",
               "host-error": "FAIL"}[self.severity]
        # Messages quote hosts (os name, hostname, sudo and GPU errors, listeners): each field
        # is one printable line, so a host cannot start a line of its own.
        text = f"{tag} {printable(self.node)}: {printable(self.check)}: {printable(self.message)}"
        return text + (f"\n       fix: {printable(self.fix)}" if self.fix else "")


def ownership_findings(inventory: Inventory, facts: dict[str, HostFacts], cluster_id: str) -> list[Finding]:
    """A host another cluster (or a hand-made k3s) owns is never changed. One whose manifest
    cannot be read is not changed either, and blocks only itself: what a host returns
    never stops the others."""
    findings = []
    for node in inventory.nodes:
        if node.name in facts:
            owner = ownership(facts[node.name], cluster_id)
            if owner.verdict == "unknown":
                findings.append(Finding(
                    node.name, "owner", f"{owner.reason}; whose host this is cannot be told, bootstrap will "
                                        "not change it", f"look at {MANIFEST} on the host: if the host is this "
                                        "cluster's, remove that file and run the command again",
                    "host-error"))
            if owner.verdict == "foreign":
                findings.append(Finding(
                    node.name, "owner", f"{owner.reason}; bootstrap will not change it",
                    "remove it from this inventory, or tear that cluster down first with its own inventory "
                    "(bootstrap down); if it is this cluster and its state folder was lost, restore the state "
                    "folder (identity.json, token) from where `up` ran before"))
    return findings


def preflight(inventory: Inventory, facts: dict[str, HostFacts], topology: Topology | None = None) -> list[Finding]:
    """The host checks. `topology`: the run's, resolved after the probe (made here when not given)."""
    topology = topology or resolve_topology(inventory, facts)
    findings: list[Finding] = []
    ports = dict(PORTS)
    if inventory.k3s.flannel_backend == "wireguard-native":
        del ports[8472]
        ports[WIREGUARD_PORT] = ("udp", "all")  # flannel's WireGuard listens there instead of VXLAN
    if topology.embedded_mirror:
        ports[EMBEDDED_MIRROR_PORT] = ("tcp", "all")
    for node in inventory.nodes:
        host = facts.get(node.name)
        if host is None:
            continue  # unreachable: reported by the session
        findings += check_host(inventory, node, host, ports, gpu_node=topology.is_gpu(node.name))
    findings += unused_gpus(topology)
    findings += gpu_setup_dropped(inventory, facts, topology)
    findings += nowhere_to_schedule(inventory, topology)
    findings += check_unique_hostnames(inventory, facts)
    findings += check_node_addresses(inventory, facts)
    findings += check_clock_skew(inventory, facts)
    gpu = topology.gpu_nodes_of(inventory)
    findings += check_providers(inventory, facts, gpu)
    findings += [f for issues in gpu_health_findings(inventory, facts, gpu).values() for f in issues]
    return findings


def gpu_health_findings(inventory: Inventory, facts: dict[str, HostFacts], gpu: list[Node]) -> dict[str, list[Finding]]:
    """Each GPU node's health issues as findings. They never fail preflight as a whole: with
    gpu.health strict, `up` leaves a node with an error out (blocked_nodes); otherwise an
    error is reported as a warning that says strict would block."""
    if inventory.gpu.health == "off":
        return {}
    nodes = [n for n in gpu if n.name in facts and facts[n.name].gpu_health is not None]
    out: dict[str, list[Finding]] = {}
    for node in nodes:
        host = facts[node.name]
        expected, source = expected_gpus(inventory, node, host)
        issues = health_issues(host.gpu_health, host.xids or [], wants_mig=bool(inventory.sharing_for(node).mig),
                               expected_gpus=expected, expected_from=source)
        out[node.name] = [Finding(node.name, f"gpu-health:{i.check}", i.message
                                  + ("" if i.severity != "error" or inventory.gpu.health == "strict"
                                     else " (gpu.health: strict would leave this node out)"), i.fix,
                                  "warning" if i.severity == "warning" or inventory.gpu.health != "strict"
                                  else "health-error")
                          for i in issues]
        if source != PINNED and not any(i.check == "gpu-count" for i in issues):
            out[node.name] += more_gpus_elsewhere(node, nodes, facts)
    return out


PINNED = "gpu.count in the inventory"


def expected_gpus(inventory: Inventory, node: Node, host: HostFacts) -> tuple[int | None, str]:
    """The GPUs `node` should show nvidia-smi, and who says so: the operator (gpu.count), else
    the node itself (the NVIDIA GPUs on its own PCI bus: one that fell off the bus or lost its
    driver is still a PCI device). Never a peer: a host may claim any number of GPUs."""
    pinned = inventory.gpu_count_for(node)
    if pinned is not None:
        return pinned, PINNED
    on_bus = sum(1 for device in host.nvidia_pci if device.is_gpu)
    return (on_bus, "NVIDIA GPUs on its own PCI bus") if on_bus else (None, "")


def more_gpus_elsewhere(node: Node, nodes: list[Node], facts: dict[str, HostFacts]) -> list[Finding]:
    """A warning, never an error: a node of the same GPU model shows more GPUs. It may be
    another machine type, or a host that claims what it has not; only gpu.count decides."""
    host = facts[node.name]
    models = {g.name for g in host.gpus}
    more = [(len(facts[n.name].gpus), n.name) for n in nodes
            if n.name != node.name and models & {g.name for g in facts[n.name].gpus}
            and len(facts[n.name].gpus) > len(host.gpus)]
    if not more:
        return []
    count, peer = max(more)
    return [Finding(node.name, "gpu-health:gpu-count",
                    f"{len(host.gpus)} GPU(s) visible to nvidia-smi; {peer}, with the same model, reports {count} "
                    "(not checked: a node is held to the inventory and its own answers)",
                    f"if this node should have {count}, write gpu.count: {count} for it (nodes[].gpu.count) and "
                    "it fails the check until it shows them", "warning")]


def blocked_nodes(findings: list[Finding]) -> dict[str, list[Finding]]:
    """The nodes a finding leaves out of `up` while the others go on (a GPU health error
    under gpu.health strict, a host whose answers cannot be used), with those findings."""
    blocked: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.severity in ("health-error", "host-error"):
            blocked.setdefault(finding.node, []).append(finding)
    return blocked


def health_blocked(findings: list[Finding]) -> dict[str, list[Finding]]:
    """gpu.health strict: the nodes a health error leaves out of `up`, with their errors."""
    blocked: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.severity == "health-error":
            blocked.setdefault(finding.node, []).append(finding)
    return blocked


# etcd warns from 1 s of drift between members ("prober found high clock drift":
# etcd-io/etcd server/etcdserver/api/rafthttp/probing_status.go, v3.5); a certificate a
# server issued is "not yet valid" on a node whose clock is behind.
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 30.0
CLOCK_FIX = ("turn on time synchronisation on the host (sudo timedatectl set-ntp true, or install chrony) "
             "and check it with timedatectl")


def check_clock_skew(inventory: Inventory, facts: dict[str, HostFacts]) -> list[Finding]:
    """Each host's clock against the others' (their median), as read at the end of the
    probe; a few hundred milliseconds are the network's, not the clock's. The median is the
    peers' word: a host reporting a clock far off moves it (of two nodes, both are then off
    from it), so a node fails only when its own clock is off from this machine's as well
    (`clock_offset_s`: its clock less this machine's when its answer came); off from the
    others alone, it is a warning."""
    offsets = {n.name: facts[n.name].clock_offset_s for n in inventory.nodes
               if n.name in facts and facts[n.name].clock_offset_s is not None}
    if len(offsets) < 2:
        return []
    median = statistics.median(offsets.values())
    findings = []
    for name, offset in offsets.items():
        skew = offset - median
        if abs(skew) < CLOCK_WARN_S:
            continue
        own = abs(offset) >= CLOCK_FAIL_S  # this machine's clock says so too
        severity = "error" if abs(skew) >= CLOCK_FAIL_S and own else "warning"
        agrees = "" if own or abs(skew) < CLOCK_FAIL_S else \
            f"; this machine's clock is within {CLOCK_FAIL_S:.0f} s of it, so another clock may be the one off"
        findings.append(Finding(name, "clock", f"its clock is {abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} "
                                "the other nodes' (etcd and TLS certificates need clocks within a second or so)"
                                + agrees, CLOCK_FIX, severity))
    return findings


def check_providers(inventory: Inventory, facts: dict[str, HostFacts], gpu: list[Node]) -> list[Finding]:
    """Across providers: WireGuard on every node, servers that can form etcd, RDMA within
    one provider, and a warning when one provider holds the control plane's majority."""
    findings = []
    if inventory.k3s.flannel_backend == "wireguard-native":
        for node in inventory.nodes:
            host = facts.get(node.name)
            if host is not None and host.has_wireguard is False:
                findings.append(Finding(
                    node.name, "wireguard", "the WireGuard kernel module is missing; flannel's wireguard-native "
                    "backend (network.mode public) cannot create its interface and k3s stops",
                    "install WireGuard for this OS (Ubuntu, Debian: sudo apt install wireguard) so the kernel has "
                    "the wireguard module, or use a kernel with it (Linux 5.6 or newer builds it)"))
    layout = quorum_loss_by_provider(inventory)
    if layout:
        findings.append(Finding(inventory.servers[0].name, "quorum", layout,
                                "spread the servers so that no provider holds a majority (one per provider, "
                                "three providers)", severity="warning"))
    if not inventory.network.public:
        return findings
    servers = [s for s in inventory.servers if s.name in facts]
    if len({group_of(s) for s in servers}) > 1 and len(servers) > 1:
        chosen = {s.name: choose(inventory, s, facts) for s in servers}
        private = [(name, c.internal) for name, c in chosen.items() if c.nat]
        if private:
            findings.append(Finding(
                servers[0].name, "etcd", "servers at different providers must reach each other on their node-ip "
                "(k3s's embedded etcd peers on it: k3s-io/k3s pkg/cli/server/server.go), and "
                + ", ".join(f"{name}'s node-ip {ip}" for name, ip in private) + " is private (behind a NAT)",
                "keep every server at one provider (they share its private network) and spread the agents, or "
                "use servers whose public address is on their own interface"))
    if inventory.network.rdma:
        findings += rdma_across_providers(inventory, gpu)
    return findings


def _layout(groups: dict[str, list[Node]]) -> str:
    return ", ".join(f"{p} ({', '.join(n.name for n in ns)})" for p, ns in groups.items())


def rdma_across_providers(inventory: Inventory, gpu: list[Node]) -> list[Finding]:
    """RDMA stays within one provider. The GPU nodes the operator named (and the GPU servers,
    whose operator holds the cluster) set where: split among providers, that is the
    inventory's error. An agent that is a GPU node only by its own GPUs is judged alone: at
    another provider it fails itself (host-error), and with no named GPU node to say where
    RDMA runs it is a warning of its own, so one host's PCI line never stops the run."""
    named = [n for n in gpu if n.role == Role.SERVER or named_gpu_node(n)]
    groups = provider_groups(named)
    if len(groups) > 1:
        return [Finding(inventory.nodes[0].name, "rdma", "RDMA does not cross providers: the GPU nodes are at "
                        + _layout(groups), "remove network.rdma, or keep the RDMA nodes at one provider in a "
                        "cluster of their own")]
    claimed = provider_groups([n for n in gpu if n not in named])
    if not groups:  # nothing the operator wrote says where RDMA runs: each claimant is told
        split = len(claimed) > 1
        return [Finding(n.name, "rdma", "RDMA does not cross providers, and the nodes whose own GPUs make them "
                        f"GPU nodes are at {_layout(claimed)}", "name the RDMA nodes GPU nodes (nodes[].gpu: "
                        "{enabled: true}) at one provider, the others gpu: {enabled: false}", "warning")
                for ns in claimed.values() if split for n in ns]
    return [Finding(n.name, "rdma", f"its own GPUs make it a GPU node at {p}, and RDMA does not cross providers: "
                    f"the RDMA nodes are at {_layout(groups)}", "set gpu: {enabled: false} on this node (it joins "
                    "without its GPUs), or move it to that provider", "host-error")
            for p, ns in claimed.items() if p not in groups for n in ns]


def check_node_addresses(inventory: Inventory, facts: dict[str, HostFacts]) -> list[Finding]:
    """node-ip must be an address of the host itself: k3s exits, and systemd restarts it
    forever, when no interface holds it (bootstrap.checks.node_addresses says where k3s
    checks). Behind a 1:1 NAT the SSH address is not on the host: say what is used instead."""
    findings = []
    for node in inventory.nodes:
        host = facts.get(node.name)
        if host is None:
            continue
        if host.addresses is None:
            findings.append(Finding(node.name, "node-ip", "cannot list the host's addresses (`ip` failed); "
                                    "node-ip is the inventory address", "install iproute2 on the host",
                                    severity="warning"))
            continue
        own = ", ".join(f"{a.interface} {a.address}/{a.prefix}" for a in candidates(inventory, host)) or "none"
        if node.node_ip and not on_host(host, node.node_ip):
            findings.append(Finding(
                node.name, "node-ip", f"node_ip {node.node_ip} is not an address of this host (its addresses: "
                f"{own}); k3s would exit at start: no interface holds its node IP",
                "set nodes[].node_ip to one of the host's addresses, or remove it and bootstrap "
                "chooses the one that reaches the other nodes"))
            continue
        chosen = choose(inventory, node, facts)
        if chosen.internal is None:
            findings.append(Finding(node.name, "node-ip", f"{node.address} is not on this host and it has no "
                                    "other global address for cluster traffic", "set nodes[].node_ip"))
        elif chosen.nat:
            findings.append(Finding(
                node.name, "node-ip", f"{node.address} is not on this host (a NAT); node-ip {chosen.internal} "
                f"({chosen.how}), node-external-ip {node.address}", severity="info"))
    return findings


def check_unique_hostnames(inventory: Inventory, facts: dict[str, HostFacts]) -> list[Finding]:
    by_hostname: dict[str, list[str]] = defaultdict(list)
    for node in inventory.nodes:
        if node.name in facts and facts[node.name].hostname:
            by_hostname[facts[node.name].hostname].append(node.name)
    # A warning only: a hostname is each host's own answer, which a rented host may copy from
    # another to stop it, and k3s does not go by it here: every node registers under its
    # inventory name (config.yaml's node-name, bootstrap.host.plan.k3sconfig), whose node
    # password and etcd member name are keyed by that name.
    findings = []
    for hostname, names in by_hostname.items():
        if len(names) > 1:
            for name in names:
                findings.append(Finding(name, "hostname",
                                        f"hostname {hostname!r} is shared by {', '.join(names)} (each joins under "
                                        "its inventory name, so k3s tells them apart; logs and tools that go by "
                                        "hostnames may not)",
                                        f"on {name}: sudo hostnamectl set-hostname {name}", "warning"))
    return findings


def unused_gpus(topology: Topology) -> list[Finding]:
    """Agents whose GPUs go unused: nothing in the inventory asks for GPUs and no server has
    one (bootstrap.topology.gpu_cluster), and an agent's own claim sets up no cluster."""
    return [Finding(name, "gpu", "reports NVIDIA GPUs, but nothing in the inventory asks for GPUs and no server "
                                 "has one: the cluster is set up without them (no GPU Operator, no embedded "
                                 "registry mirror; a host's own claim changes no other host)",
                    "to use them, name it a GPU node: gpu: {enabled: true} on this node (nodes[].gpu), "
                    "or write the cluster's gpu: settings", "warning")
            for name in topology.unused_gpus]


def gpu_setup_dropped(inventory: Inventory, facts: dict[str, HostFacts], topology: Topology) -> list[Finding]:
    """A cluster an earlier version made a GPU cluster (it counted the agents' own GPUs) whose
    inventory does not make one now: its next `up` would drop every agent's GPU setup and the
    embedded mirror and restart the servers. Told by the servers' own answers alone (whoever
    runs a server holds the cluster): one started with `embedded-registry: true`, the tool's
    default only in a GPU cluster. Refused before any host is changed; an agent's answer
    counts for nothing here."""
    if inventory.images.embedded_mirror is not None or topology.embedded_mirror:
        return []  # the operator chose the mirror, or the cluster is a GPU cluster
    running = [s.name for s in inventory.servers
               if s.name in facts and facts[s.name].k3s and facts[s.name].k3s.embedded_registry]
    if not running:
        return []
    return [Finding(running[0], "gpu-cluster", f"{', '.join(running)} run{'s' if len(running) == 1 else ''} "
                    "k3s with the embedded registry mirror, which the tool turns on only in a GPU cluster, and "
                    "this inventory makes none (nothing asks for GPUs and no server has one; an earlier version "
                    "counted the agents' own GPUs): this run would drop every agent's GPU setup and the mirror "
                    "and restart the servers",
                    "keep it a GPU cluster: add `gpu: {}` to the inventory, or gpu: {enabled: true} on the GPU "
                    "nodes (nodes[].gpu); to end its GPU setup on purpose, set images.embedded_mirror: false")]


def nowhere_to_schedule(inventory: Inventory, topology: Topology) -> list[Finding]:
    """Every server tainted NoSchedule or NoExecute by the inventory and every agent a GPU node
    the acceptance gate holds: the Deployments the tool installs tolerate the control-plane
    taint at most (the GPU Operator's, NFD's; Volcano's none: bootstrap.cluster.gate_rules.
    may_hold), so none has a node, `helm install --wait` times out and the gate never opens
    (the all-GPU deadlock of issue 32 item 1, by the inventory's own taints)."""
    if not inventory.gpu.gate.enabled or any(n.role == Role.AGENT and not topology.is_gpu(n.name) for n in inventory.nodes):
        return []
    blocking = {s.name: [t for t in s.taints if (parts := parse_taint(t)) and parts[2] in ("NoSchedule", "NoExecute")]
                for s in inventory.servers}
    if not all(blocking.values()):
        return []
    return [Finding(inventory.servers[0].name, "schedulable", "every server is tainted ("
                    + "; ".join(f"{name}: {', '.join(taints)}" for name, taints in blocking.items())
                    + ") and every agent is a GPU node the acceptance gate holds until it passes: the Deployments "
                    "the tool installs tolerate the control-plane taint at most (Volcano's none), so they have "
                    "nowhere to run, the Helm installs time out and the gate never opens",
                    "leave one server without a NoSchedule/NoExecute taint (PreferNoSchedule keeps work off it "
                    "while leaving room), add a CPU agent, or set gpu: {gate: false}", "warning")]


def check_host(inventory: Inventory, node: Node, host: HostFacts, ports: dict | None = None,
               *, gpu_node: bool) -> list[Finding]:
    """`gpu_node`: the run's topology's word (bootstrap.topology: the one rule)."""
    out: list[Finding] = []

    def fail(check, message, fix=None, severity="error"):
        out.append(Finding(node.name, check, message, fix, severity))

    if host.sudo_ok is False:
        fail("sudo", f"sudo needs a password ({host.sudo_error})",
             "allow passwordless sudo for the SSH user (bootstrap runs sudo -n; "
             "ssh.password_env is for SSH login only)")
    if (host.os_id, host.os_version_id) not in SUPPORTED_OS:
        fail("os", f"{host.os_pretty or host.os_id or 'unknown OS'} is not supported",
             "use Ubuntu 22.04/24.04 or Debian 12")
    if host.arch not in SUPPORTED_ARCH:
        fail("arch", f"architecture {host.arch or 'unknown'} is not supported", "use an amd64 or arm64 machine")
    for verdict in machine_kind.judge(host):  # a container sold as a "GPU pod" cannot run k3s
        fail("machine", verdict.message, verdict.fix, verdict.severity)
    need = MIN_FREE_GIB["gpu" if gpu_node else "cpu"]
    free = host.disk_free_gib.get(RANCHER_DIR, host.disk_free_gib.get("/"))
    if free is not None and free < need:
        fail("disk", f"{free:.1f} GiB free for {RANCHER_DIR}, {need:.0f} GiB needed",
             "free space or attach a larger disk")
    k3s_installed = bool(host.k3s and host.k3s.units)
    for port, (proto, who) in (ports or PORTS).items():
        if who == Role.SERVER and node.role != Role.SERVER:
            continue
        listener = host.listener(port, proto)
        # flannel's VXLAN socket belongs to the kernel (no process) and outlives a stopped k3s:
        # ours when k3s is installed here.
        ours = (listener.process or "") in OUR_PROCESSES if listener else True
        if listener and not ours and not (listener.process is None and k3s_installed):
            owner = listener.process or "an unknown process"
            fail("ports", f"{proto} port {port} is taken by {owner}",
                 f"stop {owner} on this host; k3s needs port {port}")
    if host.swap_mib:
        fail("swap", f"{host.swap_mib} MiB swap is on; it will be turned off (kubelet needs it off)",
             None, severity="warning")
    if gpu_node:
        out += check_gpu(inventory, node, host)
    if inventory.network.rdma and gpu_node:
        out += check_rdma(inventory, node, host)
    return out


def check_gpu(inventory: Inventory, node: Node, host: HostFacts) -> list[Finding]:
    out: list[Finding] = []
    mode = inventory.gpu.driver

    def fail(check, message, fix=None, severity="error"):
        out.append(Finding(node.name, check, message, fix, severity))

    if not host.gpu_hardware:
        fail("gpu", "no NVIDIA GPU found (nvidia-smi and PCI)",
             "remove gpu.enabled: true from this node, or check the machine type you rented")
        return out
    if mode == "preinstalled":
        if host.gpu_error:
            fail("driver", f"nvidia-smi fails: {host.gpu_error}",
                 "repair the host's NVIDIA driver (often a reboot after a driver upgrade), "
                 "or set gpu.driver: host to have it installed")
            return out
        if not host.has_gpu:
            fail("driver", "no NVIDIA driver on the host (nvidia-smi not found)",
                 "install the driver, or set gpu.driver: host (distribution packages) or operator")
            return out
    elif mode == "operator" and (host.has_gpu or host.gpu_error):
        fail("driver", f"a host driver is already installed ({host.driver_version or host.gpu_error}); "
             "the GPU Operator's driver container cannot load beside it",
             "set gpu.driver: preinstalled to use the host's driver")
        return out
    if host.has_gpu:
        wanted = inventory.gpu.cuda
        summary = f"{len(host.gpus)} x {host.gpus[0].name}, driver {host.driver_version}, CUDA {host.cuda_version}"
        problem = cuda.driver_problem(host.driver_version or "0", wanted, host.cuda_version) if wanted else None
        if problem and mode != "operator":
            fail("cuda", f"{problem} ({summary})", cuda.upgrade_hint(wanted))
        else:
            fail("gpu", summary + (f", supports CUDA {wanted}" if wanted else ""), severity="info")
    sharing = inventory.sharing_for(node)
    if sharing.mig:
        out += check_mig(node, host, sharing.mig)
    return out


def check_mig(node: Node, host: HostFacts, layout) -> list[Finding]:
    if not host.has_gpu:
        return []  # driver installed by `up`; checked on the next run when the table is known
    model = host.gpus[0].name
    if not host.mig_capable:
        return [Finding(node.name, "mig", f"{model} is not MIG-capable",
                        "use time_slicing or mps on this node, or a MIG-capable GPU (A100, H100, H200, ...)")]
    findings = []
    for index in sorted({g.index for g in host.gpus}):
        try:
            mig.check_layout(layout, host.mig_profiles, index)
        except mig.MigMisfit as exc:
            table = mig.table_for_gpu(host.mig_profiles, index)
            findings.append(Finding(node.name, "mig", f"GPU {index} ({model}): {exc}",
                                    "choose from this GPU's profiles: "
                                    + ", ".join(f"{n} x{p.instances_total}" for n, p in table.items())))
            break  # identical GPUs give identical answers
    return findings


def check_rdma(inventory: Inventory, node: Node, host: HostFacts) -> list[Finding]:
    wanted = node.rdma_interfaces if node.rdma_interfaces is not None else inventory.network.rdma.interfaces
    by_netdev = {netdev: dev for dev in host.rdma for netdev in dev.netdevs}
    have = ", ".join(f"{d.name} ({', '.join(d.netdevs) or 'no netdev'})" for d in host.rdma) or "none"
    findings = []
    for interface in wanted:
        if interface not in by_netdev:
            findings.append(Finding(node.name, "rdma", f"interface {interface} has no RDMA device (RDMA devices: {have})",
                                    "fix network.rdma.interfaces (or this node's rdma_interfaces) to name "
                                    "netdevs that have an RDMA device"))
    return findings
