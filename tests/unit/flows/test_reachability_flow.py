"""The reachability check inside preflight (flows.preflight_phase.examine, which `up`,
`plan`, `rebuild` and `check --hosts` share), in-process: a fake network answers each host's
one command (listen and probe) the way hosts behind a firewall would."""

import json
import shlex
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from test_host_phase_flow import healthy_host
from test_join_tokens import gather_and_plan

from bootstrap import progress
from bootstrap.host.facts.host_facts import InterfaceAddress, K3sInstall, ListeningPort, SystemdUnit
from bootstrap.flows.preflight_phase import PreflightFailed
from bootstrap.host.parts.manifest import ID_KEY
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

ADDRESSES = {"cp": "10.0.0.1", "a1": "10.0.0.2", "a2": "10.0.0.3"}


def host(name):
    return replace(healthy_host(name), addresses=[InterfaceAddress("eth0", ADDRESSES[name], 24)], mtus={"eth0": 1500})


class FirewalledSession(FakeSession):
    """Hosts that run the probe scripts; `dropped` holds (sender, receiver, proto, port);
    `path_mtu[(sender, receiver)]`: the largest datagram the path between them carries;
    `fragmenting`: the (sender, receiver)s whose path fragments a larger datagram sent without
    don't-fragment and lets the fragments through (the others drop them)."""

    def __init__(self, inventory, facts, dropped=(), path_mtu=None, fragmenting=()):
        super().__init__(inventory, facts)
        self.dropped, self.calls, self.heard, self.expect = set(dropped), [], {}, {}
        self.path_mtu, self.fragmenting = path_mtu or {}, set(fragmenting)
        self.by_address = {a: n for n, a in ADDRESSES.items()}

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        """Each host's one command: its listener binds, its probes go out, what got through
        is heard; every host's answer is bound, sent, got and size lines, then "end"."""
        self.calls.append(sorted(commands))
        given = {}
        for name, command in commands.items():
            (script,) = shlex.split(command)[2:]  # the script only: what it needs is on its stdin
            assert "s.bind((address, port))" in script and "create_connection" in script  # listens and probes
            given[name] = json.loads(stdin[name])
        self.expect = {n: {(p, port, line): line.split()[-1] for p, port, _, line, _ in g["expect"]}
                       for n, g in given.items()}
        heard, sent = {n: [] for n in given}, {n: [] for n in given}
        for name, g in given.items():
            for proto, address, port, line, sizes in g["probes"]:
                receiver = self.by_address[address]
                lost = (name, receiver, proto, port) in self.dropped
                mac = self.expect.get(receiver, {}).get((proto, port, line))
                if not lost and mac:
                    heard[receiver].append(f"got {proto} {port} {name} {mac}")
                    fits = [size for size in sizes if size <= self.path_mtu.get((name, receiver), 1500)]
                    if fits:
                        heard[receiver].append(f"size {proto} {port} {name} {mac} {max(fits)}")
                    if sizes and (fits and max(fits) == max(sizes) or (name, receiver) in self.fragmenting):
                        heard[receiver].append(f"whole {proto} {port} {name} {mac} {max(sizes)}")
                word = "sent" if proto == "udp" else "timeout" if lost else "ok"
                sent[name].append(f"sent {proto} {address} {port} {word}")
        return {name: "\n".join([f"bound {proto} {port}" for proto, port, _ in g["listen"]] + sent[name]
                                 + sorted(heard[name], key=lambda x: x.startswith("size")) + ["end"]) + "\n"
                for name, g in given.items()}


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "k3s": {"version": "v1.33.5+k3s1"},
                                    "images": {"embedded_mirror": False}, "nodes": [
        {"name": n, "address": a, "role": "server" if n == "cp" else "agent"} for n, a in ADDRESSES.items()]}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def plan(inventory, state, session):
    return gather_and_plan(session, inventory, state, progress.Console(progress.Reporter()), create_token=False)


def test_a_dropped_port_stops_preflight_with_the_matrix_and_the_rule(cluster, capsys):
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES}, dropped={("cp", "a2", "udp", 8472)})
    with pytest.raises(PreflightFailed, match="1 problem"):
        plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "FAIL a2: reachability: UDP 8472 (flannel VXLAN) on 10.0.0.3 is not reachable from cp" in out
    assert "fix: open UDP 8472 inbound on a2 from cp (10.0.0.1) in the provider's firewall" in out
    assert "  cp         -          udp/8472" in out and "  a2         ok         -" in out  # the nodes involved
    assert session.calls == [["a1", "a2", "cp"]] and session.executed == []  # one round trip, no change


def test_open_ports_pass_and_a_converged_cluster_costs_no_round_trip(cluster, capsys):
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES})
    plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "reachability: 14 probes between 3 nodes on the cluster's addresses: 14 got through" in out
    assert "path MTU: 6 of 6 pairs carry their interface's MTU" in out
    running = {n: replace(host(n), manifest={ID_KEY: state.cluster_id}, listening_ports=[ListeningPort("tcp", 6443), ListeningPort("tcp", 10250)],
                          k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [
                              SystemdUnit("k3s.service" if n == "cp" else "k3s-agent.service", "loaded", "active")]))
               for n in ADDRESSES}
    converged = FirewalledSession(inventory, running)
    plan(inventory, state, converged)
    assert converged.calls == [] and "reachability" not in capsys.readouterr().out


