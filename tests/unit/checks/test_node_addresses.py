"""node-ip from the host's own addresses: the probe's `ip` sections, their parsers, the choice
(bootstrap.checks.node_addresses), the k3s config it makes and preflight's refusals."""

import hashlib
import ipaddress
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st
from test_facts_parsers import section

from bootstrap.host.facts.host_facts import FileState, HostFacts, K3sInstall
from bootstrap.host.facts.parsers import parse_ip_addr, parse_ip_route, parse_k3s
from bootstrap.host.facts.probe import PROBE_SCRIPT, parse_host_facts
from bootstrap.host.plan import k3sconfig
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks.preflight import check_node_addresses
from bootstrap.checks.node_addresses import choose, choose_all, with_node_ips
from bootstrap.host.plan.join_tokens import JoinTokens

TOKENS = JoinTokens("tok", "agent-tok")

# `ip -o addr show` and the probe's route listing on a cloud VM behind 1:1 NAT (the shapes of
# AWS/Lambda/GCP VMs: a private address on ens5, the public one nowhere on the host).
NAT_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host noprefixroute \\       valid_lft forever preferred_lft forever
2: ens5    inet 172.31.5.10/20 metric 100 brd 172.31.15.255 scope global dynamic ens5\\       valid_lft 3330sec preferred_lft 3330sec
2: ens5    inet6 fe80::8ff:fe12:3456/64 scope link \\       valid_lft forever preferred_lft forever
"""
NAT_ROUTES = """\
# inet
default via 172.31.0.1 dev ens5 proto dhcp src 172.31.5.10 metric 100
172.31.0.0/20 dev ens5 proto kernel scope link src 172.31.5.10 metric 100
172.31.0.2 dev ens5 proto dhcp scope link src 172.31.5.10 metric 100
# inet6
fe80::/64 dev ens5 proto kernel metric 256 pref medium
"""


def host(addr: str, routes: str, **extra) -> HostFacts:
    return replace(HostFacts(hostname="h"), addresses=parse_ip_addr(addr.splitlines()),
                   routes=parse_ip_route(routes.splitlines()), **extra)


def nat_host(private: str, subnet: str = "172.31.0.0/20", gateway: str = "172.31.0.1",
             iface: str = "ens5") -> HostFacts:
    prefix = subnet.split("/")[1]
    return host(f"1: lo    inet 127.0.0.1/8 scope host lo\\ x\n"
                f"2: {iface}    inet {private}/{prefix} brd 172.31.15.255 scope global dynamic {iface}\\ x\n",
                f"# inet\ndefault via {gateway} dev {iface} src {private}\n"
                f"{subnet} dev {iface} proto kernel scope link src {private}\n")


INV = parse_inventory("""\
cluster: t
nodes:
  - {name: cp-1, address: 203.0.113.10, role: server}
  - {name: gpu-1, address: 203.0.113.21}
  - {name: gpu-2, address: 198.51.100.7, node_ip: 172.31.9.9}
