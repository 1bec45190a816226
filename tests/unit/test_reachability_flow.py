"""The reachability check inside preflight (flows.preflight_phase.examine, which `up`,
`plan`, `rebuild` and `check --hosts` share), in-process: a fake network answers the
listener, prober and collector commands the way hosts behind a firewall would."""

import json
import shlex
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from test_host_phase_flow import healthy_host
from test_join_tokens import gather_and_plan

from bootstrap import progress
from bootstrap.facts.host_facts import InterfaceAddress, K3sInstall, ListeningPort, SystemdUnit
from bootstrap.flows.host_phase import PreflightFailed
from bootstrap.hostparts.manifest import ID_KEY
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir

ADDRESSES = {"cp": "10.0.0.1", "a1": "10.0.0.2", "a2": "10.0.0.3"}


def host(name):
    return replace(healthy_host(name), addresses=[InterfaceAddress("eth0", ADDRESSES[name], 24)])


class FirewalledSession(FakeSession):
    """Hosts that run the probe scripts; `dropped` holds (sender, receiver, proto, port)."""

    def __init__(self, inventory, facts, dropped=()):
        super().__init__(inventory, facts)
        self.dropped, self.calls, self.heard, self.expect = set(dropped), [], {}, {}
        self.by_address = {a: n for n, a in ADDRESSES.items()}

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        self.calls.append(sorted(commands))
        out = {}
        for name, command in commands.items():
            (script,) = shlex.split(command)[2:]  # the script only: what it needs is on its stdin
            given = json.loads(stdin[name])
            if "control.bind" in script:  # a listener: binds every port it is given
                self.heard[name] = set()
                self.expect[name] = {(p, n, line): line.split()[-1] for p, n, _, line in given["expect"]}
                out[name] = "".join(f"bound {proto} {port}\n" for proto, port, _ in given["listen"])
            elif "create_connection" in script:  # a prober
                lines = []
                for proto, address, port, line in given["probes"]:
                    receiver = self.by_address[address]
                    lost = (name, receiver, proto, port) in self.dropped
                    mac = self.expect.get(receiver, {}).get((proto, port, line))
                    if not lost and receiver in self.heard and mac:
                        self.heard[receiver].add(f"got {proto} {port} {name} {mac}\n")
                    lines.append(f"sent {proto} {address} {port} {'sent' if proto == 'udp' else 'timeout' if lost else 'ok'}\n")
                out[name] = "".join(lines)
            else:  # the collector
                out[name] = "".join(sorted(self.heard.pop(name))) + "end\n"
        return out


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
    assert session.calls == [["a1", "a2", "cp"]] * 3 and session.executed == []


def test_open_ports_pass_and_a_converged_cluster_costs_no_round_trip(cluster, capsys):
    inventory, state = cluster
    session = FirewalledSession(inventory, {n: host(n) for n in ADDRESSES})
    plan(inventory, state, session)
    assert "reachability: 14 probes between 3 nodes on the cluster's addresses: 14 got through" \
        in capsys.readouterr().out
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
        if what == "reachability answers":
            a2_mac = next(iter(self.expect["a2"].values()))  # what a1 could only have stolen
            out["a2"] = out["a2"].replace("end\n", f"got udp 8472 cp {'0' * 64}\ngot udp 8472 cp {a2_mac}\nend\n")
        if what == "reachability probes":
            out["a1"] = "sent tcp 10.0.0.1 \x1b[2J6443 ok\n" * 10 + "sent tcp 10.0.0.1 99999999999999999999 ok\n"
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
    assert session.calls == [["a1", "a2", "cp"]] * 3
