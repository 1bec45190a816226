"""Which GPU Nodes the gate closes without judging them (bootstrap.cluster.gate.nodes_to_judge),
pure: Node objects as the API would serve them. A kubelet may delete its own Node and register
it again (another uid, and no taint: k3s sets node-taint only at registration, from a
config.yaml its host controls), then not answer the probe: the gate skipped every GPU node
without facts, so that Node stayed open, unjudged, for good."""

from __future__ import annotations

from bootstrap.cluster.gate import gpu_nodes_in_cluster, nodes_to_judge
from bootstrap.cluster.gate_rules import GATE_TAINT
from bootstrap.inventory.loader import parse_inventory

ANSWERED = object()  # nodes_to_judge asks only whether a node's host answered (has facts)


def node(name: str, uid: str, gated: bool = False, gpus: int = 0) -> dict:
    return {"metadata": {"name": name, "uid": uid}, "spec": {"taints": [GATE_TAINT] if gated else []},
            "status": {"allocatable": {"cpu": "8", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}}}


INVENTORY = parse_inventory("""\
cluster: t
gpu: {}
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server, gpu: {enabled: true}}
  - {name: gpu-1, address: 10.0.0.2, gpu: {enabled: true}}
  - {name: gpu-2, address: 10.0.0.3}
  - {name: gpu-3, address: 10.0.0.4}
  - {name: cpu-1, address: 10.0.0.5}
  - {name: gpu-5, address: 10.0.0.6, gpu: {enabled: true}}
  - {name: gpu-6, address: 10.0.0.7, gpu: {enabled: true}}
  - {name: gpu-7, address: 10.0.0.8, gpu: {enabled: true}}
  - {name: off-1, address: 10.0.0.9, gpu: {enabled: false}}
""", "inv.yaml")
OBJECTS = {
    "cp-1": node("cp-1", "c1"),  # a server without facts nor verdict: never gated
    "gpu-1": node("gpu-1", "u1-again"),  # passed as u1, registered again, did not answer
    "gpu-2": node("gpu-2", "u2-again"),  # a GPU node by its own GPUs alone: the record names it
    "gpu-3": node("gpu-3", "u3", gpus=8),  # never passed, no facts: its Node advertises GPUs
    "cpu-1": node("cpu-1", "c5"),  # no facts, no record, no GPU resource: no GPU node by any word
    "gpu-5": node("gpu-5", "u5"),  # passed as this very Node: stays open
    "gpu-6": node("gpu-6", "u6", gated=True),  # gated already: nothing to do until it answers
    "gpu-7": node("gpu-7", "u7"),  # answered, no gate, never passed: gated first and judged
    "off-1": node("off-1", "o1", gpus=8),  # the inventory says no GPU node, whatever it advertises
}
VERDICTS = {"gpu-1": "u1", "gpu-2": "u2", "gpu-5": "u5"}
GPU = [n for n in INVENTORY.nodes if n.name in ("cp-1", "gpu-1", "gpu-5", "gpu-6", "gpu-7")]  # the run's topology


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_a_gpu_agent_that_did_not_answer_is_gated_when_its_node_never_passed_and_has_no_gate():
    gated, legacy, unprobed = nodes_to_judge(INVENTORY, {"gpu-7": ANSWERED}, OBJECTS, GPU, VERDICTS,
                                             gpu_cluster=True)
    assert names(unprobed) == ["gpu-1", "gpu-2", "gpu-3"]  # before: none (no facts: skipped)
    assert names(legacy) == ["gpu-7"] and gated == []


def test_without_a_gpu_cluster_no_node_is_a_gpu_node_by_its_record_or_resources():
    cpu_only = parse_inventory("cluster: t\nnodes:\n  - {name: cp-1, address: 10.0.0.1, role: server}\n"
                               "  - {name: gpu-3, address: 10.0.0.4}\n", "inv.yaml")
    assert gpu_nodes_in_cluster(cpu_only, {}, OBJECTS, [], VERDICTS, gpu_cluster=False) == []
    assert nodes_to_judge(cpu_only, {}, OBJECTS, [], VERDICTS, gpu_cluster=False) == ([], [], [])