""")


def test_ip_addr_lines_parse_with_flags_labels_and_peers():
    lines = NAT_ADDR.splitlines() + [
        "3: eth1    inet 10.0.0.5/24 brd 10.0.0.255 scope global secondary eth1:vip\\       valid_lft forever",
        "4: wg0    inet 10.9.0.1 peer 10.9.0.2/32 scope global wg0\\       valid_lft forever preferred_lft forever",
        "5: eth2@if9    inet6 fd00::5/64 scope global deprecated dynamic mngtmpaddr \\       valid_lft 1sec",
        "garbage line",
    ]
    addresses = parse_ip_addr(lines)
    assert [(a.interface, a.address, a.prefix, a.scope) for a in addresses] == [
        ("lo", "127.0.0.1", 8, "host"), ("lo", "::1", 128, "host"), ("ens5", "172.31.5.10", 20, "global"),
        ("ens5", "fe80::8ff:fe12:3456", 64, "link"), ("eth1", "10.0.0.5", 24, "global"),
        ("wg0", "10.9.0.1", 32, "global"), ("eth2", "fd00::5", 64, "global")]
    assert addresses[2].flags == ["dynamic"] and addresses[4].flags == ["secondary"]  # labels are not flags
    assert addresses[6].flags == ["deprecated", "dynamic", "mngtmpaddr"]


def test_ip_route_lines_parse_both_families_multipath_and_kinds():
    routes = parse_ip_route((NAT_ROUTES + "unreachable 10.99.0.0/16\ndefault proto static metric 50\n"
                             "\tnexthop via 10.1.0.1 dev eth1 weight 1\n\tnexthop via 10.2.0.1 dev eth2 weight 1\n"
                             "default via fe80::1 dev ens5 proto ra metric 1024 expires 1799sec pref medium\n"
                             ).splitlines())
    default, subnet, dns, link6, unreachable, multipath, default6 = routes
    assert (default.destination, default.gateway, default.interface, default.source, default.metric) == \
        ("default", "172.31.0.1", "ens5", "172.31.5.10", 100)
    assert subnet.destination == "172.31.0.0/20" and dns.destination == "172.31.0.2/32"
    assert link6.family == 6 and unreachable.kind == "unreachable"
    assert (multipath.interface, multipath.gateway, multipath.family) == ("eth1", "10.1.0.1", 6)  # after "# inet6"
    assert default6.family == 6 and default6.gateway == "fe80::1"


def test_probe_lists_addresses_and_routes_and_an_unknown_stays_unknown():
    assert "ip -o addr show" in PROBE_SCRIPT and "ip -4 route show table main" in PROBE_SCRIPT
    facts = parse_host_facts(section("ip-addr", NAT_ADDR) + section("ip-route", NAT_ROUTES))
    assert [a.address for a in facts.addresses][:3] == ["127.0.0.1", "::1", "172.31.5.10"]
    assert facts.routes[0].destination == "default"
    assert facts.to_dict()["addresses"][2]["interface"] == "ens5"
    missing = parse_host_facts(section("ip-addr", "sh: ip: not found", rc=127) + section("ip-route", rc=127))
    assert missing.addresses is None and missing.routes == []


def test_behind_nat_node_ip_is_the_private_address_and_the_public_one_is_external():
    facts = {"cp-1": nat_host("172.31.5.10"), "gpu-1": nat_host("172.31.7.20")}
    chosen = choose(INV, INV.node("cp-1"), facts)
    assert (chosen.internal, chosen.external, chosen.nat) == ("172.31.5.10", "203.0.113.10", True)
    assert chosen.how == "on ens5, which reaches gpu-2"  # gpu-2's node_ip; gpu-1's own addresses do not count
    resolved = with_node_ips(INV, facts)
    server = k3sconfig.node_config(resolved, resolved.node("cp-1"), TOKENS)
    agent = k3sconfig.node_config(resolved, resolved.node("gpu-1"), TOKENS)
    assert (server["node-ip"], server["node-external-ip"]) == ("172.31.5.10", "203.0.113.10")
    assert (agent["node-ip"], agent["node-external-ip"]) == ("172.31.7.20", "203.0.113.21")
    assert agent["server"] == "https://172.31.5.10:6443"  # agents join over the private network
    assert {"203.0.113.10", "172.31.5.10"} <= set(server["tls-san"])


def test_the_old_config_without_facts_used_the_public_address_as_node_ip():
    """What crash-looped k3s behind NAT: no facts, node-ip is the inventory address."""
    config = k3sconfig.node_config(INV, INV.node("cp-1"), TOKENS)
    assert config["node-ip"] == "203.0.113.10" and "node-external-ip" not in config
    resolved = with_node_ips(INV, {"cp-1": nat_host("172.31.5.10")})
    assert k3sconfig.node_config(resolved, resolved.node("cp-1"), TOKENS)["node-ip"] == "172.31.5.10"


def test_an_address_on_the_host_stays_as_it_was():
    """No NAT (bare metal, a lab): node-ip is the inventory address, no external IP, and the
    config is byte for byte what it was before facts had addresses."""
    inv = parse_inventory("cluster: t\nnodes:\n  - {name: a, address: 172.31.5.10, role: server}\n")
    chosen = choose(inv, inv.node("a"), {"a": nat_host("172.31.5.10")})
    assert (chosen.internal, chosen.external, chosen.nat) == ("172.31.5.10", None, False)
    assert with_node_ips(inv, {"a": nat_host("172.31.5.10")}) == inv


def test_explicit_node_ip_wins_and_unknown_addresses_keep_the_inventory_address():
    facts = {"gpu-2": nat_host("172.31.5.10"), "gpu-1": replace(nat_host("1.2.3.4"), addresses=None)}
    assert choose(INV, INV.node("gpu-2"), facts).internal == "172.31.9.9"
    unknown = choose(INV, INV.node("gpu-1"), facts)
    assert (unknown.internal, unknown.external, unknown.nat) == ("203.0.113.21", None, False)
    assert choose(INV, INV.node("cp-1"), {}).internal == "203.0.113.10"  # no facts at all


def test_the_interface_that_reaches_the_other_nodes_wins_over_the_default_route():
    """A GPU box: ens5 (default route, its own /24) and ib0 on the fabric the other nodes share."""
    two_nics = host("2: ens5    inet 10.0.1.5/24 scope global ens5\\ x\n"
                    "3: ib0    inet 192.168.50.5/24 scope global ib0\\ x\n",
                    "# inet\ndefault via 10.0.1.1 dev ens5\n10.0.1.0/24 dev ens5 scope link src 10.0.1.5\n"
                    "192.168.50.0/24 dev ib0 scope link src 192.168.50.5\n")
    peer = host("2: ens5    inet 10.0.2.6/24 scope global ens5\\ x\n3: ib0    inet 192.168.50.6/24 scope global ib0\\ x\n",
                "# inet\ndefault via 10.0.2.1 dev ens5\n")
    inv = parse_inventory("cluster: t\nnodes:\n  - {name: a, address: 203.0.113.1, role: server}\n"
                          "  - {name: b, address: 203.0.113.2, node_ip: 192.168.50.6}\n")
    chosen = choose(inv, inv.node("a"), {"a": two_nics, "b": peer})
    assert chosen.internal == "192.168.50.5" and "ib0, which reaches b" in chosen.how
    # b's ib0 address as b lists it, not written by the operator: the default route's interface
    unnamed = parse_inventory("cluster: t\nnodes:\n  - {name: a, address: 203.0.113.1, role: server}\n"
                              "  - {name: b, address: 203.0.113.2}\n")
    alone = choose(unnamed, unnamed.node("a"), {"a": two_nics, "b": peer})
    assert alone.internal == "10.0.1.5" and "default route" in alone.how


def test_cni_and_unstable_addresses_are_never_chosen():
    """A converged node holds cni0 / flannel.1 addresses in 10.42.0.0/16, a failover VIP as a
    secondary address and docker0: none of them is the node's address."""
    converged = host("2: ens5    inet 172.31.5.10/20 scope global ens5\\ x\n"
                     "2: ens5    inet 172.31.5.99/20 scope global secondary ens5\\ x\n"
                     "3: flannel.1    inet 10.42.0.0/32 scope global flannel.1\\ x\n"
                     "4: cni0    inet 10.42.0.1/24 brd 10.42.0.255 scope global cni0\\ x\n"
                     "5: docker0    inet 172.17.0.1/16 scope global docker0\\ x\n"
                     "6: kube-ipvs0    inet 10.43.0.1/32 scope global kube-ipvs0\\ x\n",
                     "# inet\n10.42.0.0/24 dev cni0 src 10.42.0.1\n10.42.1.0/24 via 10.42.1.0 dev flannel.1 onlink\n"
                     "default via 172.31.0.1 dev ens5\n172.31.0.0/20 dev ens5 src 172.31.5.10\n")
    peer = host("3: flannel.1    inet 10.42.1.0/32 scope global flannel.1\\ x\n"
                "4: ens5    inet 172.31.6.1/20 scope global ens5\\ x\n", "")
    chosen = choose(INV, INV.node("cp-1"), {"cp-1": converged, "gpu-1": peer})
    assert chosen.internal == "172.31.5.10"
    assert [a for a in choose_all(INV, {"cp-1": converged, "gpu-1": peer}).values() if a.internal in
            ("10.42.0.0", "10.42.0.1", "172.17.0.1", "172.31.5.99")] == []


