"""Reachability between the nodes: which pairs and ports are probed (bootstrap.checks.reachability),
what the probes' answers mean, the matrix and the findings with their fix; the probe scripts
themselves (bootstrap.remote.reachability) run here on 127.0.0.1."""

import subprocess
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap.host.facts import parsers
from bootstrap.host.facts.host_facts import HostFacts, InterfaceAddress, K3sInstall, ListeningPort, SystemdUnit
from bootstrap.remote import reachability as hr
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks import reachability as rr

INV = parse_inventory("""\
cluster: t
nodes:
  - {name: cp-1, address: 203.0.113.10, role: server}
  - {name: cp-2, address: 203.0.113.11, role: server}
  - {name: cp-3, address: 203.0.113.12, role: server}
  - {name: gpu-1, address: 203.0.113.21}
""")
PRIVATE = {"cp-1": "10.0.0.10", "cp-2": "10.0.0.11", "cp-3": "10.0.0.12", "gpu-1": "10.0.0.21"}


def host(name, running=False, python=True, listening=()):
    units = [SystemdUnit("k3s.service" if name.startswith("cp") else "k3s-agent.service", "loaded",
                         "active" if running else "inactive")]
    return HostFacts(hostname=name, commands={"python3": "/usr/bin/python3"} if python else {},
                     addresses=[InterfaceAddress("ens5", PRIVATE[name], 24)],
                     k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, units) if running else None,
                     listening_ports=[ListeningPort(p, n) for p, n in listening])


def fresh():
    return {n: host(n) for n in PRIVATE}


def pairs(plan, proto, port):
    return {(p.sender, p.receiver) for p in plan.probes if (p.proto, p.port) == (proto, port)}


def test_a_fresh_cluster_probes_every_rule_of_k3s_on_the_private_addresses():
    plan = rr.plan_probes(INV, fresh(), embedded_mirror=False)
    servers = {"cp-1", "cp-2", "cp-3"}
    everyone = set(PRIVATE)
    assert pairs(plan, "tcp", 6443) == {(s, r) for s in everyone for r in servers if s != r}
    assert pairs(plan, "tcp", 2379) == pairs(plan, "tcp", 2380) == {(s, r) for s in servers for r in servers if s != r}
    assert pairs(plan, "tcp", 10250) == pairs(plan, "udp", 8472) == {(s, r) for s in everyone for r in everyone if s != r}
    assert not pairs(plan, "tcp", 5001)
    assert {p.address for p in plan.probes if p.receiver == "cp-1"} == {"10.0.0.10"}  # node-ip, not the public one
    assert all(p.listen for p in plan.probes)
    assert plan.listeners()["gpu-1"] == [("tcp", 10250, "10.0.0.21"), ("udp", 8472, "10.0.0.21")]  # its own address


def test_the_mirror_and_the_flannel_backend_decide_more_ports():
    mirror = rr.plan_probes(INV, fresh(), embedded_mirror=True)
    assert ("cp-1", "gpu-1") in pairs(mirror, "tcp", 5001) and ("cp-1", "gpu-1") in pairs(mirror, "tcp", 6443)
    wireguard = parse_inventory("cluster: t\nk3s: {flannel_backend: wireguard-native}\nnodes:\n"
                                "  - {name: cp-1, address: 10.0.0.10, role: server}\n  - {name: gpu-1, address: 10.0.0.21}\n")
    facts = {"cp-1": host("cp-1"), "gpu-1": host("gpu-1")}
    plan = rr.plan_probes(wireguard, facts, False)
    assert pairs(plan, "udp", 51820) and not pairs(plan, "udp", 8472)
    host_gw = replace(wireguard, k3s=replace(wireguard.k3s, flannel_backend="host-gw"))
    assert {p.proto for p in rr.plan_probes(host_gw, facts, False).probes} == {"tcp"}
    single = parse_inventory("cluster: t\nnodes:\n  - {name: cp-1, address: 10.0.0.10, role: server}\n"
                             "  - {name: gpu-1, address: 10.0.0.21}\n")
    assert not pairs(rr.plan_probes(single, facts, False), "tcp", 2379)  # one server: no etcd peers


def test_a_converged_cluster_is_not_probed_at_all():
    running = {n: host(n, running=True, listening=[("tcp", 6443), ("tcp", 10250)]) for n in PRIVATE}
    plan = rr.plan_probes(INV, running, False)
    assert plan.probes == [] and plan.untested == []
    # ... so no round trip at all: the session is never asked to run anything.
    report = hr.check(None, INV, running, False)
    assert report.round_trips == 0 and report.findings == [] and report.lines == []


def test_a_joining_node_probes_the_running_k3s_and_skips_what_it_holds():
    facts = {n: host(n, running=True, listening=[("tcp", 6443), ("tcp", 2379), ("tcp", 2380), ("tcp", 10250),
                                                 ("udp", 8472)]) for n in ("cp-1", "cp-2", "cp-3")}
    facts["gpu-1"] = host("gpu-1")
    plan = rr.plan_probes(INV, facts, False)
    to_servers = [p for p in plan.probes if p.receiver.startswith("cp")]
    assert {(p.proto, p.port, p.listen) for p in to_servers} == {("tcp", 6443, False), ("tcp", 10250, False)}
    assert {u.label for u in plan.untested} == {"UDP 8472"}  # the kernel's VXLAN socket cannot answer
    assert pairs(plan, "udp", 8472) == {("cp-1", "gpu-1"), ("cp-2", "gpu-1"), ("cp-3", "gpu-1")}
    assert plan.listeners() == {"gpu-1": [("tcp", 10250, "10.0.0.21"), ("udp", 8472, "10.0.0.21")]}


