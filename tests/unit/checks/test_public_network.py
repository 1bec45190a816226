"""network.mode public: machines rented at several providers form one cluster over their
public addresses (WireGuard), with provider and region labels; what the inventory refuses,
the k3s config it makes, preflight's checks (WireGuard module, clock skew, etcd across NAT,
RDMA across providers, quorum by provider) and the reachability plan on public addresses."""

import pytest

from bootstrap.errors import InvalidInput
from bootstrap.host.facts.host_facts import HostFacts, InterfaceAddress, PciDevice, Route
from bootstrap.host.plan import k3sconfig
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks.preflight import check_clock_skew, check_providers, preflight
from bootstrap.checks import reachability as rr
from bootstrap.checks.node_addresses import with_node_ips
from bootstrap.checks.providers import PROVIDER_LABEL, REGION_LABEL, quorum_loss_by_provider
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them

TOKENS = JoinTokens("tok", "agent-tok")

PUBLIC = """\
cluster: multi
network: {mode: public}
nodes:
  - {name: cp-1, address: 198.51.100.10, role: server, provider: hetzner, region: fsn1}
  - {name: gpu-1, address: 203.0.113.21, provider: lambda, region: us-east-1}
  - {name: gpu-2, address: 192.0.2.31, provider: runpod}
"""
# Each host holds only its provider's private address (1:1 NAT), as on most clouds.
PRIVATE = {"cp-1": "10.0.1.10", "gpu-1": "10.0.2.21", "gpu-2": "10.0.3.31"}


def nat_host(name, **extra):
    private = PRIVATE[name]
    net = private.rsplit(".", 1)[0]
    return HostFacts(hostname=name, commands={"python3": "/usr/bin/python3"},
                     addresses=[InterfaceAddress("lo", "127.0.0.1", 8, "host"), InterfaceAddress("eth0", private, 24)],
                     routes=[Route("default", "eth0", gateway=f"{net}.1", source=private),
                             Route(f"{net}.0/24", "eth0", source=private)], **extra)


def facts(**extra):
    return {n: nat_host(n, **extra) for n in PRIVATE}


def problems(text):
    with pytest.raises(InvalidInput) as caught:
        parse_inventory(text, "inv.yaml")
    return caught.value.problems


def test_public_mode_means_wireguard_and_refuses_an_unencrypted_backend_and_host_names():
    inventory = parse_inventory(PUBLIC)
    assert inventory.network.public and inventory.k3s.flannel_backend == "wireguard-native"
    assert inventory.node("gpu-1").provider == "lambda" and inventory.node("cp-1").region == "fsn1"
    assert parse_inventory(PUBLIC.replace("{mode: public}", "{}")).k3s.flannel_backend == "vxlan"
    (vxlan,) = problems(PUBLIC.replace("network: {mode: public}", "network: {mode: public}\nk3s: {flannel_backend: vxlan}"))
    assert vxlan.path == "k3s.flannel_backend" and "unencrypted" in vxlan.message and vxlan.line == 3
    (name,) = problems(PUBLIC.replace("203.0.113.21", "gpu1.example.com"))
    assert name.path == "nodes[1].address" and "public IP" in name.hint
    (mode,) = problems(PUBLIC.replace("mode: public", "mode: publc"))
    assert "'publc' is not a valid network mode" in mode.message and "public" in mode.hint
    (label,) = problems(PUBLIC.replace("provider: lambda", "provider: 'lambda labs'"))
    assert label.path == "nodes[1].provider"
    (owned,) = problems(PUBLIC + "k3s:\n  server_config: {flannel-external-ip: true}\n")
    assert "network.mode: public" in owned.hint