def test_flannel_iface_names_the_interface_for_node_ip():
    inv = parse_inventory("cluster: t\nk3s: {flannel_iface: ens6}\nnodes:\n  - {name: a, address: 203.0.113.1, role: server}\n")
    facts = host("2: ens5    inet 172.31.5.10/20 scope global ens5\\ x\n3: ens6    inet 10.8.0.3/24 scope global ens6\\ x\n",
                 "# inet\ndefault via 172.31.0.1 dev ens5\n")
    assert choose(inv, inv.node("a"), {"a": facts}).internal == "10.8.0.3"


def test_an_ipv6_cluster_takes_the_ipv6_address():
    inv = parse_inventory("cluster: t\nk3s: {cluster_cidr: 'fd00:42::/56', service_cidr: 'fd00:43::/112'}\n"
                          "nodes:\n  - {name: a, address: 2001:db8::1, role: server}\n")
    facts = host("2: ens5    inet 172.31.5.10/20 scope global ens5\\ x\n2: ens5    inet6 fd10::5/64 scope global \\ x\n",
                 "# inet6\ndefault via fe80::1 dev ens5\nfd10::/64 dev ens5\n")
    assert choose(inv, inv.node("a"), {"a": facts}).internal == "fd10::5"


def findings_by_check(inv, facts):
    return [(f.node, f.severity, f.message, f.fix) for f in check_node_addresses(inv, facts)]


