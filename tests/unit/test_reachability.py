"""Reachability between the nodes: which pairs and ports are probed (bootstrap.rules.reachability),
what the probes' answers mean, the matrix and the findings with their fix; the probe scripts
themselves (bootstrap.hosts.reachability) run here on 127.0.0.1."""

import subprocess
from dataclasses import replace

import pytest

from bootstrap.facts.host_facts import HostFacts, InterfaceAddress, K3sInstall, ListeningPort, SystemdUnit
from bootstrap.hosts import reachability as hr
from bootstrap.inventory.loader import parse_inventory
from bootstrap.rules import reachability as rr

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
    assert plan.listeners()["gpu-1"] == [("tcp", 10250), ("udp", 8472)]


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
    assert plan.listeners() == {"gpu-1": [("tcp", 10250), ("udp", 8472)]}


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


class LocalSession:
    """Runs each host's command here, as a host would (for the scripts' own test)."""

    def __init__(self):
        self.calls = 0

    def run_each(self, commands, what="command"):
        self.calls += 1
        out = {}
        for name, command in commands.items():
            proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
            out[name] = proc.stdout if proc.returncode == 0 else None
        return out


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
    """Two "nodes" on 127.0.0.1: b runs k3s (its TCP port is probed as it is), a is new (its
    listener answers). The listener, the prober and the collection really run; a port a's
    listener could not bind is reported untested, never reachable."""
    import socket

    tcp, udp, busy = free_ports(3)
    monkeypatch.setattr(hr, "LISTEN_SECONDS", 20)
    monkeypatch.setattr(rr, "rules", lambda inventory, mirror, family=4: [
        rr.Rule("tcp", tcp, "kubelet"), rr.Rule("udp", udp, "flannel VXLAN"), rr.Rule("tcp", busy, "taken")])
    inv = parse_inventory("cluster: t\nnodes:\n  - {name: a, address: 127.0.0.1, role: server}\n"
                          "  - {name: b, address: 127.0.0.2}\n")
    loopback = [InterfaceAddress("lo", "127.0.0.1", 8, "host")]
    facts = {"a": HostFacts(commands={"python3": "/usr/bin/python3"}, addresses=loopback),
             "b": HostFacts(commands={"python3": "/usr/bin/python3"}, addresses=loopback,
                            k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                           [SystemdUnit("k3s-agent.service", "loaded", "active")]),
                            listening_ports=[ListeningPort("tcp", tcp)])}
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("0.0.0.0", busy))  # taken after the facts were read: the listener says so
    holder.listen()
    session = LocalSession()
    try:
        report = hr.check(session, inv, facts, False)
    finally:
        holder.close()
    assert session.calls == report.round_trips == 3
    assert not [f for f in report.findings if f.severity == "error"], report.findings
    assert [f.message for f in report.findings] == [f"TCP {busy} from b not tested: could not listen: "
                                                    "Address already in use"]
    assert report.lines == ["reachability: 4 probes between 2 nodes on the cluster's addresses: 3 got through, "
                            "1 not tested"]
    for port, kind in ((tcp, socket.SOCK_STREAM), (udp, socket.SOCK_DGRAM)):  # the listener is gone
        with socket.socket(socket.AF_INET, kind) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT is no listener
            s.bind(("0.0.0.0", port))


def test_the_listener_hears_every_node_when_all_connect_at_once():
    """50 agents probe the server's ports at the same moment: 300 TCP connections arrive
    together (more than a default listen backlog of 128), some hold their hello back.
    Every hello is heard: none is dropped as a SYN the backlog had no room for, and no
    connection waits for the one before it to speak."""
    import socket
    import threading
    import time

    tcp, other = free_ports(2)
    token = "t0k3n"
    started = subprocess.run(hr.listener_command(token, 4, [("tcp", tcp), ("tcp", other)]), shell=True,
                             capture_output=True, text=True, timeout=30)
    assert hr.parse_bound(started.stdout) == {("tcp", tcp): "ok", ("tcp", other): "ok"}
    failures = []

    def node(i):
        port = tcp if i % 2 else other
        try:
            with socket.create_connection(("127.0.0.1", port), 3) as s:
                if i % 10 == 0:
                    time.sleep(1.5)  # a slow sender must not hold up the others
                s.sendall(f"bootstrap-reach {token} n{i}\n".encode())
                time.sleep(0.1)
        except OSError as exc:
            failures.append((i, exc))

    threads = [threading.Thread(target=node, args=(i,)) for i in range(300)]
    begun = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and time.monotonic() - begun < 10
    heard = hr.parse_received(subprocess.run(hr.collect_command(token), shell=True, capture_output=True,
                                             text=True, timeout=30).stdout)
    assert heard == {(f"n{i}", "tcp", tcp if i % 2 else other) for i in range(300)}


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
    assert hr.parse_received("got udp 8472 cp-1\ngot tcp 10250 gpu-1\nend\n") == {("cp-1", "udp", 8472),
                                                                                  ("gpu-1", "tcp", 10250)}
    assert hr.parse_received("got udp 8472 cp-1\n") is None  # the listener died mid-answer