def test_public_mode_config_every_node_announces_its_public_address_and_joins_the_servers_public_one():
    inventory = with_node_ips(parse_inventory(PUBLIC), facts())
    server = k3sconfig.node_config(inventory, inventory.node("cp-1"), TOKENS)
    agent = k3sconfig.node_config(inventory, inventory.node("gpu-1"), TOKENS)
    assert server["flannel-backend"] == "wireguard-native" and server["flannel-external-ip"] is True
    assert (server["node-ip"], server["node-external-ip"]) == ("10.0.1.10", "198.51.100.10")
    assert (agent["node-ip"], agent["node-external-ip"]) == ("10.0.2.21", "203.0.113.21")
    assert agent["server"] == "https://198.51.100.10:6443"  # its private address is at another provider
    assert "flannel-external-ip" not in agent and "flannel-backend" not in agent  # server flags only
    assert f"{PROVIDER_LABEL}=lambda" in agent["node-label"] and f"{REGION_LABEL}=us-east-1" in agent["node-label"]
    assert set(server["tls-san"]) >= {"198.51.100.10", "10.0.1.10"}
    # A host that holds its public address still announces it (flannel-external-ip reads it).
    plain = parse_inventory(PUBLIC)
    assert k3sconfig.node_config(plain, plain.node("gpu-2"), TOKENS)["node-external-ip"] == "192.0.2.31"
    private = with_node_ips(parse_inventory(PUBLIC.replace("{mode: public}", "{}")), facts())
    assert k3sconfig.node_config(private, private.node("gpu-1"), TOKENS)["server"] == "https://10.0.1.10:6443"
    assert "flannel-external-ip" not in k3sconfig.node_config(private, private.node("cp-1"), TOKENS)


def test_preflight_wants_wireguard_on_every_node_and_frees_its_port():
    inventory = parse_inventory(PUBLIC)
    found = [f for f in preflight(inventory, facts(wireguard="missing")) if f.check == "wireguard"]
    assert {f.node for f in found} == set(PRIVATE) and all(f.severity == "error" for f in found)
    assert "apt install wireguard" in found[0].fix
    assert not [f for f in preflight(inventory, facts(wireguard="module")) if f.check == "wireguard"]
    assert not [f for f in preflight(inventory, facts(wireguard=None)) if f.check == "wireguard"]  # not probed
    from bootstrap.host.facts.host_facts import ListeningPort

    taken = facts(wireguard="loaded", listening_ports=[ListeningPort("udp", 51820, process="wg-quick")])
    assert any(f.check == "ports" and "51820" in f.message for f in preflight(inventory, taken))


def test_clock_skew_is_a_warning_from_a_second_and_an_error_from_thirty():
    inventory = parse_inventory(PUBLIC)
    skewed = facts(clock_offset_s=0.1)
    assert check_clock_skew(inventory, skewed) == []
    skewed["gpu-2"] = nat_host("gpu-2", clock_offset_s=-4.2)
    (late,) = check_clock_skew(inventory, skewed)
    assert (late.node, late.severity) == ("gpu-2", "warning") and "4.3 s behind" in late.message
    assert "timedatectl" in late.fix
    skewed["gpu-2"] = nat_host("gpu-2", clock_offset_s=95.0)
    assert [(f.node, f.severity) for f in check_clock_skew(inventory, skewed)] == [("gpu-2", "error")]


def test_a_host_reporting_a_clock_far_off_fails_itself_never_an_honest_node():
    """The median is the peers' word: with two nodes, one reporting 95 s had put both 47.5 s
    off it and failed the honest server too. A node fails only when this machine's clock also
    says it is off; the other way round (this machine's clock wrong, the nodes agreeing) no node fails."""
    two = parse_inventory(PUBLIC.replace("  - {name: gpu-2, address: 192.0.2.31, provider: runpod}\n", ""))
    found = check_clock_skew(two, {"cp-1": nat_host("cp-1", clock_offset_s=0.1),
                                   "gpu-1": nat_host("gpu-1", clock_offset_s=95.0)})
    assert {(f.node, f.severity) for f in found} == {("cp-1", "warning"), ("gpu-1", "error")}
    (honest,) = [f for f in found if f.node == "cp-1"]
    assert "this machine's clock is within 30 s of it" in honest.message
    # this machine 100 s behind every node, the nodes together: nothing to say
    assert check_clock_skew(two, {"cp-1": nat_host("cp-1", clock_offset_s=100.1),
                                  "gpu-1": nat_host("gpu-1", clock_offset_s=100.3)}) == []