def test_preflight_refuses_a_node_ip_the_host_does_not_have_with_the_fix():
    findings = findings_by_check(INV, {"gpu-2": nat_host("172.31.5.10")})
    (node, severity, message, fix), = findings
    assert (node, severity) == ("gpu-2", "error")
    assert "node_ip 172.31.9.9 is not an address of this host (its addresses: ens5 172.31.5.10/20)" in message
    assert "set nodes[].node_ip to one of the host's addresses" in fix


def test_preflight_says_what_it_uses_behind_nat_and_refuses_a_host_without_an_address():
    facts = {"cp-1": nat_host("172.31.5.10"), "gpu-1": host("1: lo    inet 127.0.0.1/8 scope host lo\\ x\n", "")}
    by_node = {f[0]: f for f in findings_by_check(INV, facts)}
    assert by_node["cp-1"][1] == "info"
    assert "203.0.113.10 is not on this host (a NAT); node-ip 172.31.5.10" in by_node["cp-1"][2]
    assert "node-external-ip 203.0.113.10" in by_node["cp-1"][2]
    assert by_node["gpu-1"][1] == "error" and by_node["gpu-1"][3] == "set nodes[].node_ip"


def test_preflight_warns_when_the_addresses_are_unknown():
    (finding,) = check_node_addresses(INV, {"cp-1": HostFacts()})
    assert finding.severity == "warning" and "iproute2" in finding.fix


@pytest.mark.parametrize("join_via", [None, "cp-2"])
def test_make_plans_joins_over_the_private_address_of_the_server_it_joins(join_via):
    from bootstrap.host.plan.all_hosts import make_plans
    from test_golden import TOKENS, online_artifacts

    inv = parse_inventory("cluster: t\nk3s: {version: v1.33.5+k3s1}\nnodes:\n"
                          "  - {name: cp-1, address: 203.0.113.10, role: server}\n"
                          "  - {name: cp-2, address: 203.0.113.11, role: server}\n"
                          "  - {name: cp-3, address: 203.0.113.12, role: server}\n"
                          "  - {name: gpu-1, address: 203.0.113.21}\n")
    facts = {"cp-1": nat_host("172.31.5.10"), "cp-2": nat_host("172.31.5.11"), "cp-3": nat_host("172.31.5.12"),
             "gpu-1": nat_host("172.31.7.20")}
    plans = make_plans(inv, facts, TOKENS, {None: online_artifacts("v1.33.5+k3s1", "amd64")}, "id",
                       join_via=inv.node(join_via) if join_via else None).plans
    config = next(u.content.decode() for u in plans["gpu-1"].uploads if u.path == "/etc/rancher/k3s/config.yaml")
    assert f"server: https://172.31.5.{11 if join_via else 10}:6443" in config
    assert "node-ip: 172.31.7.20" in config and "node-external-ip: 203.0.113.21" in config