def test_hosts_without_python3_are_reported_untested_with_a_warning():
    facts = fresh()
    facts["gpu-1"] = host("gpu-1", python=False)
    plan = rr.plan_probes(INV, facts, False)
    assert not [p for p in plan.probes if "gpu-1" in (p.sender, p.receiver)]
    warnings = rr.findings(INV, plan, [])
    assert warnings and all(f.severity == "warning" and "python3" in f.message + (f.fix or "") for f in warnings)


def answers(plan, lost=(), refused=()):
    """What the hosts would report when `lost` (sender, receiver, proto, port) are dropped."""
    sent, received, bound = {}, {}, {}
    for p in plan.probes:
        key = (p.sender, p.receiver, p.proto, p.port)
        word = "refused" if key in refused else "timeout" if key in lost else "ok"
        sent.setdefault(p.sender, {})[(p.address, p.proto, p.port)] = "sent" if p.proto == "udp" else word
        received.setdefault(p.receiver, set())
        bound.setdefault(p.receiver, {})[(p.proto, p.port)] = "ok"
        if word == "ok":
            received[p.receiver].add((p.sender, p.proto, p.port))
    return sent, received, bound


def test_dropped_traffic_becomes_one_finding_per_port_with_the_rule_to_open():
    plan = rr.plan_probes(INV, fresh(), False)
    lost = {("cp-1", "gpu-1", "udp", 8472), ("cp-2", "gpu-1", "udp", 8472), ("gpu-1", "cp-1", "tcp", 6443)}
    results = rr.outcomes(plan, *answers(plan, lost=lost))
    findings = rr.findings(INV, plan, results)
    assert [(f.node, f.severity) for f in findings] == [("cp-1", "error"), ("gpu-1", "error")]
    vxlan = findings[1]
    assert vxlan.message == "UDP 8472 (flannel VXLAN) on 10.0.0.21 is not reachable from cp-1, cp-2 (nothing arrived)"
    assert vxlan.fix == ("open UDP 8472 inbound on gpu-1 from cp-1 (10.0.0.10), cp-2 (10.0.0.11) in the provider's "
                         "firewall (security group) and in the host's own firewall")
    assert "TCP 6443 (k3s supervisor and API server) on 10.0.0.10 is not reachable from gpu-1 (timed out)" \
        == findings[0].message


NCCL_INV = parse_inventory("""\
cluster: t
network: {mode: public}
nodes:
  - {name: cp-1, address: 203.0.113.10, role: server, provider: hetzner}
  - {name: cp-2, address: 203.0.113.11, role: server, provider: hetzner}
  - {name: cp-3, address: 203.0.113.12, role: server, provider: hetzner}
  - {name: gpu-1, address: 203.0.113.21, provider: lambda}
  - {name: gpu-2, address: 203.0.113.22, provider: lambda}
  - {name: gpu-3, address: 203.0.113.23, provider: runpod}
validate: {nccl: {min_busbw_gbps: 100}}
""")


def nccl_facts():
    private = dict(PRIVATE, **{"gpu-2": "10.0.0.22", "gpu-3": "10.0.0.23"})
    return {n: replace(host("gpu-1"), hostname=n, addresses=[InterfaceAddress("ens5", a, 24)])
            for n, a in private.items()}


def test_validate_nccl_probes_its_pinned_ports_and_ncclss_ephemeral_range_between_gpu_nodes_at_one_provider():
    """The NCCL job's workers use the host network: sshd, Open MPI's pinned block and NCCL's
    own sockets (ephemeral ports) go node-ip to node-ip between the GPU nodes NCCL pairs (one
    provider's), both ways, also to a node whose k3s runs already (k3s holds none of them)."""
    facts = nccl_facts()
    facts["gpu-2"] = replace(facts["gpu-2"], k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                                            [SystemdUnit("k3s-agent.service", "loaded", "active")]))
    plan = rr.plan_probes(NCCL_INV, facts, False, gpu_nodes=("gpu-1", "gpu-2", "gpu-3"))
    for port in (12022, 12133, 32768, 60999):  # each range at both ends
        assert pairs(plan, "tcp", port) == {("gpu-1", "gpu-2"), ("gpu-2", "gpu-1")}, port
    nccl = [p for p in plan.probes if p.port in (12022, 12133, 32768, 60999)]
    assert {p.address for p in nccl if p.receiver == "gpu-2"} == {"10.0.0.22"}  # node-ip, not the public one
    assert all(p.listen for p in nccl)  # the running k3s holds none: a listener answers
    assert not pairs(rr.plan_probes(NCCL_INV, facts, False, gpu_nodes=()), "tcp", 12022)  # no GPU nodes, no NCCL
    off = replace(NCCL_INV, validate=replace(NCCL_INV.validate, nccl=None))
    assert not pairs(rr.plan_probes(off, facts, False, gpu_nodes=("gpu-1", "gpu-2")), "tcp", 12022)

    lost = {("gpu-1", "gpu-2", "tcp", 12133), ("gpu-2", "gpu-1", "tcp", 60999)}
    found = {f.message: f.fix for f in rr.findings(NCCL_INV, plan, rr.outcomes(plan, *answers(plan, lost=lost)))}
    assert found == {
        "TCP 12133 (validate.nccl: sshd and Open MPI, TCP 12022-12133) on 10.0.0.22 is not reachable from gpu-1 "
        "(lambda) (timed out)": "open TCP 12022-12133 inbound on gpu-2 from gpu-1 (10.0.0.21) in lambda's "
                                "firewall (security group) and in the host's own firewall",
        "TCP 60999 (validate.nccl: NCCL's sockets, the kernel's ephemeral TCP 32768-60999) on 10.0.0.21 is not "
        "reachable from gpu-2 (lambda) (timed out)": "open TCP 32768-60999 inbound on gpu-1 from gpu-2 (10.0.0.22) "
                                                     "in lambda's firewall (security group) and in the host's own firewall"}


