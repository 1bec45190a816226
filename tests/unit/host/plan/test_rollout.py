"""Which nodes a version change upgrades, in which order, and what is refused first."""

import hashlib
from dataclasses import replace

from bootstrap.host.release import K3sArtifacts, LocalFile
from bootstrap.host.facts.host_facts import FileState, HostFacts, K3sInstall, SystemdUnit
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.host.parts.kernel import MODULES, SYSCTLS
from bootstrap.host.plan import desired as d
from bootstrap.host.plan.host_plan import plan_host
from bootstrap.host.plan.rollout import plan_rollout, version_findings
from bootstrap.inventory.loader import parse_inventory
from bootstrap.host.plan.join_tokens import JoinTokens

TOKENS = JoinTokens("tok", "agent-tok")

INV = parse_inventory("""\
cluster: t
k3s: {version: v1.34.1+k3s1}
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: cp-2, address: 10.0.0.2, role: server}
  - {name: cp-3, address: 10.0.0.3, role: server}
  - {name: a1, address: 10.0.0.11}
  - {name: a2, address: 10.0.0.12}
  - {name: a3, address: 10.0.0.13}
  - {name: new, address: 10.0.0.14}
""")
OLD = b"k3s v1.33.5"
NEW = b"k3s v1.34.1"

CLUSTER_ID = "0123456789abcdef"


def running_on(node, version="v1.33.5+k3s1", binary=OLD, active=True):
    unit = "k3s" if node.role == "server" else "k3s-agent"
    want = d.desired_state(INV, node, TOKENS, artifacts(binary), gpu=False, driver_packages=[])
    files = {f.path: FileState(f.mode, f.sha256) for f in want.files}
    return HostFacts(arch="amd64", files=files, modules=list(MODULES), sysctls=dict(SYSCTLS),
                     k3s=K3sInstall(K3S_BINARY, version, True,
                                    [SystemdUnit(f"{unit}.service", "loaded", "active" if active else "failed",
                                                 "enabled")]))


def artifacts(binary: bytes, path="/nonexistent/k3s"):
    from pathlib import Path

    return K3sArtifacts("amd64", "v1.34.1+k3s1", binary=LocalFile(Path(path), hashlib.sha256(binary).hexdigest()))


def plans_for(facts):
    return {n.name: plan_host(n, d.desired_state(INV, n, TOKENS, artifacts(NEW), gpu=False, driver_packages=[]),
                              facts[n.name], CLUSTER_ID, "lab") for n in INV.nodes}


def test_servers_one_at_a_time_then_agents_in_batches_and_new_nodes_join_as_usual():
    facts = {n.name: running_on(n) for n in INV.nodes if n.name != "new"}
    facts["new"] = HostFacts(arch="amd64")
    rollout = plan_rollout(INV, facts, plans_for(facts), "v1.34.1+k3s1", max_unavailable=2)
    assert rollout.servers == ["cp-1", "cp-2", "cp-3"]
    assert rollout.agent_batches == [["a1", "a2"], ["a3"]]
    lines = rollout.describe()
    assert lines[0] == "k3s rolling upgrade to v1.34.1+k3s1, in this order:"
    assert lines[1].startswith("  1. server cp-1 (v1.33.5+k3s1): replace the binary, restart")
    assert lines[4].startswith("  4. agents a1 (v1.33.5+k3s1), a2 (v1.33.5+k3s1): cordon, drain")


def test_nodes_already_on_the_new_binary_or_not_running_are_not_rolled():
    facts = {n.name: running_on(n, "v1.34.1+k3s1", NEW) for n in INV.nodes}
    assert plan_rollout(INV, facts, plans_for(facts), "v1.34.1+k3s1") is None
    facts["a2"] = running_on(INV.node("a2"), active=False)  # stopped: started by the usual path
    assert plan_rollout(INV, facts, plans_for(facts), "v1.34.1+k3s1") is None


def test_a_downgrade_or_a_skipped_minor_on_any_host_is_a_preflight_error():
    facts = {n.name: running_on(n) for n in INV.nodes}
    facts["a3"] = replace(facts["a3"], k3s=replace(facts["a3"].k3s, version="v1.35.0+k3s1"))
    (finding,) = version_findings(INV, facts, "v1.34.1+k3s1", {"amd64": None})
    assert finding.node == "a3" and finding.severity == "error" and "downgraded" in finding.message
    findings = version_findings(INV, facts, "v1.36.0+k3s1", {"amd64": None})
    assert {f.node for f in findings} == {n.name for n in INV.nodes} - {"a3"}
    assert "v1.34.x" in findings[0].fix and "v1.35.x" in findings[0].fix


def test_an_air_gap_binary_of_unknown_version_cannot_be_rolled_blind():
    facts = {n.name: running_on(n) for n in INV.nodes}
    findings = version_findings(INV, facts, None, {"amd64": hashlib.sha256(NEW).hexdigest()})
    assert findings and all("set k3s.version" in f.fix for f in findings)
    assert version_findings(INV, facts, None, {"amd64": hashlib.sha256(OLD).hexdigest()}) == []
