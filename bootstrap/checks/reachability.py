"""Which node must reach which, on which port, and what the probes found. Pure.

Rented machines sit behind their provider's firewall (security groups, cloud firewalls),
which often lets only SSH in. k3s's inbound rules (k3s-io/docs
docs/installation/requirements.md, "Inbound Rules for K3s Nodes", commit 005d295):

    TCP 2379-2380  servers -> servers     embedded etcd (the tool always runs it)
    TCP 6443       all nodes -> servers   k3s supervisor and Kubernetes API server
    UDP 8472       all -> all             flannel VXLAN
    UDP 51820      all -> all             flannel WireGuard (51821 with IPv6)
    TCP 10250      all -> all             kubelet
    TCP 5001, 6443 all -> all             embedded registry mirror (Spegel)

and, with validate.nccl, what its job uses on the host network (bootstrap.checks.nccl_ports)
between the GPU nodes NCCL may pair (those at one provider), on their node-ip:

    TCP 12022-12133   sshd of the workers, Open MPI's out-of-band and TCP transport (pinned)
    TCP 32768-60999   NCCL's own sockets (the kernel's ephemeral range: NCCL cannot pin them)

Every pair is probed on the address the cluster will use (each node's node-ip) before any
host changes. Nodes that both run k3s already are one cluster: the running cluster is the
evidence, so a converged cluster is not probed at all (a no-op `up` costs no round trip).

The overlay's UDP probe also measures the path MTU (the "path MTU" section): flannel sizes
its overlay from its interface's MTU, so a path that carries less fragments the overlay's
full-size packets (slower: a warning), or loses them where it drops fragments (an error).

A probe proves where it came from (the last section): every node knows the run, so a bare
word would let any node (or anyone on the path) claim "A reached B" for a pair it is not
part of. Each ordered pair gets its own key, derived from a run secret that never leaves
the tool, and each host is given only the MACs of the probes it sends or receives.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory, Node, Role
from bootstrap.checks.preflight import Finding
from bootstrap.checks import nccl_ports
from bootstrap.checks.node_addresses import choose, on_host


@dataclass(frozen=True)
class Rule:
    proto: str  # "tcp" | "udp"
    port: int
    what: str
    servers_only: bool = False  # only servers receive it
    between_servers: bool = False  # only servers send and receive it
    between_gpus: bool = False  # only the GPU nodes NCCL may pair (one provider's) send and receive it
    opens: str = ""  # the range the fix opens, when the port stands for one ("12022-12133")

    @property
    def label(self) -> str:
        return f"{self.proto.upper()} {self.port}"


# validate.nccl's job: each range is probed at both ends (a firewall opens ranges, so a rule
# that lets both through lets the middle); the workers' sshd is the pinned block's first port.
_NCCL = f"validate.nccl: sshd and Open MPI, TCP {nccl_ports.span(nccl_ports.PINNED)}"
_NCCL_SOCKETS = f"validate.nccl: NCCL's sockets, the kernel's ephemeral TCP {nccl_ports.span(nccl_ports.EPHEMERAL)}"
NCCL_RULES = tuple(Rule("tcp", port, what, between_gpus=True, opens=nccl_ports.span(ports))
                   for ports, what in ((nccl_ports.PINNED, _NCCL), (nccl_ports.EPHEMERAL, _NCCL_SOCKETS))
                   for port in ports)


def rules(inventory: Inventory, embedded_mirror: bool, family: int = 4) -> list[Rule]:
    out = [Rule("tcp", 6443, "k3s supervisor and API server", servers_only=not embedded_mirror),
           Rule("tcp", 10250, "kubelet")]
    if len(inventory.servers) > 1:
        out += [Rule("tcp", 2379, "etcd clients", between_servers=True),
                Rule("tcp", 2380, "etcd peers", between_servers=True)]
    backend = inventory.k3s.flannel_backend
    if backend == "vxlan":
        out.append(Rule("udp", 8472, "flannel VXLAN"))
    elif backend == "wireguard-native":
        out.append(Rule("udp", 51821 if family == 6 else 51820, "flannel WireGuard"))
    if embedded_mirror:
        out.append(Rule("tcp", 5001, "embedded registry mirror"))
    if inventory.validate.nccl and inventory.validate.nccl.enabled:
        out += NCCL_RULES
    return out


def runs_k3s(facts: HostFacts | None) -> bool:
    return bool(facts and facts.k3s and any(u.active for u in facts.k3s.units))


@dataclass(frozen=True)
class Probe:
    sender: str
    receiver: str
    address: str  # the receiver's cluster address
    proto: str
    port: int
    listen: bool  # a short-lived listener answers; False: the receiver's running k3s does (TCP)
    bind: str = ""  # the receiver's own address its listener binds (the one `address` reaches)
    mtu: int = 0  # the overlay's probe: the sender's interface MTU, where full-size datagrams start (0: none)
    interface: str = ""  # the sender's interface that MTU is of (flannel-iface: the one holding node-ip)


@dataclass(frozen=True)
class Untested:
    sender: str
    receiver: str
    label: str  # "UDP 8472"
    why: str


@dataclass
class ProbePlan:
    probes: list[Probe]
    untested: list[Untested]
    addresses: dict[str, str]  # node -> the address the cluster uses for it
    family: int = 4
    public: bool = False  # network.mode public: the addresses are the inventory's (public) ones
    providers: dict[str, str] = field(default_factory=dict)  # node -> its provider, where the inventory says
    node_ips: dict[str, str] = field(default_factory=dict)  # node -> its node-ip (etcd's and NCCL's address)

    def label(self, node: str) -> str:
        """A node as the matrix and the findings name it: with its provider, when known."""
        return f"{node} ({self.providers[node]})" if node in self.providers else node

    def listeners(self) -> dict[str, list[tuple[str, int, str]]]:
        """receiver -> the (proto, port, address)s its listener binds: the node's own address
        under test, never the wildcard (other interfaces, a public one included, stay shut)."""
        out: dict[str, list[tuple[str, int, str]]] = {}
        for p in self.probes:
            if p.listen and (p.proto, p.port, p.bind) not in out.setdefault(p.receiver, []):
                out[p.receiver].append((p.proto, p.port, p.bind))
        return out


def plan_probes(inventory: Inventory, facts: dict[str, HostFacts], embedded_mirror: bool,
                gpu_nodes: Collection[str] = ()) -> ProbePlan:
    """`gpu_nodes`: the run's GPU nodes (bootstrap.topology), between which validate.nccl's
    ports are probed."""
    internal = {n.name: choose(inventory, n, facts).internal or n.address for n in inventory.nodes}
    # network.mode public: nodes reach each other at their inventory (public) addresses,
    # except etcd, which k3s runs on node-ip (k3s-io/k3s pkg/cli/server/server.go: etcd's
    # PrivateIP is the first node-ip).
    addresses = {n.name: n.address for n in inventory.nodes} if inventory.network.public else internal
    family = 6 if any(":" in a for a in addresses.values()) else 4
    probes, untested = [], []
    nodes = [n for n in inventory.nodes if n.name in facts]
    for receiver in nodes:
        there = facts[receiver.name]
        for sender in nodes:
            here = facts[sender.name]
            if sender.name == receiver.name or (runs_k3s(here) and runs_k3s(there)):
                continue
            for rule in rules(inventory, embedded_mirror, family):
                if not _applies(rule, sender, receiver, gpu_nodes):
                    continue
                why = _cannot_probe(rule, here, there)
                if why:
                    untested.append(Untested(sender.name, receiver.name, rule.label, why))
                    continue
                # etcd and the NCCL workers (host network: their pod IP is the node's
                # InternalIP) use node-ip in every network mode.
                on_node_ip = rule.between_servers or rule.between_gpus
                address = (internal if on_node_ip else addresses)[receiver.name]
                # A public address the host does not hold is a 1:1 NAT to its node-ip:
                # the listener binds that one, as k3s will.
                bind = address if on_host(there, address) else internal[receiver.name]
                interface, mtu = _overlay_mtu(rule, here, internal[sender.name])
                probes.append(Probe(sender.name, receiver.name, address, rule.proto, rule.port,
                                    listen=not _k3s_holds(rule, there), bind=bind, mtu=mtu, interface=interface))
    return ProbePlan(probes, untested, addresses, family, public=inventory.network.public,
                     providers={n.name: n.provider for n in inventory.nodes if n.provider}, node_ips=internal)


def _overlay_mtu(rule: Rule, sender: HostFacts, node_ip: str) -> tuple[str, int]:
    """The overlay's UDP probe starts at the MTU of the sender's interface holding its
    node-ip (k3s's default flannel-iface); ("", 0) for other probes or when unknown."""
    if rule.what not in OVERHEAD:
        return "", 0
    interface = sender.interface_of(node_ip)
    # An IPv4 datagram is at most 65535 bytes (loopback's 65536 is the largest MTU a link has).
    return (interface, min(sender.mtus[interface], 65535)) if interface in sender.mtus else ("", 0)


def _applies(rule: Rule, sender: Node, receiver: Node, gpu_nodes: Collection[str]) -> bool:
    if rule.between_gpus:
        # NCCL pairs GPU nodes at one provider only (bootstrap.cluster.checks.nccl_group,
        # the gate's pairs): RDMA and NVLink do not cross the internet.
        return sender.name in gpu_nodes and receiver.name in gpu_nodes and sender.provider == receiver.provider
    if rule.between_servers:
        return sender.role == Role.SERVER and receiver.role == Role.SERVER
    return receiver.role == Role.SERVER or not rule.servers_only


def _k3s_holds(rule: Rule, receiver: HostFacts) -> bool:
    """A running k3s holds k3s's ports; the NCCL job's are free until its pods run."""
    return runs_k3s(receiver) and not rule.between_gpus


def _cannot_probe(rule: Rule, sender: HostFacts, receiver: HostFacts) -> str | None:
    if "python3" not in sender.commands:
        return "no python3 on the sending host"
    if _k3s_holds(rule, receiver):
        # Its k3s holds the port: a TCP connect to it is the test; a UDP socket cannot answer.
        if rule.proto == "udp":
            return "the running k3s holds the port"
        return None if receiver.listener(rule.port, "tcp") else "nothing listens there while k3s runs"
    if "python3" not in receiver.commands:
        return "no python3 on the receiving host"
    if receiver.listener(rule.port, rule.proto):
        return "the port is taken (see the ports check)"
    return None


def describe_probes(plan: ProbePlan, most: int = 8) -> list[str]:
    """For `plan`: each port's probes as sender -> receiver (address), most pairs a line."""
    if not plan.probes and not plan.untested:
        return ["reachability: nothing to probe (the nodes run k3s together already)"]
    by_port: dict[tuple, list[Probe]] = {}
    for probe in plan.probes:
        by_port.setdefault((probe.proto, probe.port), []).append(probe)
    lines = [f"reachability: {len(plan.probes)} probes before any change:"]
    for (proto, port), probes in sorted(by_port.items()):
        pairs = [f"{p.sender} -> {p.receiver} ({p.address})" for p in probes]
        shown = ", ".join(pairs[:most]) + (f" and {len(pairs) - most} more" if len(pairs) > most else "")
        lines.append(f"  {proto.upper()} {port}: {shown}")
    for u in plan.untested:
        lines.append(f"  {u.label} {u.sender} -> {u.receiver}: not tested ({u.why})")
    return lines


# --- what the probes found ----------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    probe: Probe
    ok: bool | None  # None: not known (a host did not report)
    detail: str = ""  # "timed out", "refused", "no answer", ...
    path_mtu: int | None = None  # the largest datagram (IP bytes) that got through with don't-fragment
    reassembled: int | None = None  # the largest without it that arrived (fragmented on the way)

    @property
    def mtu_short(self) -> bool:
        """The overlay's probe got through, its full-size datagrams with don't-fragment did not."""
        return self.ok is True and bool(self.probe.mtu) and (self.path_mtu or 0) < self.probe.mtu

    @property
    def mtu_lost(self) -> bool:
        """Short, and a full-size datagram without don't-fragment (as the overlay sends its
        packets) did not arrive either: the path drops fragments, so those packets are lost."""
        return self.mtu_short and (self.reassembled or 0) < self.probe.mtu


def outcomes(plan: ProbePlan, sent: dict[str, dict[tuple, str]], received: dict[str, set[tuple]],
             bound: dict[str, dict[tuple, str]], largest: dict[str, dict[tuple, int]] | None = None,
             whole: dict[str, dict[tuple, int]] | None = None) -> list[Outcome]:
    """`sent[sender][(address, proto, port)]`: the prober's word ("ok", "timeout", "refused",
    "sent", an error); `received[receiver]`: the (sender, proto, port)s its listener logged;
    `bound[receiver][(proto, port)]`: "ok" or why its listener could not bind; `largest[receiver]
    [(sender, proto, port)]`: the largest datagram it got with don't-fragment, `whole[...]`:
    without it, reassembled (both verified). A host that did not report is missing from its dict."""
    return [_with_size(o, (largest or {}).get(o.probe.receiver, {}), (whole or {}).get(o.probe.receiver, {}))
            for o in _outcomes(plan, sent, received, bound)]


def _with_size(outcome: Outcome, sizes: dict[tuple, int], whole: dict[tuple, int]) -> Outcome:
    p = outcome.probe
    if not p.mtu or outcome.ok is not True:
        return outcome
    key = (p.sender, p.proto, p.port)
    return replace(outcome, path_mtu=sizes.get(key), reassembled=whole.get(key))


def _outcomes(plan: ProbePlan, sent: dict[str, dict[tuple, str]], received: dict[str, set[tuple]],
              bound: dict[str, dict[tuple, str]]) -> list[Outcome]:
    out = []
    for p in plan.probes:
        said = sent.get(p.sender, {}).get((p.address, p.proto, p.port))
        if p.sender not in sent:
            out.append(Outcome(p, None, f"{p.sender} did not report its probes"))
        elif not p.listen:
            out.append(Outcome(p, said == "ok", _words(said)))
        elif p.receiver not in bound or p.receiver not in received:
            out.append(Outcome(p, None, f"{p.receiver}'s listener did not report"))
        elif bound[p.receiver].get((p.proto, p.port)) != "ok":
            out.append(Outcome(p, None, f"could not listen: {bound[p.receiver].get((p.proto, p.port), '?')}"))
        elif (p.sender, p.proto, p.port) in received[p.receiver] or (p.proto == "tcp" and said == "ok"):
            # A TCP handshake with the port only our listener holds is an answer by itself.
            out.append(Outcome(p, True))
        else:
            out.append(Outcome(p, False, _words(said) if p.proto == "tcp" else "nothing arrived"))
    return out


def _words(said: str | None) -> str:
    return {"ok": "", "timeout": "timed out", "refused": "refused", None: "no answer"}.get(said, said or "")


def render_matrix(names: list[str], results: list[Outcome], label=str) -> list[str]:
    """Rows send, columns receive; a cell lists what did not get through. `label(node)`:
    how a node is named (with its provider)."""
    cells: dict[tuple[str, str], list[str]] = {}
    for r in results:
        cell = cells.setdefault((r.probe.sender, r.probe.receiver), [])
        if r.ok is False:
            cell.append(f"{r.probe.proto}/{r.probe.port}")
        elif r.ok is None:
            cell.append(f"{r.probe.proto}/{r.probe.port}?")
        elif r.mtu_lost:  # a short path that fragments is slower, not broken: not in the matrix
            cell.append(f"mtu{r.path_mtu}" if r.path_mtu else f"mtu<{min(sizes(r.probe.mtu))}")

    def cell(sender: str, receiver: str) -> str:
        if sender == receiver:
            return "-"
        if (sender, receiver) not in cells:
            return "."
        return ",".join(cells[(sender, receiver)]) or "ok"

    corner = "from \\ to"
    width = max([len(label(n)) for n in names] + [len(cell(s, r)) for s in names for r in names] + [len(corner)])
    lines = ["  " + corner.ljust(width) + "  " + "  ".join(label(n).ljust(width) for n in names)]
    for sender in names:
        lines.append("  " + label(sender).ljust(width) + "  "
                     + "  ".join(cell(sender, r).ljust(width) for r in names))
    return [line.rstrip() for line in lines]


def findings(inventory: Inventory, plan: ProbePlan, results: list[Outcome]) -> list[Finding]:
    """One error per receiving node and port that some node cannot reach, with the rule to
    open; one warning per port that could not be tested."""
    known = rules(inventory, True, plan.family)
    what = {(r.proto, r.port): r.what for r in known}
    opens = {(r.proto, r.port): r.opens for r in known if r.opens}
    on_node_ip = {(r.proto, r.port) for r in known if r.between_servers or r.between_gpus}
    failed: dict[tuple, list[Outcome]] = {}
    unknown: dict[tuple, list[Outcome]] = {}
    for r in results:
        key = (r.probe.receiver, r.probe.proto, r.probe.port, r.probe.address)
        if r.ok is False:
            failed.setdefault(key, []).append(r)
        elif r.ok is None:
            unknown.setdefault(key, []).append(r)
    out = []
    for (receiver, proto, port, address), rs in sorted(failed.items()):
        senders = [r.probe.sender for r in rs]
        source = plan.node_ips if (proto, port) in on_node_ip else plan.addresses
        sources = ", ".join(f"{s} ({source.get(s, plan.addresses[s])})" for s in senders)
        details = sorted({r.detail for r in rs if r.detail})
        provider = plan.providers.get(receiver)
        firewall = f"{provider}'s firewall (security group)" if provider else "the provider's firewall (security group)"
        fix = (f"open {proto.upper()} {opens.get((proto, port), port)} inbound on {receiver} from {sources} in "
               f"{firewall} and in the host's own firewall")
        elsewhere = sorted({plan.providers[s] for s in senders if plan.providers.get(s, provider) != provider})
        if elsewhere and not plan.public:
            fix += (f"; {receiver} and the nodes at {', '.join(elsewhere)} share no private network: set "
                    "network.mode: public (nodes talk over their public addresses, encrypted)")
        out.append(Finding(
            receiver, "reachability",
            f"{proto.upper()} {port} ({what.get((proto, port), 'k3s')}) on {address} is not reachable from "
            f"{', '.join(plan.label(s) for s in senders)}" + (f" ({'; '.join(details)})" if details else ""),
            fix))
    for (receiver, proto, port, _), rs in sorted(unknown.items()):
        out.append(Finding(receiver, "reachability", f"{proto.upper()} {port} from {', '.join(r.probe.sender for r in rs)} "
                           f"not tested: {rs[0].detail}", None, severity="warning"))
    out += [_mtu_finding(plan, r, what) for r in results if r.mtu_short]  # a warning, or an error when lost
    untested: dict[tuple, list[Untested]] = {}
    for u in plan.untested:
        untested.setdefault((u.receiver, u.label, u.why), []).append(u)
    for (receiver, label, why), us in sorted(untested.items()):
        if "python3" in why:
            out.append(Finding(receiver, "reachability", f"{label} from {', '.join(u.sender for u in us)} not tested: "
                               f"{why}", "install python3 on the host to have it checked", severity="warning"))
    return out


def ephemeral_findings(plan: ProbePlan, ranges: dict[str, tuple[int, int] | None]) -> list[Finding]:
    """A GPU node whose kernel gives port-0 binds another range than the one probed (its own
    net.ipv4.ip_local_port_range, which it reports): NCCL's sockets land there, so that is
    the range to open. Its own answer changes only its own warning."""
    out = []
    for receiver in sorted({p.receiver for p in plan.probes if p.port == nccl_ports.EPHEMERAL[0]}):
        got = ranges.get(receiver)
        if got and got != nccl_ports.EPHEMERAL:
            span = nccl_ports.span(got)
            out.append(Finding(receiver, "reachability",
                               f"NCCL's sockets on {plan.label(receiver)} take ports {span} (its "
                               f"net.ipv4.ip_local_port_range), not the {nccl_ports.span(nccl_ports.EPHEMERAL)} probed",
                               f"open TCP {span} inbound on {receiver} from the other GPU nodes at its provider, or "
                               f"set net.ipv4.ip_local_port_range to {' '.join(map(str, nccl_ports.EPHEMERAL))} there",
                               severity="warning"))
    return out


# --- path MTU ------------------------------------------------------------------------------------
#
# flannel gives its overlay device, and so every pod, its interface's MTU less the backend's
# overhead (flannel-io/flannel pkg/backend/vxlan/vxlan_network.go: `encapOverhead = 50`,
# `MTU() = ExtIface.Iface.MTU - encapOverhead`, commit 067ed7f; pkg/backend/wireguard/
# wireguard_network.go: `overhead = 80`, commit 0f89b8d). So the encapsulated packets are as
# large as the interface's MTU, and a path between two nodes must carry that much. A provider
# network that carries less (a tunnelled VPC, an internet path) must fragment them. Neither
# overlay sets don't-fragment on its outer packets: flannel's VXLAN device is made without
# `df` (Linux drivers/net/vxlan/vxlan_core.c, vxlan_xmit_one: DF only with VXLAN_DF_SET or
# VXLAN_DF_INHERIT), WireGuard sends with df 0 and ignore_df (drivers/net/wireguard/socket.c,
# send4). So the sender or a router on the way fragments them and the receiver reassembles:
# slower (two packets for one, and reassembly), not broken; a warning with the cost and the
# fix. Only a path that also drops fragments (a firewall that refuses them, a NAT that cannot
# track them) loses full-size packets: pings and handshakes pass, full-size TCP segments
# stall; that is an error. The overlay's UDP probe therefore also sends, with the
# don't-fragment bit, datagrams of the sender's interface MTU and of each smaller size on
# MTU_LADDER (each carrying the probe's MAC), and one of the interface's MTU without it; the
# receiver reports the largest it got of each kind.

OVERHEAD = {"flannel VXLAN": 50, "flannel WireGuard": 80}  # by Rule.what
# Common path MTUs below 1500 and the jumbo sizes: what providers' networks actually carry.
MTU_LADDER = (9001, 9000, 8950, 8500, 4000, 1500, 1460, 1450, 1420, 1400, 1380, 1350, 1300, 1280)


def sizes(mtu: int) -> list[int]:
    """The full-size datagrams (IP bytes) a sender tries, largest first."""
    return [mtu] + [s for s in MTU_LADDER if s < mtu] if mtu else []


def _mtu_finding(plan: ProbePlan, r: Outcome, what: dict) -> Finding:
    p = r.probe
    overlay = what.get((p.proto, p.port), "flannel VXLAN")
    overhead = OVERHEAD.get(overlay, 50)
    got = f"{r.path_mtu} bytes" if r.path_mtu else f"less than {min(sizes(p.mtu))} bytes"
    fit = r.path_mtu or min(sizes(p.mtu))
    fix = (f"set the MTU of {p.sender}'s {p.interface} (flannel-iface) to {fit} on every node, so pods get "
           f"{fit - overhead}, or turn on the provider's jumbo frames / larger MTU on the network between "
           f"{p.sender} and {p.receiver} so {p.mtu} bytes get through")
    path = (f"path MTU from {plan.label(p.sender)} to {plan.label(p.receiver)} ({p.address}): {got} get "
            f"through with don't-fragment, less than {p.sender}'s {p.interface} MTU {p.mtu}, which "
            f"{overlay} fills (it adds {overhead} bytes and gives pods {p.mtu - overhead})")
    if r.mtu_lost:
        return Finding(p.sender, "mtu", path + f"; and a {p.mtu}-byte datagram without don't-fragment, as "
                       f"{overlay} sends, did not arrive either (the path neither carries nor fragments it, or drops the fragments): "
                       "full-size packets between pods would be lost (pings pass, TCP stalls)", fix)
    return Finding(p.sender, "mtu", path + f"; {overlay} does not set don't-fragment, so its full-size packets "
                   "are fragmented on the way and arrive reassembled (a datagram of that size without "
                   "don't-fragment did): slower, two packets for each full-size one and reassembly at the "
                   "receiver, not lost", fix, severity="warning")


def mtu_lines(results: list[Outcome]) -> list[str]:
    """For people: the largest datagram that got through, per pair measured."""
    measured = [r for r in results if r.probe.mtu and r.ok is True]
    if not measured:
        return []
    short = [r for r in measured if r.mtu_short]
    return [f"path MTU: {len(measured) - len(short)} of {len(measured)} pairs carry their interface's MTU"
            + "".join(f"; {r.probe.sender} -> {r.probe.receiver}: {r.path_mtu or 'under ' + str(min(sizes(r.probe.mtu)))}"
                      f" of {r.probe.mtu} ({'fragments dropped' if r.mtu_lost else 'fragmented'})" for r in short)]


# --- proof of origin: a MAC per ordered pair ----------------------------------------------------
#
# The tool draws a run secret (never sent anywhere) and a run id. The key of the ordered pair
# "A->B" is HMAC(run secret, "A->B"); a probe from A to B on proto/port carries A's name and
# HMAC(key A->B, "<run id> A->B proto/port"). A host is given only the MACs of the probes it
# sends (as a sender) or may receive (as a receiver), never a key and never the run secret, on
# its command's stdin. The listener records a probe only when its line is one it was told to
# expect, and reports the MAC back; the tool recomputes it before counting the pair.
#
# What this proves, and what it does not:
# - a third node C cannot make "A reached B" (or B reached A) appear: it knows no key and no
#   MAC of that pair, and a MAC of its own names C and its own receiver;
# - a probe of an earlier run, or of this run to another node or port, does not count;
# - B itself can claim to have heard A (it was given the MAC to recognise it), and A can claim
#   its own TCP connects succeeded: a lying party to a pair can only misreport that pair;
# - someone on the path between A and B (or C relaying A's datagram by another route) can
#   replay A's probe: the MAC says who sent it, not which way it travelled;
# - a flood can still drown real probes (a false "nothing arrived"), a local user of the
#   receiving host can kill its listener (its probes then read "not tested"), and whoever
#   sees a probe can quote it in a forged acknowledgement that stops its sender early:
#   each can hide a pair that works, none can show one that does not.

MAGIC = "bootstrap-reach"
MAC_RE = re.compile(r"[0-9a-f]{64}")


def pair_key(run_secret: bytes, sender: str, receiver: str) -> bytes:
    """The key of the ordered pair sender -> receiver (node names are DNS labels: no '>')."""
    return hmac.new(run_secret, f"{sender}->{receiver}".encode(), hashlib.sha256).digest()


def probe_mac(run_secret: bytes, run_id: str, sender: str, receiver: str, proto: str, port: int) -> str:
    message = f"{run_id} {sender}->{receiver} {proto}/{port}".encode()
    return hmac.new(pair_key(run_secret, sender, receiver), message, hashlib.sha256).hexdigest()


def hello(run_id: str, sender: str, mac: str) -> str:
    """The line a probe carries (a TCP connection's first line, a UDP datagram)."""
    return f"{MAGIC} {run_id} {sender} {mac}"


@dataclass(frozen=True)
class Proof:
    run_id: str  # public: it names the listeners' sockets and is in every probe
    secret: bytes = field(repr=False)  # never leaves the tool, nor shows in a repr or a log

    def mac(self, p: Probe) -> str:
        return probe_mac(self.secret, self.run_id, p.sender, p.receiver, p.proto, p.port)


def expected_by_receiver(plan: ProbePlan, proof: Proof) -> dict[str, list[tuple[str, int, str, str, int]]]:
    """receiver -> (proto, port, sender, mac, mtu) of each probe its listener may hear (mtu:
    the full-size datagram the sender starts at, 0 for none): all a receiving host is told."""
    out: dict[str, list[tuple[str, int, str, str, int]]] = {}
    for p in plan.probes:
        if p.listen:
            out.setdefault(p.receiver, []).append((p.proto, p.port, p.sender, proof.mac(p), p.mtu))
    return out


def hellos_by_sender(plan: ProbePlan, proof: Proof) -> dict[str, dict[Probe, str | None]]:
    """sender -> {probe: the line it sends, or None for a receiver's running k3s (a bare
    connect)}: all a sending host is told."""
    out: dict[str, dict[Probe, str | None]] = {}
    for p in plan.probes:
        out.setdefault(p.sender, {})[p] = hello(proof.run_id, p.sender, proof.mac(p)) if p.listen else None
    return out


def verified(plan: ProbePlan, proof: Proof, receiver: str,
             reported: set[tuple[str, str, int, str]]) -> set[tuple[str, str, int]]:
    """Of what `receiver` says it heard, (sender, proto, port, mac), the probes of this plan
    whose MAC the tool computes too: (sender, proto, port)."""
    wanted = {(p.sender, p.proto, p.port): p for p in plan.probes if p.receiver == receiver and p.listen}
    out = set()
    for sender, proto, port, mac in reported:
        p = wanted.get((sender, proto, port))
        if p is not None and hmac.compare_digest(proof.mac(p), mac):
            out.add((sender, proto, port))
    return out


def verified_sizes(plan: ProbePlan, proof: Proof, receiver: str,
                   reported: dict[tuple[str, str, int, str], int]) -> dict[tuple[str, str, int], int]:
    """Of the largest datagrams `receiver` says it got, {(sender, proto, port, mac): bytes},
    those of this plan's measured probes whose MAC the tool computes too, within what the
    sender tried (a receiver can misreport its own pair only)."""
    wanted = {(p.sender, p.proto, p.port): p for p in plan.probes if p.receiver == receiver and p.listen and p.mtu}
    out = {}
    for (sender, proto, port, mac), size in reported.items():
        p = wanted.get((sender, proto, port))
        if p is not None and hmac.compare_digest(proof.mac(p), mac) and 0 < size <= p.mtu:
            out[(sender, proto, port)] = size
    return out