@pytest.mark.parametrize("line, reported", [("ephemeral 32768 60999", (32768, 60999)),
                                            ("ephemeral 1024 65535", (1024, 65535)),
                                            ("ephemeral 60999 32768", None), ("ephemeral 0 65535", None),
                                            ("ephemeral 1024 99999", None), ("ephemeral 1024", None),
                                            ("ephemeral \u0661\u0660\u0662\u0664 2000", None), ("junk", None)])
def test_a_gpu_nodes_own_ephemeral_range_other_than_the_probed_one_is_a_warning_naming_the_range(line, reported):
    """NCCL's sockets land in the host's own ip_local_port_range: a GPU node that reports
    another (a checked line of its answer) is told which range to open. Its answer changes
    only its own warning; nothing it can print raises."""
    assert hr.parse_ephemeral(f"bound tcp 1\n{line}\nend\n") == reported
    plan = rr.plan_probes(NCCL_INV, nccl_facts(), False, gpu_nodes=("gpu-1", "gpu-2"))
    found = rr.ephemeral_findings(plan, {"gpu-1": reported, "gpu-2": (32768, 60999), "cp-1": (1024, 2000)})
    if reported in (None, (32768, 60999)):
        assert found == []
        return
    (warning,) = found
    assert (warning.node, warning.severity) == ("gpu-1", "warning")
    assert warning.message == ("NCCL's sockets on gpu-1 (lambda) take ports 1024-65535 (its "
                               "net.ipv4.ip_local_port_range), not the 32768-60999 probed")
    assert warning.fix.startswith("open TCP 1024-65535 inbound on gpu-1 from the other GPU nodes at its provider")


def test_a_host_that_does_not_report_leaves_its_probes_untested_not_failed():
    plan = rr.plan_probes(INV, fresh(), False)
    sent, received, bound = answers(plan)
    del sent["gpu-1"], received["cp-3"], bound["cp-3"]
    results = rr.outcomes(plan, sent, received, bound)
    assert not [r for r in results if r.ok is False]
    findings = rr.findings(INV, plan, results)
    assert findings and {f.severity for f in findings} == {"warning"}
    assert any("gpu-1 did not report its probes" in f.message for f in findings)
    assert any("cp-3's listener did not report" in f.message for f in findings)
    busy = dict(bound, **{"cp-3": {("tcp", 6443): "Address already in use"}})
    assert any(r.detail == "could not listen: Address already in use"
               for r in rr.outcomes(plan, answers(plan)[0], received | {"cp-3": set()}, busy))


def test_a_tcp_handshake_counts_even_before_the_listener_logged_it():
    plan = rr.plan_probes(INV, fresh(), False)
    sent, received, bound = answers(plan)
    received = {n: {g for g in got if g[1] == "udp"} for n, got in received.items()}  # no TCP hello logged
    assert all(r.ok for r in rr.outcomes(plan, sent, received, bound))


def test_the_matrix_shows_what_did_not_get_through_from_row_to_column():
    plan = rr.plan_probes(INV, fresh(), False)
    lost = {("cp-1", "gpu-1", "udp", 8472), ("gpu-1", "cp-1", "tcp", 6443), ("gpu-1", "cp-1", "tcp", 10250)}
    results = rr.outcomes(plan, *answers(plan, lost=lost))
    assert rr.render_matrix(["cp-1", "cp-2", "gpu-1"], results) == [
        "  from \\ to           cp-1                cp-2                gpu-1",
        "  cp-1                -                   ok                  udp/8472",
        "  cp-2                ok                  -                   ok",
        "  gpu-1               tcp/6443,tcp/10250  ok                  -",
    ]
    unknown = [replace(r, ok=None) if r.probe.sender == "cp-2" and r.probe.receiver == "cp-1" else r for r in results]
    assert "tcp/6443?" in rr.render_matrix(["cp-1", "cp-2"], unknown)[2]


def mtu_outcome(path_mtu, reassembled, v6=False):
    plan = rr.plan_probes(INV, fresh(), False)
    probe = next(p for p in plan.probes if (p.sender, p.receiver, p.proto) == ("cp-1", "gpu-1", "udp"))
    return plan, rr.Outcome(replace(probe, mtu=1500, interface="ens5"), True, path_mtu=path_mtu, reassembled=reassembled)