def test_servers_at_several_providers_behind_nat_cannot_form_etcd_and_rdma_does_not_cross_providers():
    three = PUBLIC.replace("gpu-1, address: 203.0.113.21,", "gpu-1, address: 203.0.113.21, role: server,") \
                  .replace("gpu-2, address: 192.0.2.31,", "gpu-2, address: 192.0.2.31, role: server,")
    inventory = parse_inventory(three)
    (etcd,) = [f for f in check_providers(inventory, facts(), gpu_nodes(inventory, facts())) if f.check == "etcd"]
    assert "10.0.1.10" in etcd.message and "one provider" in etcd.fix
    rdma = parse_inventory(PUBLIC.replace("network: {mode: public}", "network: {mode: public, rdma: {interfaces: [ib0]}}")
                           .replace("provider: runpod", "provider: runpod, gpu: {enabled: true}")
                           .replace("provider: lambda,", "provider: lambda, gpu: {enabled: true},"))
    (cross,) = [f for f in check_providers(rdma, facts(), gpu_nodes(rdma, facts())) if f.check == "rdma"]
    assert "lambda (gpu-1)" in cross.message and "runpod (gpu-2)" in cross.message


def servers_at(*providers):
    return parse_inventory("cluster: q\nnodes:\n" + "".join(
        f"  - {{name: {name}, address: 10.0.0.{i}, role: server, provider: {p}}}\n"
        for i, (name, p) in enumerate(zip("abc", providers), start=1)))


def test_one_provider_holding_the_servers_majority_is_named():
    two_one = servers_at("lambda", "lambda", "hetzner")
    layout = quorum_loss_by_provider(two_one)
    assert layout == "servers: lambda 2 (a, b), hetzner 1 (c); losing lambda loses etcd quorum (2 of 3 needed)"
    assert quorum_loss_by_provider(servers_at("lambda", "runpod", "hetzner")) is None
    assert quorum_loss_by_provider(servers_at("lambda", "lambda", "lambda")) is None  # one provider: no split
    (warning,) = [f for f in check_providers(two_one, {}, gpu_nodes(two_one, {})) if f.check == "quorum"]
    assert warning.severity == "warning"


def test_reachability_in_public_mode_probes_public_addresses_and_names_the_providers_firewall():
    inventory = parse_inventory(PUBLIC)
    plan = rr.plan_probes(inventory, facts(), embedded_mirror=True)
    assert {p.address for p in plan.probes if p.receiver == "gpu-1"} == {"203.0.113.21"}
    assert {(p.proto, p.port) for p in plan.probes if p.receiver == "gpu-1"} == {
        ("udp", 51820), ("tcp", 10250), ("tcp", 6443), ("tcp", 5001)}
    blocked = [rr.Outcome(p, not (p.receiver == "gpu-1" and p.proto == "udp"), "") for p in plan.probes]
    (finding,) = rr.findings(inventory, plan, blocked)
    assert finding.node == "gpu-1" and "UDP 51820" in finding.message and "cp-1 (hetzner)" in finding.message
    assert "in lambda's firewall (security group)" in finding.fix and "network.mode: public" not in finding.fix
    matrix = rr.render_matrix(["cp-1", "gpu-1", "gpu-2"], blocked, plan.label)
    assert "gpu-1 (lambda)" in matrix[0] and "udp/51820" in matrix[1]
    # The same hosts in private mode: their private addresses, and the advice to go public.
    private = parse_inventory(PUBLIC.replace("{mode: public}", "{}"))
    plan = rr.plan_probes(private, facts(), embedded_mirror=False)
    assert {p.address for p in plan.probes if p.receiver == "gpu-1"} == {"10.0.2.21"}
    failed = [rr.Outcome(p, p.receiver == p.sender, "timed out") for p in plan.probes]
    fixes = {f.node: f.fix for f in rr.findings(private, plan, failed)}
    assert "set network.mode: public" in fixes["gpu-1"] and "hetzner, runpod" in fixes["gpu-1"]


def test_nccl_measures_within_the_largest_provider_and_says_so():
    from bootstrap.cluster.checks import nccl_group, nccl_job
    from bootstrap.host.facts.host_facts import Gpu

    inventory = parse_inventory(PUBLIC + "  - {name: gpu-3, address: 192.0.2.32, provider: runpod}\n"
                                + "validate: {nccl: {min_busbw_gbps: 100}}\n")
    gpus = [inventory.node(n) for n in ("gpu-1", "gpu-2", "gpu-3")]
    chosen, within = nccl_group(gpus)
    assert [n.name for n in chosen] == ["gpu-2", "gpu-3"] and "within provider runpod (gpu-2, gpu-3)" in within
    gpu = Gpu(0, "GPU-x", "NVIDIA H200")
    job = nccl_job(inventory, chosen, {n.name: HostFacts(gpus=[gpu]) for n in chosen})
    worker = next(t for t in job["spec"]["tasks"] if t["name"] == "worker")["template"]["spec"]
    assert worker["nodeSelector"] == {PROVIDER_LABEL: "runpod"}
    one_provider = [n for n in gpus if n.provider == "runpod"]
    assert nccl_group(one_provider) == (one_provider, "")