class LyingSession(FirewalledSession):
    """a2's listener claims to have heard cp on the dropped port, with a made-up MAC and with
    the MAC of another of its pairs; a1's prober prints escape sequences and junk."""

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        out = super().run_each(commands, what, stdin, timeout)
        a2_mac = next(iter(self.expect["a2"].values()))  # what a1 could only have stolen
        out["a2"] = out["a2"].replace("end\n", f"got udp 8472 cp {'0' * 64}\ngot udp 8472 cp {a2_mac}\nend\n")
        out["a1"] = "sent tcp 10.0.0.1 \x1b[2J6443 ok\n" * 10 + "sent tcp 10.0.0.1 99999999999999999999 ok\n" + \
            "".join(line + "\n" for line in out["a1"].splitlines() if not line.startswith("sent"))
        return out


def test_a_reported_probe_counts_only_with_the_tools_own_mac_and_junk_stops_nothing(cluster, capsys):
    """a2's listener reports cp's probe it never got: the tool recomputes each MAC and still
    finds UDP 8472 from cp blocked. a1's junk raises nothing and reaches no terminal."""
    inventory, state = cluster
    session = LyingSession(inventory, {n: host(n) for n in ADDRESSES}, dropped={("cp", "a2", "udp", 8472)})
    with pytest.raises(PreflightFailed):
        plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "FAIL a2: reachability: UDP 8472 (flannel VXLAN) on 10.0.0.3 is not reachable from cp" in out
    assert "\x1b" not in out
    assert session.calls == [["a1", "a2", "cp"]]


def test_a_path_below_the_interface_mtu_is_an_error_naming_the_pair_and_the_mtu_to_set(cluster, capsys):
    """cp -> a2 carries 1400 bytes, the interfaces 1500, and drops fragments: flannel VXLAN's
    full-size packets would be lost. The other pairs are fine; so is a2 -> cp (it is measured
    on its own)."""
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES}, path_mtu={("cp", "a2"): 1400})
    with pytest.raises(PreflightFailed, match="1 problem"):
        plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "FAIL cp: mtu: path MTU from cp to a2 (10.0.0.3): 1400 bytes get through with don't-fragment, less " \
           "than cp's eth0 MTU 1500, which flannel VXLAN fills (it adds 50 bytes and gives pods 1450)" in out
    assert "fix: set the MTU of cp's eth0 (flannel-iface) to 1400 on every node, so pods get 1350, or turn on the " \
           "provider's jumbo frames" in out
    assert "path MTU: 5 of 6 pairs carry their interface's MTU; cp -> a2: 1400 of 1500" in out
    assert "  cp         -          mtu1400\n  a2         ok         -" in out  # the matrix: rows send
    assert session.calls == [["a1", "a2", "cp"]]  # no extra round trip: one in all


def test_a_path_below_the_interface_mtu_that_fragments_is_a_warning_and_stops_nothing(cluster, capsys):
    """cp -> a2 carries 1400 bytes but fragments the larger datagrams sent without
    don't-fragment, as flannel's VXLAN sends: slower, not broken. A warning with the cost and
    the flannel MTU fix; preflight goes on."""
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES}, path_mtu={("cp", "a2"): 1400},
                                fragmenting={("cp", "a2")})
    plan(inventory, state, session)  # no PreflightFailed
    out = capsys.readouterr().out
    assert "WARN cp: mtu: path MTU from cp to a2 (10.0.0.3): 1400 bytes get through with don't-fragment, less " \
           "than cp's eth0 MTU 1500, which flannel VXLAN fills (it adds 50 bytes and gives pods 1450); flannel " \
           "VXLAN does not set don't-fragment, so its full-size packets are fragmented on the way" in out
    assert "fix: set the MTU of cp's eth0 (flannel-iface) to 1400 on every node, so pods get 1350" in out
    assert "path MTU: 5 of 6 pairs carry their interface's MTU; cp -> a2: 1400 of 1500 (fragmented)" in out
    assert "what did not get through" not in out and "FAIL" not in out


def test_a_path_that_carries_no_full_size_datagram_at_all_is_named_too(cluster, capsys):
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES}, path_mtu={("a1", "cp"): 1000})
    with pytest.raises(PreflightFailed):
        plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "FAIL a1: mtu: path MTU from a1 to cp (10.0.0.1): less than 1280 bytes get through" in out
    assert "set the MTU of a1's eth0 (flannel-iface) to 1280" in out


class OversizeSession(FirewalledSession):
    """a2's listener claims a 9000-byte datagram from cp (more than cp sent) and one for a pair
    with a made-up MAC: neither counts."""

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        out = super().run_each(commands, what, stdin, timeout)
        out["a2"] = "".join(line + "\n" for line in out["a2"].splitlines()
                            if not line.startswith(("size", "whole")) and line != "end")
        mac = next(m for (p, n, line), m in self.expect["a2"].items() if line.split()[2] == "cp" and p == "udp")
        out["a2"] += (f"size udp 8472 cp {mac} 9000\nsize udp 8472 a1 {'0' * 64} 1500\n"
                      f"whole udp 8472 cp {mac} 9000\nwhole udp 8472 a1 {'0' * 64} 1500\nend\n")
        return out


def test_a_receiver_cannot_claim_more_than_was_sent_nor_for_another_pair(cluster, capsys):
    inventory, state = cluster
    session = OversizeSession(inventory, {n: host(n) for n in ADDRESSES})
    with pytest.raises(PreflightFailed):
        plan(inventory, state, session)
    out = capsys.readouterr().out
    assert "FAIL cp: mtu: path MTU from cp to a2 (10.0.0.3): less than 1280 bytes" in out
    assert "FAIL a1: mtu: path MTU from a1 to a2 (10.0.0.3): less than 1280 bytes" in out