def test_a_short_path_that_fragments_is_a_warning_with_the_cost_and_one_that_drops_fragments_an_error():
    """flannel's VXLAN (and WireGuard) send without don't-fragment: a path carrying 1400 of
    1500 bytes fragments the overlay's packets (slower), loses them only where fragments are
    dropped. The listener's answers decide: the full-size datagram without don't-fragment
    arrived reassembled, or not."""
    plan, fragments = mtu_outcome(1400, 1500)
    (warning,) = rr.findings(INV, plan, [fragments])
    assert (warning.node, warning.check, warning.severity) == ("cp-1", "mtu", "warning")
    assert warning.message.startswith("path MTU from cp-1 to gpu-1 (10.0.0.21): 1400 bytes get through with "
                                      "don't-fragment, less than cp-1's ens5 MTU 1500")
    assert "fragmented on the way and arrive reassembled" in warning.message and "slower" in warning.message
    assert warning.fix.startswith("set the MTU of cp-1's ens5 (flannel-iface) to 1400 on every node, so pods get 1350")
    assert rr.render_matrix(["cp-1", "gpu-1"], [fragments])[1].split()[1:] == ["-", "ok"]  # not in the matrix
    assert rr.mtu_lines([fragments]) == ["path MTU: 0 of 1 pairs carry their interface's MTU; cp-1 -> gpu-1: "
                                         "1400 of 1500 (fragmented)"]
    for dropped in (mtu_outcome(1400, None)[1], mtu_outcome(1400, 1400)[1]):  # none, or only a smaller one
        (error,) = rr.findings(INV, plan, [dropped])
        assert error.severity == "error" and "or drops the fragments" in error.message and "lost" in error.message
        assert "mtu1400" in rr.render_matrix(["cp-1", "gpu-1"], [dropped])[1]
    assert not rr.findings(INV, plan, [mtu_outcome(1500, None)[1]])  # the full size with don't-fragment: fine


class LocalSession:
    """Runs each host's command here, all at once, as the hosts' session does."""

    def __init__(self):
        self.calls = 0
        self.commands = []
        self.answers = {}

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        self.calls += 1
        self.commands += list(commands.values())
        procs = {name: start_command(hr.Command(command, (stdin or {}).get(name, ""))) for name, command in commands.items()}
        self.answers = {name: finish(proc) for name, proc in procs.items()}
        return self.answers


def start_command(command):
    """A host's command, here, in the background: its line through the shell, its stdin given."""
    proc = subprocess.Popen(command.line, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write(command.stdin)
    proc.stdin.close()
    return proc


def finish(proc, timeout=60):
    """What the command printed, once it ended (None: it failed, as a host that did not report)."""
    out = proc.stdout.read()  # the command ends by its own deadline (a watchdog at worst)
    proc.stdout.close()
    return out if proc.wait(timeout) == 0 else None


def free_ports(n):
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_the_probe_scripts_listen_probe_and_report_over_loopback(monkeypatch):
    """Two "nodes" on loopback: b (127.0.0.2) runs k3s (its TCP port is probed as it is), a
    (127.0.0.1) is new (its listener answers). The listener, the prober and the collection
    really run; a port a's listener could not bind is reported untested, never reachable.
    a's listener binds a's address only: b's k3s holds the same port on 127.0.0.2 (with a
    wildcard listener on a, the probe of b would have been answered by a)."""
    import socket
    import time

    tcp, udp, busy = free_ports(3)
    monkeypatch.setattr(hr, "secrets", FixedSecrets)
    monkeypatch.setattr(rr, "rules", lambda inventory, mirror, family=4: [
        rr.Rule("tcp", tcp, "kubelet"), rr.Rule("udp", udp, "flannel VXLAN"), rr.Rule("tcp", busy, "taken")])
    inv = parse_inventory("cluster: t\nnodes:\n  - {name: a, address: 127.0.0.1, role: server}\n"
                          "  - {name: b, address: 127.0.0.2}\n")
    facts = {"a": HostFacts(commands={"python3": "/usr/bin/python3"},
                            addresses=[InterfaceAddress("lo", "127.0.0.1", 8, "host")]),
             "b": HostFacts(commands={"python3": "/usr/bin/python3"}, mtus={"lo": 9000},
                            addresses=[InterfaceAddress("lo", "127.0.0.2", 8, "host")],
                            k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                           [SystemdUnit("k3s-agent.service", "loaded", "active")]),
                            listening_ports=[ListeningPort("tcp", tcp)])}
    assert rr.plan_probes(inv, facts, False).listeners() == {"a": [("tcp", tcp, "127.0.0.1"), ("udp", udp, "127.0.0.1"),
                                                                   ("tcp", busy, "127.0.0.1")]}
    k3s_on_b = socket.socket()
    k3s_on_b.bind(("127.0.0.2", tcp))
    k3s_on_b.listen()
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", busy))  # taken after the facts were read: the listener says so
    holder.listen()
    session = LocalSession()
    begun = time.monotonic()
    try:
        report = hr.check(session, inv, facts, False)
    finally:
        holder.close()
        k3s_on_b.close()
    assert session.calls == report.round_trips == 1  # one command per host: listen and probe at once
    assert time.monotonic() - begun < hr.WINDOW_SECONDS  # everything arrived: nobody waited out the window
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    assert [f.message for f in report.findings] == [f"TCP {busy} from b not tested: could not listen: "
                                                    "Address already in use"]
    assert report.lines == ["reachability: 4 probes between 2 nodes on the cluster's addresses: 3 got through, "
                            "1 not tested",
                            # b's 9000-byte datagrams with don't-fragment got through loopback
                            "path MTU: 1 of 1 pairs carry their interface's MTU"]
    # ... and where this kernel puts port-0 binds (NCCL's sockets)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        assert hr.parse_ephemeral(session.answers["a"]) == tuple(int(x) for x in f.read().split())
    # ... and, reported apart, its 9000-byte datagram without don't-fragment (the overlay's kind)
    mac = FIXED_PROOF.mac(next(p for p in rr.plan_probes(inv, facts, False).probes if p.proto == "udp"))
    assert f"whole udp {udp} b {mac} 9000" in session.answers["a"].splitlines()
    assert f"size udp {udp} b {mac} 9000" in session.answers["a"].splitlines()
    for port, kind in ((tcp, socket.SOCK_STREAM), (udp, socket.SOCK_DGRAM)):  # the listener is gone
        with socket.socket(socket.AF_INET, kind) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT is no listener
            s.bind(("0.0.0.0", port))
    # No secret on any command line: the run secret, the MACs and the control secrets
    # travelled on stdin only.
    plan = rr.plan_probes(inv, facts, False)
    secret_words = [FixedSecrets.SECRET.hex()] + [FIXED_PROOF.mac(p) for p in plan.probes]
    assert session.commands and not [w for w in secret_words for c in session.commands if w in c]