# --- a node is judged by the inventory and its own answers (issue 32, item 11) ----------

# cp-1 behind NAT with a bridge of its own for local containers (br-lan: a host bridge, which
# a node-ip may be on; Docker's own br-<12 hex> never is).
DOCKER_SERVER = host("2: ens5    inet 172.31.5.10/20 scope global dynamic ens5\\ x\n"
                     "7: br-lan    inet 172.18.0.1/16 brd 172.18.255.255 scope global br-lan\\ x\n",
                     "# inet\ndefault via 172.31.0.1 dev ens5 src 172.31.5.10\n"
                     "172.31.0.0/20 dev ens5 proto kernel scope link src 172.31.5.10\n"
                     "172.18.0.0/16 dev br-lan proto kernel scope link src 172.18.0.1\n")
# A hostile agent: it lists an address inside cp-1's docker network as one of its own.
HOSTILE_PEER = host("2: ens5    inet 172.18.0.99/16 scope global ens5\\ x\n",
                    "# inet\ndefault via 172.18.0.1 dev ens5\n")


TWO_NODES = parse_inventory("cluster: t\nnodes:\n  - {name: cp-1, address: 203.0.113.10, role: server}\n"
                            "  - {name: gpu-1, address: 203.0.113.21}\n")


def test_a_peer_listing_an_address_in_a_servers_docker_network_does_not_move_its_node_ip():
    """A fresh cluster: gpu-1's made-up 172.18.0.99 had made cp-1's docker bridge the
    interface that "reaches" it, and cp-1's node-ip 172.18.0.1."""
    facts = {"cp-1": DOCKER_SERVER, "gpu-1": HOSTILE_PEER}
    chosen = choose(TWO_NODES, TWO_NODES.node("cp-1"), facts)
    assert chosen.internal == "172.31.5.10" and chosen.how == "on ens5, the default route's interface"
    assert chosen == choose(TWO_NODES, TWO_NODES.node("cp-1"), {"cp-1": DOCKER_SERVER})
    resolved = with_node_ips(TWO_NODES, facts)
    assert k3sconfig.node_config(resolved, resolved.node("cp-1"), TOKENS)["node-ip"] == "172.31.5.10"


def test_a_docker_network_bridge_is_never_a_node_ip_not_even_the_one_a_node_runs_with():
    """A node an earlier version moved into a docker network (br-<12 hex of the network id>)
    does not keep it: its node-ip goes back to the host's own interface."""
    docker = host("2: ens5    inet 172.31.5.10/20 scope global ens5\\ x\n"
                  "7: br-5e1f0c2a9b3d    inet 172.18.0.1/16 scope global br-5e1f0c2a9b3d\\ x\n",
                  "# inet\ndefault via 172.31.0.1 dev ens5 src 172.31.5.10\n"
                  "172.18.0.0/16 dev br-5e1f0c2a9b3d proto kernel scope link src 172.18.0.1\n")
    peer = replace(TWO_NODES.node("gpu-1"), node_ip="172.18.0.99")  # even one the operator wrote
    inv = replace(TWO_NODES, nodes=(TWO_NODES.node("cp-1"), peer))
    chosen = choose(inv, inv.node("cp-1"), {"cp-1": running(docker, "172.18.0.1")})
    assert chosen.internal == "172.31.5.10" and chosen.how == "on ens5, the default route's interface"


def test_what_the_operator_wrote_for_a_peer_still_counts():
    """The inventory's node_ip of gpu-2 (172.31.9.9) is on cp-1's ens6 subnet: ens6 wins over
    the default route, as before; the same address listed by gpu-2 itself would not."""
    two = host("2: ens5    inet 10.0.1.5/24 scope global ens5\\ x\n3: ens6    inet 172.31.9.1/24 scope global ens6\\ x\n",
               "# inet\ndefault via 10.0.1.1 dev ens5\n172.31.9.0/24 dev ens6 scope link src 172.31.9.1\n")
    chosen = choose(INV, INV.node("cp-1"), {"cp-1": two})
    assert chosen.internal == "172.31.9.1" and "ens6, which reaches gpu-2" in chosen.how