def test_plan_names_the_mode_and_each_probe_and_status_groups_nodes_by_provider():
    from bootstrap.flows.inspection import render_status
    from bootstrap.checks.reachability import describe_probes

    inventory = parse_inventory(PUBLIC)
    lines = describe_probes(rr.plan_probes(inventory, facts(), embedded_mirror=False))
    assert lines[0].startswith("reachability: ") and "probes before any change" in lines[0]
    udp = next(line for line in lines if line.startswith("  UDP 51820: "))
    assert "cp-1 -> gpu-1 (203.0.113.21)" in udp
    row = {"role": "agent", "answers_ssh": True, "ready": "Ready", "cordoned": False, "k3s": "v1.33.5+k3s1",
           "gpus": "-", "driver": "-", "cuda": "-", "allocatable": {}}
    report = {"cluster": "multi", "state_dir": "/s", "api": True, "components": {}, "inventory_as_applied": None,
              "newest_snapshot": None,
              "nodes": [dict(row, node="cp-1", provider="hetzner", region="fsn1"),
                        dict(row, node="gpu-1", provider="lambda", region="us-east-1"),
                        dict(row, node="gpu-3", provider="hetzner", region="fsn1")]}
    text = render_status(report)
    assert text.index("provider hetzner (fsn1):") < text.index(next(t for t in text if t.startswith("gpu-3")))
    assert text.index("provider lambda (us-east-1):") > text.index(next(t for t in text if t.startswith("gpu-3")))


RDMA_AT_LAMBDA = PUBLIC.replace("network: {mode: public}", "network: {mode: public, rdma: {interfaces: [ib0]}}") \
                       .replace("provider: lambda,", "provider: lambda, gpu: {enabled: true},")


def claiming(*names):
    """The hosts' facts, with `names` reporting an NVIDIA GPU on their PCI bus (their own claim)."""
    gpu = [PciDevice("0000:00:06.0", "0x2335", "0x030200")]
    return {n: nat_host(n, nvidia_pci=gpu if n in names else []) for n in PRIVATE}


def rdma_findings(inventory, facts_):
    return sorted((f.node, f.severity) for f in preflight(inventory, facts_) if across(f))


def across(finding):
    return finding.check == "rdma" and "cross providers" in finding.message


def test_an_agent_whose_own_gpus_put_it_at_another_provider_fails_alone_never_the_server():
    """gpu-1 is named a GPU node at lambda; gpu-2's PCI line makes it one at runpod. Only
    gpu-2 fails (host-error: left out, the others go on); before, cp-1 carried the RDMA error
    and the run stopped for everyone."""
    inventory = parse_inventory(RDMA_AT_LAMBDA)
    assert rdma_findings(inventory, claiming("gpu-2")) == [("gpu-2", "host-error")]
    (found,) = [f for f in preflight(inventory, claiming("gpu-2")) if across(f)]
    assert "runpod" in found.message and "lambda (gpu-1)" in found.message and "enabled: false" in found.fix
    assert rdma_findings(inventory, claiming()) == []  # no claim: nothing to say


def test_gpu_nodes_by_their_own_claim_alone_at_two_providers_are_each_warned():
    """Nothing the operator wrote says where RDMA runs (a gpu: section only): each claimant is
    told, none stops the run."""
    inventory = parse_inventory(PUBLIC.replace("network: {mode: public}",
                                               "network: {mode: public, rdma: {interfaces: [ib0]}}\ngpu: {}"))
    assert rdma_findings(inventory, claiming("gpu-1", "gpu-2")) == [("gpu-1", "warning"), ("gpu-2", "warning")]
    assert rdma_findings(inventory, claiming("gpu-2")) == []


def test_named_gpu_nodes_at_two_providers_are_still_the_inventorys_error():
    inventory = parse_inventory(RDMA_AT_LAMBDA.replace("provider: runpod", "provider: runpod, gpu: {enabled: true}"))
    assert rdma_findings(inventory, claiming()) == [("cp-1", "error")]