class FixedSecrets:
    SECRET = bytes(range(32))

    @staticmethod
    def token_hex(n):
        return "0123456789abcdef"[: 2 * n]

    @staticmethod
    def token_bytes(n):
        return FixedSecrets.SECRET[:n]


FIXED_PROOF = rr.Proof("0123456789abcdef", FixedSecrets.SECRET)


def test_the_listener_hears_every_node_when_all_connect_at_once():
    """50 agents probe the server's ports at the same moment: 300 TCP connections arrive
    together (more than a default listen backlog of 128), some hold their hello back.
    Every hello is heard: none is dropped as a SYN the backlog had no room for, and no
    connection waits for the one before it to speak. Having heard them all, the command
    ends at once, long before its deadline."""
    import socket
    import threading
    import time

    tcp, other = free_ports(2)
    proof = FIXED_PROOF
    port_of = {i: tcp if i % 2 else other for i in range(300)}
    mac = {i: rr.probe_mac(proof.secret, proof.run_id, f"n{i}", "srv", "tcp", port_of[i]) for i in range(300)}
    srv = start_command(hr.reach_command(proof, "srv", [("tcp", tcp, "127.0.0.1"), ("tcp", other, "127.0.0.1")],
                                         [("tcp", port_of[i], f"n{i}", mac[i], 0) for i in range(300)], {},
                                         seconds=30))
    failures = []

    def node(i):
        until = time.monotonic() + 5
        while True:  # as a probe does: a listener whose command starts later is tried again
            try:
                with socket.create_connection(("127.0.0.1", port_of[i]), 3) as s:
                    if i % 10 == 0:
                        time.sleep(1.5)  # a slow sender must not hold up the others
                    s.sendall((rr.hello(proof.run_id, f"n{i}", mac[i]) + "\n").encode())
                    time.sleep(0.1)
                return
            except ConnectionRefusedError:
                if time.monotonic() > until:
                    failures.append(i)
                    return
                time.sleep(0.05)
            except OSError as exc:
                failures.append((i, exc))
                return

    threads = [threading.Thread(target=node, args=(i,)) for i in range(300)]
    begun = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answer = finish(srv)
    assert failures == [] and time.monotonic() - begun < 10
    assert hr.parse_bound(answer) == {("tcp", tcp): "ok", ("tcp", other): "ok"}
    assert hr.parse_received(answer) == {(f"n{i}", "tcp", port_of[i], mac[i]) for i in range(300)}


def listener_gone(ports, address="127.0.0.1"):
    import socket

    for proto, port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                return False
    return True


def wait_bound(ports, address="127.0.0.1", seconds=10):
    import time

    until = time.monotonic() + seconds
    while listener_gone(ports, address) and time.monotonic() < until:
        time.sleep(0.02)
    assert not listener_gone(ports, address)