def running(facts: HostFacts, node_ip: str) -> HostFacts:
    return replace(facts, k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [], node_ip))


def test_a_running_node_keeps_the_node_ip_it_runs_with():
    """cp-1 runs with node-ip 10.0.1.5 (ens5); an inventory change (gpu-2's node_ip, on its
    ens6 subnet) would make ens6 the choice of a fresh node, not of this one. What the
    operator names (node_ip, flannel_iface) still wins; an address the host lost is not kept."""
    two = host("2: ens5    inet 10.0.1.5/24 scope global ens5\\ x\n3: ens6    inet 172.31.9.1/24 scope global ens6\\ x\n",
               "# inet\ndefault via 10.0.1.1 dev ens5\n172.31.9.0/24 dev ens6 scope link src 172.31.9.1\n")
    kept = choose(INV, INV.node("cp-1"), {"cp-1": running(two, "10.0.1.5")})
    assert kept.internal == "10.0.1.5" and "runs with" in kept.how
    assert choose(INV, INV.node("cp-1"), {"cp-1": running(two, "10.0.1.77")}).internal == "172.31.9.1"  # gone
    named = replace(INV, nodes=tuple(replace(n, node_ip="172.31.9.1") if n.name == "cp-1" else n for n in INV.nodes))
    assert choose(named, named.node("cp-1"), {"cp-1": running(two, "10.0.1.5")}).internal == "172.31.9.1"
    iface = replace(INV, k3s=replace(INV.k3s, flannel_iface="ens6"))
    assert choose(iface, iface.node("cp-1"), {"cp-1": running(two, "10.0.1.5")}).internal == "172.31.9.1"


def test_an_existing_cluster_with_a_hostile_peer_keeps_its_config_and_k3s_running():
    """The next `up` after a peer starts listing cp-1's docker network: cp-1's config.yaml is
    not rewritten and its k3s not restarted, even where the node-ip came from an older rule."""
    from bootstrap.host.plan.all_hosts import make_plans
    from bootstrap.host.parts.k3s_service import CONFIG
    from test_golden import TOKENS as GOLDEN_TOKENS, online_artifacts

    inv = replace(TWO_NODES, k3s=replace(TWO_NODES.k3s, version="v1.33.5+k3s1"))
    artifacts = {None: online_artifacts("v1.33.5+k3s1", "amd64")}
    first = make_plans(inv, {"cp-1": DOCKER_SERVER}, GOLDEN_TOKENS, artifacts, "id").plans["cp-1"]
    config = next(u for u in first.uploads if u.path == CONFIG)
    assert b"node-ip: 172.31.5.10\n" in config.content
    written = replace(running(DOCKER_SERVER, "172.31.5.10"),
                      files={CONFIG: FileState(0o600, hashlib.sha256(config.content).hexdigest())})
    again = make_plans(inv, {"cp-1": written, "gpu-1": HOSTILE_PEER}, GOLDEN_TOKENS, artifacts, "id").plans["cp-1"]
    assert CONFIG not in [u.path for u in again.uploads] and again.service != "restart"


def test_the_probe_reads_the_node_ip_a_node_runs_with():
    lines = ["config: present", "node-ip: 172.31.5.10", "node-ip: 10.9.9.9"]
    assert parse_host_facts(section("k3s", lines)).k3s.node_ip == "172.31.5.10"  # the first, as k3s reads it
    assert "grep -m2 -E '^(node-ip|embedded-registry):' /etc/rancher/k3s/config.yaml" in PROBE_SCRIPT
    for value, read in [("'fd10::5'", "fd10::5"), ('"172.31.5.10"', "172.31.5.10"), ("fd10:0::5", "fd10::5"),
                        ("10.0.0.1,fd10::5", None), ("[10.0.0.1]", None), ("x" * 100000, None), ("", None)]:
        assert parse_k3s(["config: present", f"node-ip: {value}"]).node_ip == read


@given(st.text(max_size=200))
def test_a_node_ip_line_is_an_ip_or_nothing(value):
    read = parse_k3s([f"node-ip: {value}"]).node_ip
    assert read is None or ipaddress.ip_address(read)
