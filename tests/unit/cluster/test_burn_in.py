"""The burn-in's pod and verdict, pure: the pod asks for the GPU resource the node advertises
(issue 32 item 9: it asked for nvidia.com/gpu whatever the sharing, so under time-slicing's
renameByDefault or MIG mixed it never scheduled), and a node is judged against the operator's
floor and its own GPUs, never failed by a peer's figures (item 12: a host printing 999999999
GFLOP/s failed every honest node)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_facts_parsers import h200_probe_output

from bootstrap.cluster.burn_in import Slots, advertised, burn_in_pod, burn_in_slots, judge
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.inventory.loader import parse_inventory

H200 = parse_host_facts(h200_probe_output())  # one H200, its MIG profiles as recorded
EIGHT = replace(H200, gpus=H200.gpus * 8)


def inventory(sharing: str = "") -> object:
    gpu = f"gpu: {{sharing: {sharing}}}\n" if sharing else ""
    return parse_inventory(f"cluster: b\n{gpu}nodes:\n  - {{name: cp, address: 10.0.0.1, role: server}}\n"
                           "  - {name: g1, address: 10.0.0.2}\n")


def node_object(**allocatable) -> dict:
    return {"metadata": {"name": "g1"}, "status": {"allocatable": {"cpu": "16", "memory": "64Gi", **allocatable}}}


def slots(sharing: str, host, node=None) -> Slots:
    inv = inventory(sharing)
    return burn_in_slots(inv, inv.node("g1"), host, node)


@pytest.mark.parametrize("sharing, allocatable, expected", [
    ("", {"nvidia.com/gpu": "8"}, Slots("nvidia.com/gpu", 8)),
    ("{time_slicing: {replicas: 4, rename_by_default: true}}", {"nvidia.com/gpu.shared": "32"},
     Slots("nvidia.com/gpu.shared", 8)),  # a replica per physical GPU, not 32 containers
    ("{time_slicing: {replicas: 4}}", {"nvidia.com/gpu": "32"}, Slots("nvidia.com/gpu", 8)),
    ("{mig: {profiles: {3g.71gb: 2}, strategy: single}}", {"nvidia.com/gpu": "16"}, Slots("nvidia.com/gpu", 16)),
    ("{mig: {profiles: {3g.71gb: 1, 1g.18gb: 4}, strategy: mixed}}",
     {"nvidia.com/mig-1g.18gb": "32", "nvidia.com/mig-3g.71gb": "8"}, Slots("nvidia.com/mig-1g.18gb", 32)),
])
def test_the_pod_asks_for_what_the_node_advertises(sharing, allocatable, expected):
    assert slots(sharing, EIGHT, node_object(**allocatable)) == expected
    pod = burn_in_pod("g1", expected, 60)
    assert [c["resources"]["limits"] for c in pod["spec"]["containers"]] == [{expected.resource: "1"}] * expected.count


def test_without_the_nodes_answer_the_inventorys_sharing_decides_the_resource():
    assert slots("{time_slicing: {replicas: 4, rename_by_default: true}}", EIGHT) == Slots("nvidia.com/gpu.shared", 8)
    assert slots("{mig: {profiles: {3g.71gb: 2}, strategy: mixed}}", H200) == Slots("nvidia.com/mig-3g.71gb", 2)
    assert slots("{mig: {profiles: {3g.71gb: 2}, strategy: single}}", H200) == Slots("nvidia.com/gpu", 2)
    assert slots("", H200) == Slots("nvidia.com/gpu", 1)
    # the node advertises another name than the inventory implies: its own answer, so the pod schedules
    assert slots("", EIGHT, node_object(**{"nvidia.com/gpu.shared": "8"})) == Slots("nvidia.com/gpu.shared", 8)


def test_a_hostile_allocatable_is_read_strictly_and_capped():
    hostile = node_object(**{"nvidia.com/gpu": "1e9", "nvidia.com/gpu.shared": "-3", "nvidia.com/mig-1g.18gb": "99999",
                             "example.com/gpu": "4", "nvidia.com/gpu\n": "2"})
    assert advertised(hostile) == {}
    assert advertised({"status": {"allocatable": ["nvidia.com/gpu"]}}) == advertised({"status": None}) == {}
    huge = node_object(**{"nvidia.com/mig-1g.18gb": "9000"})
    assert slots("{mig: {profiles: {1g.18gb: 7}, strategy: mixed}}", EIGHT, huge) == Slots("nvidia.com/mig-1g.18gb", 56)
    assert slots("", EIGHT, node_object(**{"nvidia.com/gpu": "9000"})).count == 8  # one per GPU it has


def honest(value: float = 14000.0) -> dict[int, float]:
    return {slot: value + 10 * slot for slot in range(8)}


def test_a_peer_claiming_a_billion_gflops_fails_no_honest_node():
    measured = {"g1": honest(), "g2": honest(), "liar": {slot: 999999999.0 for slot in range(8)}}
    verdict = judge(measured, {name: 8 for name in measured})
    assert verdict["failed"] == [] and verdict["slow"] == []
    # with three honest nodes the liar moves nothing; with fewer it earns the honest ones a warning at most
    more = judge(dict(measured, g3=honest(), g4=honest()), {"g1": 8, "g2": 8, "g3": 8, "g4": 8, "liar": 8})
    assert more["failed"] == [] and more["warnings"] == []


def test_a_slot_fails_against_its_own_node_and_the_operators_floor_and_a_slow_node_is_warned():
    own = judge({"g1": {**honest(), 3: 8000.0}}, {"g1": 8})
    assert own["failed"] == ["g1: GPU slot 3 ran at 8000 GFLOP/s, 57% of its siblings' median 14030 on this node: "
                             "ask the provider for another machine"]
    floor = judge({"g1": honest(9000.0), "g2": honest()}, {"g1": 8, "g2": 8}, floor=10000)
    assert len(floor["failed"]) == 8 and all("below gpu.gate.burn_in_min_gflops 10000" in f for f in floor["failed"])
    assert [n for n, *_ in floor["slow"]] == ["g1"] * 8
    slow = judge({"g1": honest(9000.0), "g2": honest(), "g3": honest()}, {"g1": 8, "g2": 8, "g3": 8})
    assert slow["failed"] == [] and len(slow["warnings"]) == 8
    assert slow["warnings"][0].startswith("g1: GPU slot 0 ran at 9000 GFLOP/s, 64% of the other nodes' median 14035")