def test_the_listener_binds_only_the_address_under_test_and_records_only_this_pairs_mac():
    """b's listener binds 127.0.0.1 (not 127.0.0.2, not the wildcard), and of what arrives it
    keeps only the probe whose MAC it was told: c, which knows its own key only, can neither
    pass as a (its MAC is for c->b, a's name with it is refused) nor bring a stale or
    made-up MAC; a probe for another port does not count on this one, and none of them is
    acknowledged. The tool checks again."""
    import socket

    tcp, udp = free_ports(2)
    proof = FIXED_PROOF
    plan = rr.ProbePlan([rr.Probe(s, "b", "127.0.0.1", proto, port, True, "127.0.0.1")
                         for s in ("a", "c") for proto, port in (("tcp", tcp), ("udp", udp))], [], {})
    expected = rr.expected_by_receiver(plan, proof)["b"]
    expected_a = [e for e in expected if e[2] == "a"]  # b hears from a only, in this run
    b = start_command(hr.reach_command(proof, "b", [("tcp", tcp, "127.0.0.1"), ("udp", udp, "127.0.0.1")],
                                       expected_a, {}, seconds=3, window=1))
    wait_bound([("tcp", tcp), ("udp", udp)])
    with pytest.raises(ConnectionRefusedError):  # nothing listens on another address of the host
        socket.create_connection(("127.0.0.2", tcp), 2).close()

    other = rr.Proof("fedcba9876543210", bytes(32))
    c_key_mac = rr.probe_mac(proof.secret, proof.run_id, "c", "b", "udp", udp)  # all c could know
    forged = [rr.hello(proof.run_id, "a", c_key_mac),  # c's MAC under a's name
              rr.hello(proof.run_id, "c", c_key_mac),  # c's own, genuine, but b was not told to expect it
              rr.hello(proof.run_id, "a", "0" * 64),  # made up
              rr.hello(other.run_id, "a", rr.probe_mac(other.secret, other.run_id, "a", "b", "udp", udp)),  # stale run
              rr.hello(proof.run_id, "a", rr.probe_mac(proof.secret, proof.run_id, "a", "b", "tcp", tcp))]  # tcp's
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        for line in forged:
            s.sendto((line + "\n").encode(), ("127.0.0.1", udp))
        with pytest.raises(TimeoutError):
            s.recv(1024)  # no acknowledgement for what it was not told to expect
    good_tcp = next(e for e in expected_a if e[0] == "tcp")
    with socket.create_connection(("127.0.0.1", tcp), 2) as s:
        s.sendall((rr.hello(proof.run_id, "a", good_tcp[3]) + "\n").encode())
    heard = hr.parse_received(finish(b))
    assert heard == {("a", "tcp", tcp, good_tcp[3])}  # the UDP lines were all refused
    assert rr.verified(plan, proof, "b", heard) == {("a", "tcp", tcp)}
    # The tool recomputes: a report of a pair with a MAC it did not make is dropped.
    lied = heard | {("c", "udp", udp, "1" * 64), ("a", "udp", udp, c_key_mac)}
    assert rr.verified(plan, proof, "b", lied) == {("a", "tcp", tcp)}
    assert rr.verified(plan, other, "b", heard) == set()  # another run's secret: nothing
    assert listener_gone([("tcp", tcp), ("udp", udp)])  # gone with its command


def test_a_listener_whose_command_starts_late_is_still_reached_and_a_missing_one_costs_the_window():
    """The hosts' commands do not start at the same moment: a's probes keep trying until b's
    listener, started a second later, hears them (and acknowledges the datagram, full size
    included). A node whose command never ran (c) is tried for the window only."""
    import time

    tcp, udp, silent = free_ports(3)
    proof = FIXED_PROOF
    probes = [rr.Probe("a", "b", "127.0.0.1", "tcp", tcp, True, "127.0.0.1"),
              rr.Probe("a", "b", "127.0.0.1", "udp", udp, True, "127.0.0.1", mtu=9000, interface="lo"),
              rr.Probe("a", "c", "127.0.0.1", "tcp", silent, True, "127.0.0.1")]
    plan = rr.ProbePlan(probes, [], {"a": "127.0.0.2", "b": "127.0.0.1", "c": "127.0.0.1"})
    begun = time.monotonic()
    a = start_command(hr.reach_command(proof, "a", [], [], rr.hellos_by_sender(plan, proof)["a"], window=3))
    time.sleep(1)
    b = start_command(hr.reach_command(proof, "b", plan.listeners()["b"], rr.expected_by_receiver(plan, proof)["b"],
                                       {}, seconds=4, window=3))
    answer = finish(b)
    b_took = time.monotonic() - begun
    said = hr.parse_sent(finish(a))
    assert hr.parse_received(answer) == {("a", "tcp", tcp, proof.mac(probes[0])), ("a", "udp", udp, proof.mac(probes[1]))}
    assert hr.parse_sizes(answer) == {("a", "udp", udp, proof.mac(probes[1])): 9000}
    assert b_took < 2.5  # b ended once it had heard a's probes, full-size datagram included
    assert said == {("127.0.0.1", "tcp", tcp): "ok", ("127.0.0.1", "udp", udp): "sent",
                    ("127.0.0.1", "tcp", silent): "refused"}
    assert 2.5 <= time.monotonic() - begun < 6  # c was tried for the window (3 s), no longer


def test_a_flood_of_datagrams_and_connections_does_not_keep_a_listener_past_its_deadline():
    """While threads flood its UDP port with datagrams and its TCP port with connections
    (some silent, some sending junk), a listener given 2 seconds is gone within about 2."""
    import socket
    import threading
    import time

    tcp, udp = free_ports(2)
    started_at = time.monotonic()
    b = start_command(hr.reach_command(FIXED_PROOF, "b", [("tcp", tcp, "127.0.0.1"), ("udp", udp, "127.0.0.1")],
                                       [("udp", udp, "a", "0" * 64, 1500)], {}, seconds=2, window=1))
    wait_bound([("tcp", tcp), ("udp", udp)])
    stop = threading.Event()

    def datagrams():
        junk = b"bootstrap-reach x " * 28
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not stop.is_set():
                try:
                    s.sendto(junk, ("127.0.0.1", udp))
                except OSError:
                    pass

    def connections():
        held = []
        while not stop.is_set():
            try:
                c = socket.create_connection(("127.0.0.1", tcp), 1)
                c.sendall(b"x")  # a line that never ends
                held.append(c)
            except OSError:
                time.sleep(0.01)
            if len(held) > 200:
                for c in held[:100]:
                    c.close()
                del held[:100]
        for c in held:
            c.close()

    threads = [threading.Thread(target=datagrams) for _ in range(2)] + [threading.Thread(target=connections)]
    for t in threads:
        t.start()
    try:
        while not listener_gone([("tcp", tcp), ("udp", udp)]) and time.monotonic() - started_at < 15:
            time.sleep(0.1)
        lived = time.monotonic() - started_at
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert listener_gone([("tcp", tcp), ("udp", udp)]) and lived < 4.5, lived
    assert hr.parse_bound(finish(b)) == {("tcp", tcp): "ok", ("udp", udp): "ok"}  # and it answered


