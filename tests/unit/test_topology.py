"""The derived facts of the cluster's shape (bootstrap.topology) are resolved once per run
and read by everyone: no module but bootstrap/topology.py works out the GPU nodes or the
embedded mirror itself (issue 24, item 3: "Nobody recomputes them")."""

import ast
from dataclasses import replace

import pytest
from repo_paths import ROOT
from test_golden import TOKENS, online_artifacts

from bootstrap.checks.preflight import preflight
from bootstrap.cluster.components import plan_cluster
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, PciDevice
from bootstrap.host.facts.parsers import parse_k3s
from bootstrap.host.parts.k3s_service import CONFIG
from bootstrap.host.parts.registries import REGISTRIES
from bootstrap.host.plan.all_hosts import make_plans
from bootstrap.inventory.loader import parse_inventory
from bootstrap.topology import resolve_topology

PACKAGES = ("bootstrap", "deploys")
DERIVED = {"gpu_nodes", "gpu_cluster", "embedded_mirror_on"}  # what resolve_topology works out
ALLOWED = {"bootstrap/topology.py"}


def recomputations(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call of a derivation (`gpu_nodes(...)`, `x.embedded_mirror_on(...)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in DERIVED:
                found.append((node.lineno, name))
    return found


def test_only_the_topology_derives_the_gpu_nodes_and_the_embedded_mirror():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}(...): read it from the run's topology"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in ALLOWED
             for line, name in recomputations(path.read_text())]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_call_by_name_or_attribute_and_not_a_field():
    source = ("from bootstrap import topology\n"
              "a = gpu_nodes(inventory, facts)\n"
              "b = topology.embedded_mirror_on(inventory, True)\n"
              "c = run.topology.gpu_nodes\n"  # the resolved field: reading it is the point
              "def f(gpu_nodes): return len(gpu_nodes)\n")
    assert recomputations(source) == [(2, "gpu_nodes"), (3, "embedded_mirror_on")]


# --- cluster-wide settings come from the inventory and the servers (issue 32, item 14) --------

# One line of the probe's PCI section: what a host needs to say to claim an H200.
CLAIMED_GPU = HostFacts(hostname="h", arch="amd64", nvidia_pci=[PciDevice("0000:00:06.0", "0x2335", "0x030200")])
CPU = HostFacts(hostname="h", arch="amd64")
CPU_CLUSTER = "cluster: t\nk3s: {version: v1.33.5+k3s1}\n%snodes:\n  - {name: cp-1, address: 10.0.0.1, role: server}\n" \
              "  - {name: cpu-1, address: 10.0.0.2}\n  - {name: cpu-2, address: 10.0.0.3%s}\n"


def cpu_cluster(extra: str = "", cpu_2: str = ""):
    return parse_inventory(CPU_CLUSTER % (extra, cpu_2))


def planned_files(inventory, facts) -> dict[str, dict[str, bytes]]:
    plans = make_plans(inventory, facts, TOKENS, {"amd64": online_artifacts("v1.33.5+k3s1", "amd64")}, "id").plans
    return {name: {u.path: u.content for u in plan.uploads} for name, plan in plans.items()}


def test_one_agent_claiming_a_gpu_changes_no_other_host():
    """A CPU cluster, nothing said of GPUs; cpu-2 lists one NVIDIA PCI device. The servers do
    not restart with the embedded mirror, no node's registries.yaml lists the mirrored
    registries, no GPU Operator is installed, and preflight says why, with the fix."""
    inv = cpu_cluster()
    honest = {"cp-1": CPU, "cpu-1": CPU, "cpu-2": CPU}
    claimed = {**honest, "cpu-2": CLAIMED_GPU}
    files = planned_files(inv, claimed)
    assert b"embedded-registry" not in files["cp-1"][CONFIG] and REGISTRIES not in files["cpu-1"]
    assert files == planned_files(inv, honest)  # every host's files as without the claim
    topology = resolve_topology(inv, claimed)
    assert (topology.gpu_nodes, topology.embedded_mirror) == ((), False)
    assert "gpu-operator" not in [r.name for r in plan_cluster(inv, claimed, topology.gpu_nodes_of(inv)).releases]
    assert topology.unused_gpus == ("cpu-2",)
    (warning,) = [f for f in preflight(inv, claimed, topology) if f.check == "gpu"]
    assert (warning.node, warning.severity) == ("cpu-2", "warning")
    assert "no GPU Operator" in warning.message and "gpu: {enabled: true}" in warning.fix


@pytest.mark.parametrize("extra, cpu_2", [
    ("", ", gpu: {enabled: true}"),  # the operator names the node a GPU node
    ("", ", gpu: {sharing: none}"),  # a GPU setting of the node's own names it too
    ("gpu: {driver: preinstalled}\n", ""),  # a gpu: section, even of defaults
    ("validate: {nccl: {min_busbw_gbps: 10}}\n", ""),
])
def test_what_the_operator_wrote_makes_a_gpu_cluster(extra, cpu_2):
    inv = cpu_cluster(extra, cpu_2)
    facts = {"cp-1": CPU, "cpu-1": CPU, "cpu-2": CLAIMED_GPU}
    topology = resolve_topology(inv, facts)
    assert (topology.gpu_nodes, topology.embedded_mirror, topology.unused_gpus) == (("cpu-2",), True, ())
    assert "gpu-operator" in [r.name for r in plan_cluster(inv, facts, topology.gpu_nodes_of(inv)).releases]
    assert "embedded-registry: true" in planned_files(inv, facts)["cp-1"][CONFIG].decode()


def test_a_servers_own_gpus_make_a_gpu_cluster_and_its_agents_gpus_count_for_themselves():
    """minimal.yaml on a GPU box: the server's own GPUs (whoever runs a server holds the
    cluster). Then an agent's GPUs, declared or not, make it a GPU node for its own setup."""
    solo = parse_inventory("cluster: solo\nnodes:\n  - {name: box-1, address: 203.0.113.10, role: server}\n")
    topology = resolve_topology(solo, {"box-1": CLAIMED_GPU})
    assert (topology.gpu_nodes, topology.embedded_mirror) == (("box-1",), True)
    inv = cpu_cluster()
    facts = {"cp-1": CLAIMED_GPU, "cpu-1": CPU, "cpu-2": CLAIMED_GPU}
    assert resolve_topology(inv, facts).gpu_nodes == ("cp-1", "cpu-2")
    off = parse_inventory(CPU_CLUSTER.replace("role: server}", "role: server, gpu: {enabled: false}}") % ("", ""))
    assert resolve_topology(off, facts).gpu_nodes == ()  # the operator said the server's GPUs are not for this


def test_the_inventory_still_decides_the_mirror_and_a_named_node_without_facts_counts():
    facts = {"cp-1": CPU, "cpu-1": CPU, "cpu-2": CLAIMED_GPU}
    assert resolve_topology(cpu_cluster("images: {embedded_mirror: true}\n"), facts).embedded_mirror is True
    assert resolve_topology(cpu_cluster("gpu: {}\nimages: {embedded_mirror: false}\n"), facts).embedded_mirror is False
    pinned = cpu_cluster("charts: {gpu_operator: v26.7.0}\n")  # air-gapped inventories pin every chart
    assert resolve_topology(pinned, facts).gpu_nodes == ()
    named = cpu_cluster("", ", gpu: {enabled: true}")
    assert resolve_topology(named, {}).gpu_nodes == ("cpu-2",)  # no answer yet: the inventory's word
    assert replace(named.gpu, cuda="12.4") != named.gpu  # `written` is not compared


# --- an upgrade from before the rule: refused while the servers run the GPU cluster's mirror ----

def running_server(mirror: bool | None) -> HostFacts:
    """A server as the probe reads it: k3s installed, config.yaml's embedded-registry line."""
    return replace(CPU, k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [], "10.0.0.1", mirror))


def dropped(inv, facts):
    return [f for f in preflight(inv, facts, resolve_topology(inv, facts)) if f.check == "gpu-cluster"]


def test_an_earlier_gpu_cluster_whose_inventory_names_no_gpu_is_refused_before_any_change():
    """Built by a version that counted the agents' own GPUs: its server runs with the mirror
    that version's default turned on. This `up` would drop the GPU setup and the mirror and
    restart the servers: an error (preflight stops before any host is changed), with the fix.
    Before, only cpu-2's warning was said and the run went on."""
    inv = cpu_cluster()
    facts = {"cp-1": running_server(True), "cpu-1": CPU, "cpu-2": CLAIMED_GPU}
    (refused,) = dropped(inv, facts)
    assert (refused.node, refused.severity) == ("cp-1", "error")
    assert "drop every agent's GPU setup" in refused.message and "restart the servers" in refused.message
    assert "gpu: {}" in refused.fix and "gpu: {enabled: true}" in refused.fix and "embedded_mirror: false" in refused.fix


@pytest.mark.parametrize("extra, server_mirror", [
    ("gpu: {}\n", True),  # the fix: a GPU cluster again, nothing dropped
    ("images: {embedded_mirror: false}\n", True),  # the operator ends it on purpose
    ("images: {embedded_mirror: true}\n", True),  # the operator's own choice of the mirror
    ("", False), ("", None),  # a CPU cluster the tool made: no mirror on its server
])
def test_nothing_is_refused_where_the_inventory_or_the_server_says_otherwise(extra, server_mirror):
    inv = cpu_cluster(extra)
    assert dropped(inv, {"cp-1": running_server(server_mirror), "cpu-1": CPU, "cpu-2": CLAIMED_GPU}) == []


def test_an_agents_answer_never_refuses_the_run():
    """Only the servers' answers count: an agent reporting the mirror in its config.yaml is not
    the cluster's word."""
    inv = cpu_cluster()
    agent = replace(running_server(True), hostname="cpu-1")
    assert dropped(inv, {"cp-1": running_server(None), "cpu-1": agent, "cpu-2": CLAIMED_GPU}) == []


def test_the_probe_reads_the_servers_embedded_registry_line():
    assert parse_k3s(["config: present", "node-ip: 10.0.0.1", "embedded-registry: true"]).embedded_registry is True
    assert parse_k3s(["config: present", "embedded-registry: 'false'"]).embedded_registry is False
    assert parse_k3s(["config: present", "node-ip: 10.0.0.1"]).embedded_registry is None
    assert parse_k3s(["embedded-registry: " + "true" * 100000]).embedded_registry is False


# --- the all-GPU deadlock by the inventory's own taints (issue 32 item 1) ---------------------

ALL_GPU = "cluster: t\n%snodes:\n  - {name: cp-1, address: 10.0.0.1, role: server%s}\n" \
          "  - {name: gpu-1, address: 10.0.0.2, gpu: {enabled: true}}\n%s"


@pytest.mark.parametrize("taint", ["CriticalAddonsOnly=true:NoExecute", "node-role.kubernetes.io/control-plane:NoSchedule"])
def test_tainted_servers_and_only_gated_gpu_agents_are_warned_with_the_fix(taint):
    inv = parse_inventory(ALL_GPU % ("", f", taints: [{taint}]", ""))
    facts = {"cp-1": CPU, "gpu-1": CLAIMED_GPU}
    (warned,) = [f for f in preflight(inv, facts, resolve_topology(inv, facts)) if f.check == "schedulable"]
    assert (warned.node, warned.severity) == ("cp-1", "warning") and f"cp-1: {taint}" in warned.message
    assert "nowhere to run" in warned.message and "gate: false" in warned.fix and "CPU agent" in warned.fix


@pytest.mark.parametrize("extra, server, more", [
    ("", ", taints: ['dedicated=infra:PreferNoSchedule']", ""),  # PreferNoSchedule leaves room
    ("", "", ""),  # an untainted server takes the Deployments
    ("", ", taints: ['CriticalAddonsOnly=true:NoExecute']", "  - {name: cpu-1, address: 10.0.0.3}\n"),  # a CPU agent
    ("gpu: {gate: false}\n", ", taints: ['CriticalAddonsOnly=true:NoExecute']", ""),  # no gate holds the agents
])
def test_a_node_left_to_schedule_on_is_not_warned(extra, server, more):
    inv = parse_inventory(ALL_GPU % (extra, server, more))
    facts = {"cp-1": CPU, "gpu-1": CLAIMED_GPU, "cpu-1": CPU}
    assert [f for f in preflight(inv, facts, resolve_topology(inv, facts)) if f.check == "schedulable"] == []
