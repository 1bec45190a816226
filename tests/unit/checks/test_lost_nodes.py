"""Rebuild's classification: lost, replacement, healthy, control plane lost."""

from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks.lost_nodes import classify, quorum_after

INV = parse_inventory("""\
cluster: t
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: a1, address: 10.0.0.2}
  - {name: a2, address: 10.0.0.3}
  - {name: a4, address: 10.0.0.9}
""")
K3S = HostFacts(k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                               [SystemdUnit("k3s-agent.service", "loaded", "active", "enabled")]))
FRESH = HostFacts()


def node(ready: bool, server: bool = False) -> dict:
    labels = {"node-role.kubernetes.io/control-plane": "true"} if server else {}
    return {"metadata": {"labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]}}


def test_lost_agent_with_a_replacement_under_a_new_name():
    cluster = {"cp-1": node(True, True), "a1": node(True), "a2": node(True), "a3": node(False)}
    facts = {"cp-1": K3S, "a1": K3S, "a2": K3S, "a4": FRESH}
    plan = classify(INV, cluster, facts)
    assert plan.lost == ["a3"] and plan.lost_servers == []
    assert plan.join == ["a4"] and plan.healthy == ["cp-1", "a1", "a2"]


def test_replacement_reusing_the_name_at_a_new_address():
    cluster = {"cp-1": node(True, True), "a1": node(True), "a2": node(False), "a4": node(True)}
    facts = {"cp-1": K3S, "a1": K3S, "a2": FRESH, "a4": K3S}
    plan = classify(INV, cluster, facts)
    assert plan.lost == ["a2"] and plan.join == ["a2"]


def test_not_ready_but_answering_is_not_lost():
    cluster = {"cp-1": node(True, True), "a1": node(False), "a2": node(True), "a4": node(True)}
    facts = {"cp-1": K3S, "a1": K3S, "a2": K3S, "a4": K3S}
    plan = classify(INV, cluster, facts)
    assert plan.lost == [] and plan.join == ["a1"]  # repaired like `up` would


def test_control_plane_lost():
    plan = classify(INV, None, {"cp-1": FRESH, "a1": K3S, "a2": K3S})
    assert plan.restore_on == "cp-1" and plan.unreachable == ["a4"]


def test_quorum():
    ha = parse_inventory("cluster: t\nnodes:\n" + "".join(
        f"  - {{name: s{i}, address: 10.0.0.{i}, role: server}}\n" for i in range(1, 4)))
    assert quorum_after(ha, ["s3"]) and not quorum_after(ha, ["s2", "s3"])


def test_after_a_restore_nodes_that_are_gone_are_stale_even_if_they_still_say_ready():
    from bootstrap.checks.lost_nodes import stale_after_restore

    cluster = {"old-cp": node(True, True), "a1": node(True), "a2": node(True)}
    assert stale_after_restore(INV, cluster, {"cp-1": K3S, "a1": K3S}) == ["a2", "old-cp"]


def with_machine(node_obj: dict, machine_id: str) -> dict:
    node_obj["status"]["nodeInfo"] = {"machineID": machine_id}
    return node_obj


def test_a_machine_replaced_under_its_name_is_lost_while_its_old_node_still_says_ready():
    """k3s refuses the new machine's node password while the old Node (and its
    node-password secret) exist: the Node goes even though it still says Ready."""
    cluster = {"cp-1": node(True, True), "a1": node(True), "a2": node(True), "a4": node(True)}
    facts = {"cp-1": K3S, "a1": K3S, "a2": FRESH, "a4": K3S}
    plan = classify(INV, cluster, facts)
    assert plan.lost == ["a2"] and plan.join == ["a2"] and "a2" not in plan.healthy


def test_a_new_machine_id_under_a_nodes_name_is_another_machine():
    from dataclasses import replace

    from bootstrap.checks.lost_nodes import replaced_machines

    old = "0" * 31 + "1"
    cluster = {"cp-1": with_machine(node(True, True), "c" * 32), "a1": with_machine(node(True), old),
               "a2": with_machine(node(True), old), "a4": node(True)}
    facts = {"cp-1": replace(K3S, machine_id="c" * 32), "a1": replace(K3S, machine_id="f" * 32),
             "a2": replace(K3S, machine_id=old), "a4": replace(K3S, machine_id="e" * 32)}
    # a1: k3s is installed (an image with k3s baked in) but the machine is another one;
    # a4: its Node reports no machine id, so nothing says it changed.
    assert replaced_machines(INV, cluster, facts) == ["a1"]
    plan = classify(INV, cluster, facts)
    assert plan.lost == ["a1"] and plan.healthy == ["cp-1", "a2", "a4"]


def test_a_replaced_server_leaves_etcd_first():
    cluster = {"cp-1": node(True, True), "a1": node(True), "a2": node(True), "a4": node(True)}
    plan = classify(INV, cluster, {"cp-1": FRESH, "a1": K3S, "a2": K3S, "a4": K3S})
    assert plan.lost == ["cp-1"] and plan.lost_servers == ["cp-1"] and plan.join == ["cp-1"]


def test_a_probe_cut_short_before_its_k3s_section_is_not_a_new_machine():
    from bootstrap.checks.lost_nodes import fresh

    cut_short = HostFacts(commands={"k3s": "/usr/local/bin/k3s"})  # k3s on PATH, its section missing
    assert not fresh(cut_short) and fresh(FRESH)
    cluster = {"cp-1": node(True, True), "a1": node(True), "a2": node(True), "a4": node(True)}
    assert classify(INV, cluster, {"cp-1": K3S, "a1": cut_short, "a2": K3S, "a4": K3S}).lost == []