@pytest.mark.parametrize("text, parsed", [
    ("bound tcp 6443\nbusy udp 8472 Address_already_in_use\n", {("tcp", 6443): "ok",
                                                                  ("udp", 8472): "Address already in use"}),
    (None, None),
])
def test_listener_output_parses(text, parsed):
    assert hr.parse_bound(text) == parsed


def test_prober_and_collector_output_parse_and_a_cut_answer_is_no_answer():
    assert hr.parse_sent("sent tcp 10.0.0.1 6443 ok\nsent udp fd00::1 8472 sent\njunk\n") == {
        ("10.0.0.1", "tcp", 6443): "ok", ("fd00::1", "udp", 8472): "sent"}
    mac = "ab" * 32
    assert hr.parse_received(f"got udp 8472 cp-1 {mac}\ngot tcp 10250 gpu-1 {mac}\nend\n") == {
        ("cp-1", "udp", 8472, mac), ("gpu-1", "tcp", 10250, mac)}
    assert hr.parse_received(f"got udp 8472 cp-1 {mac}\n") is None  # the listener died mid-answer
    assert hr.parse_sizes(f"got udp 8472 cp-1 {mac}\nsize udp 8472 cp-1 {mac} 1400\nsize tcp 6443 cp-1 {mac} 9\n"
                          f"size udp 8472 cp-1 {mac} \u0661\u0664\nsize udp 8472 cp-1 {mac} 999999\nend\n") == {
        ("cp-1", "udp", 8472, mac): 1400}
    assert hr.parse_sizes(f"size udp 8472 cp-1 {mac} 1400\n") is None


@pytest.mark.parametrize("parse", [hr.parse_bound, hr.parse_sent, hr.parse_received, hr.parse_sizes])
@pytest.mark.parametrize("text", [
    None, 42, b"bound tcp 6443\n", ["end"], "x" * (hr.MAX_ANSWER + 1),
    "bound tcp 99999999999999999999\nbusy udp -1 x\nbound tcp \u0664\u0664\u0663\nsent tcp 10.0.0.1 0 ok\n"
    "sent tcp not-an-ip 6443 ok\ngot udp 8472 CP_1 zz\ngot udp 8472 cp-1 " + "a" * 63 + "\nend\n",
    "\x1b]52;c;AAAA\x07\nbusy tcp 6443 \x1b[2J\nsent tcp 10.0.0.1 6443 \x1b[2Jok\nend\n",
    "size udp 8472 cp-1 " + "a" * 64 + " \u0661\u0665\u0660\u0660\nsize udp 8472 cp-1 " + "a" * 64 + " -1\n"
    "size udp 8472 cp-1 " + "a" * 64 + " 99999999999999999999\nsize udp 8472 cp-1 " + "a" * 64 + " 1e3\nend\n",
])
def test_what_a_host_prints_back_never_raises_and_keeps_only_checked_fields(parse, text):
    """A lying host's answer: wrong types, huge, non-ASCII digits, bad addresses and names,
    escape sequences. Each parser gives None (that host did not report) or only fields
    that passed their check; no exception reaches the other hosts' results."""
    got = parse(text)
    if got is None:
        return
    keys = got if isinstance(got, set) else got.keys()
    for key in keys:
        assert all(isinstance(x, str) and x.isascii() and x.isprintable() or isinstance(x, int) and 0 < x < 65536
                   for x in key), key
    if isinstance(got, dict):
        assert all(isinstance(v, int) and 0 < v < 100000 or isinstance(v, str) and v.isascii() and v.isprintable()
                   for v in got.values()), got


def test_a_host_that_hangs_or_drops_its_connection_is_one_host_not_reporting():
    """session.run_each's contract, which the check relies on: a host whose command hangs
    past the time-out, fails, floods or whose connection dropped is None; the others'
    answers stand. Real paramiko on both ends (tests/sshpair.py); each host's secret reaches
    its own command's stdin only, and its stderr is no part of its answer."""
    from sshpair import Host, SshPairs

    from bootstrap.remote import session as remote_session
    from bootstrap.remote.session import HostSession
    from bootstrap.progress import Reporter

    def answer(command, stdin):
        assert b"2>/dev/null" in command  # stderr: not the answer
        return 0, b"a:" + stdin

    pairs = SshPairs()
    try:
        clients = {"a": pairs.connect(Host(answer)), "hangs": pairs.connect(Host(lambda c, i: None)),
                   "fails": pairs.connect(Host(lambda c, i: (1, b"partial"))),
                   "floods": pairs.connect(Host(lambda c, i: (0, b"x" * (remote_session.MAX_EACH_BYTES + 1)))),
                   "dropped": pairs.connect(Host())}
        clients["dropped"].get_transport().close()
        hosts = {name: type("PyinfraHost", (), {"name": name, "connector": type("Connector", (), {"client": c})()})()
                 for name, c in clients.items()}
        session = HostSession.__new__(HostSession)
        session.failures, session.reporter = {}, Reporter()
        session._state = type("State", (), {"inventory": type("Inv", (), {"get_host": staticmethod(
            lambda name, default=None: hosts.get(name, default))})()})()
        got = session.run_each({n: "true" for n in clients}, "x", stdin={n: f"in-{n}" for n in clients}, timeout=2)
    finally:
        pairs.close()
    assert got == {"a": "a:in-a", "hangs": None, "fails": None, "floods": None, "dropped": None}


def test_in_public_mode_a_natd_listener_binds_the_address_the_public_one_is_translated_to():
    """The probes go to the public (inventory) address; a host that does not hold it (1:1
    NAT) listens on its own node-ip, where the translated packets arrive; a host that holds
    its public address listens on that one."""
    from test_public_network import PUBLIC, facts as natd

    inventory = parse_inventory(PUBLIC)
    hosts = natd()
    hosts["gpu-2"] = replace(hosts["gpu-2"], addresses=hosts["gpu-2"].addresses
                             + [InterfaceAddress("eth1", "192.0.2.31", 24)])  # holds its public address
    plan = rr.plan_probes(inventory, hosts, embedded_mirror=False)
    assert {(p.address, p.bind) for p in plan.probes if p.receiver == "gpu-1"} == {("203.0.113.21", "10.0.2.21")}
    assert {(p.address, p.bind) for p in plan.probes if p.receiver == "gpu-2"} == {("192.0.2.31", "192.0.2.31")}
    assert {b for ports in plan.listeners().values() for _, _, b in ports} == {"10.0.1.10", "10.0.2.21", "192.0.2.31"}


def every_input(plan, proof):
    """What each host is given in one run: {node: [its command line and stdin]}."""
    listeners, expected, hellos = plan.listeners(), rr.expected_by_receiver(plan, proof), rr.hellos_by_sender(plan, proof)
    return {n: [hr.reach_command(proof, n, listeners.get(n, []), expected.get(n, []), hellos.get(n, {}))]
            for n in set(listeners) | set(hellos)}


def test_each_node_is_given_only_the_macs_of_its_own_pairs_and_no_secret_on_a_command_line():
    """Three fresh nodes: cp-3 sends to and hears from cp-1 and cp-2, but what it is given
    holds neither the key nor any MAC of cp-1 -> cp-2 (or back), and no host gets the run
    secret or any pair key. The command lines carry no secret at all."""
    plan = rr.plan_probes(INV, fresh(), embedded_mirror=False)
    proof = FIXED_PROOF
    given = every_input(plan, proof)
    names = list(PRIVATE)
    for third in names:
        text = "".join(c.line + c.stdin for c in given[third])
        for a in names:
            for b in names:
                if a == b:
                    continue
                assert rr.pair_key(proof.secret, a, b).hex() not in text  # no key ever leaves the tool
                macs = [proof.mac(p) for p in plan.probes if (p.sender, p.receiver) == (a, b)]
                assert macs
                if third in (a, b):
                    assert all(m in text for m in macs), (third, a, b)  # what it needs
                else:
                    assert not [m for m in macs if m in text], (third, a, b)
        assert proof.secret.hex() not in text
        assert not [c for c in given[third] for word in (proof.secret.hex(), *(proof.mac(p) for p in plan.probes))
                    if word in c.line]


def test_pair_keys_and_macs_depend_on_direction_port_run_and_secret():
    def mac(secret=b"s" * 32, run="run", sender="a", receiver="b", proto="udp", port=8472):
        return rr.probe_mac(secret, run, sender, receiver, proto, port)

    assert rr.pair_key(b"s" * 32, "a", "b") != rr.pair_key(b"s" * 32, "b", "a")
    variants = [mac(), mac(sender="b", receiver="a"), mac(port=8473), mac(proto="tcp"), mac(run="run2"),
                mac(secret=b"t" * 32), mac(receiver="c")]
    assert len(set(variants)) == len(variants)
    assert rr.MAC_RE.fullmatch(mac())


# --- the interfaces' MTUs (the facts probe's "ip-link" section): hostile until checked -----------

LINK_WORDS = st.sampled_from(["1:", "2:", "eth0:", "eth0@if9:", "<UP>", "<BROADCAST,UP,LOWER_UP>", "mtu", "1500",
                              "65536", "65537", "67", "0", "\u0661\u0665\u0660\u0660", "qdisc", "\x1b[2J", "lo:"])


def test_parse_ip_link_reads_real_lines_only():
    lines = ["1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen "
             "1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00",
             "2: eth0@if1209: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT",
             "3: ens5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9001 qdisc mq state UP",
             "4: bad: <UP> mtu 65537 qdisc x", "5: worse: <UP> mtu 1\u0665\u0660\u0660 qdisc x",
             "6: eth0: <UP> mtu 1400 qdisc x"]  # a repeated name keeps the first
    assert parsers.parse_ip_link(lines) == {"lo": 65536, "eth0": 1500, "ens5": 9001}


@given(st.lists(st.one_of(st.text(max_size=60), st.lists(LINK_WORDS, max_size=10).map(" ".join)), max_size=40))
def test_parse_ip_link_never_raises_and_keeps_only_possible_mtus(lines):
    for name, mtu in parsers.parse_ip_link(lines).items():
        assert name.isascii() and name.isprintable() and 1 <= len(name) <= 15 and 68 <= mtu <= 65536
