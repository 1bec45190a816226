"""GPU burn-in (`bootstrap health --burn-in SECONDS`, the gate's `burn-in`): a pod per GPU node
that runs CUDA's n-body benchmark on each of its GPUs for about SECONDS, judged by its output.
A node is judged by what the operator wrote and by its own answers only: a GPU slot fails
below gpu.gate.burn_in_min_gflops, or below SLOW of its own node's median for its model (a
slow GPU beside its fast siblings); below SLOW of the other nodes' median it is only a
warning, since their figures are their own claims (a host may print a billion GFLOP/s).

The pod asks for the GPU resource the node advertises (its allocatable: nvidia.com/gpu,
nvidia.com/gpu.shared under time-slicing's renameByDefault, nvidia.com/mig-<profile> under
MIG mixed), else for what the inventory's sharing implies (checks.expected_gpu_resources).
One container per physical GPU, or per MIG device under MIG. Under time-slicing each container
takes one replica, and the device plugin's default allocation policy (distributed) takes it
from the GPU with the fewest replicas allocated, so the containers land on distinct GPUs
(NVIDIA/k8s-device-plugin internal/rm/allocate.go, allocationComparators).

The image is NVIDIA's k8s-samples n-body image, run the way it is built to run: its own
ENTRYPOINT with arguments only. The image has no shell loop to run: the binary is
/cuda-samples/nbody (ENTRYPOINT ["/cuda-samples/sample"], a link to it), and /cuda-samples is
not on PATH (NVIDIA/k8s-samples deployments/container/Dockerfile.ubuntu at 7eab568, the commit
that made the cuda11.7.1 images; NVIDIA/k8s-device-plugin testdata/job-1.yaml passes
`args: ["--benchmark"]` the same way).

One container per GPU, each holding one: the device plugin gives every container its own
GPU, so the pod measures each GPU at once, and the container's name says which slot a
number is from. Which physical GPU a slot got is the device plugin's choice and n-body does
not print it; it does print the GPU's name, so a GPU is compared with siblings of its model.

n-body in benchmark mode prints, once at the end (NVIDIA/cuda-samples
Samples/5_Domain_Specific/nbody/nbody.cpp, `_runBenchmark`, and `main` for the device line):
    > Compute 9.0 CUDA device: [NVIDIA H200]
    256000 bodies, total time for 900 iterations: 59432.117 ms
    = 992.317 billion interactions per second
    = 19846.349 single-precision GFLOP/s at 20 flops per interaction
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass

from bootstrap.cluster.checks import (_create, _pod, _pod_outcome, checks_namespace, expected_gpu_resources,
                                     gpu_request)
from bootstrap.cluster.client import LOG_READ_S, Cluster, ClusterError, get, object_path, pod_log
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.kube import derived_name
from bootstrap.inventory.model import Inventory, Node

BURN_IN_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.7.1"
SLOW = 0.85  # below this share of its siblings' median throughput, a GPU is slow
BODIES = 256000  # a multiple of n-body's block size (256), so it is not rounded
# n-body runs a number of iterations, not a time: one iteration is BODIES^2 * 20 flops
# (1.3 TFLOP), about 1/15 s on an A100-class GPU (~20 TFLOP/s in n-body).
ITERATIONS_PER_SECOND = 15
# The pod is waited for this many times SECONDS (plus start-up): a GPU a fifth as fast as the
# reference still finishes, a hung one does not hold the command for ever.
SLOWEST_SHARE = 5
START_UP_S = 300
# A pod's log is what its node serves: numbers are matched strictly so float() cannot fail.
_GFLOPS = re.compile(r"^= ([0-9]{1,12}(?:\.[0-9]{1,12})?) single-precision GFLOP/s at [0-9]{1,3} flops per "
                     r"interaction\s*$", re.M)
_DEVICE = re.compile(r"^> Compute [0-9]{1,3}\.[0-9]{1,3} CUDA device: \[([ -~]{1,64})\]\s*$", re.M)
# What a node's kubelet reports allocatable is that node's answer: GPU resource names as the
# device plugin makes them, counts as plain whole numbers (anything else is not counted).
_GPU_RESOURCE = re.compile(r"nvidia\.com/(?:gpu|gpu\.shared|mig-[0-9a-z][0-9a-z.+-]{0,39})")
_COUNT = re.compile(r"[0-9]{1,4}")
MAX_SLOTS = 64  # containers in one burn-in pod, whatever a node advertises
# A node's slots' logs are read one after another, each up to pod_log's LOG_READ_S (plus the
# API client's 30 s wait for the answer to begin): a node advertising MAX_SLOTS whose kubelet
# trickles every log held the burn-in some 96 minutes. So all of a node's reads share one
# deadline; the slots left when it passes fail with the reason. An honest slot's log is
# n-body's dozen lines, one request of well under a second through the tunnel: 64 of them
# take about a minute at worst, and 120 s is twice that. Past it, a node delays the others by
# at most the one read under way's socket waits (30 s for the answer's head, 30 s a chunk).
NODE_LOGS_S = 120.0


@dataclass(frozen=True)
class Slots:
    """What a node's burn-in pod asks for: `count` containers, each one `resource`."""

    resource: str
    count: int


def advertised(node_object: dict | None) -> dict[str, int]:
    """The GPU resources a Node reports allocatable, name -> count (only counts above 0)."""
    status = (node_object or {}).get("status")
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    if not isinstance(allocatable, dict):
        return {}
    return {name: int(value) for name, value in allocatable.items()
            if isinstance(name, str) and _GPU_RESOURCE.fullmatch(name) and isinstance(value, str)
            and _COUNT.fullmatch(value) and int(value) > 0}


def burn_in_slots(inventory: Inventory, node: Node, host: HostFacts, node_object: dict | None) -> Slots:
    """The resource the node advertises (the inventory's first where it advertises several),
    else the one the inventory's sharing implies; one slot per GPU, or per MIG device."""
    wanted = expected_gpu_resources(inventory, node, host)
    have = advertised(node_object)
    resource = next((r for r in sorted(wanted) if r in have), None) or min(have, default=None) \
        or gpu_request(inventory, node, host)
    gpus = len(host.gpus) or 1
    if inventory.sharing_for(node).mig:
        count = min(have.get(resource) or wanted.get(resource) or gpus, wanted.get(resource) or MAX_SLOTS)
    else:
        count = min(gpus, have.get(resource, gpus))
    return Slots(resource, max(1, min(count, MAX_SLOTS)))


def pod_name(node: str) -> str:
    """A node name may be up to 253 characters: cut safely, as the GPU test pods' are."""
    return derived_name("burn-in-", node)


def container_name(slot: int) -> str:
    return f"gpu-{slot}"


def iterations(seconds: int) -> int:
    return max(10, int(seconds) * ITERATIONS_PER_SECOND)  # n-body's own default is 10


def burn_in_pod(node: str, slots: Slots, seconds: int) -> dict:
    """One pod on `node`, one container per slot, each n-body's benchmark on its own GPU."""
    pod = _pod(pod_name(node), node, BURN_IN_IMAGE, {slots.resource: 1})
    template = pod["spec"]["containers"][0]
    args = ["-benchmark", f"-numbodies={BODIES}", f"-i={iterations(seconds)}"]
    pod["spec"]["containers"] = [dict(template, name=container_name(slot), args=args) for slot in range(slots.count)]
    return pod


def gflops(log: str) -> float | None:
    """The GFLOP/s one n-body run printed, or None when it printed none."""
    values = [float(v) for v in _GFLOPS.findall(log or "")]
    return statistics.median(values) if values else None


def device(log: str) -> str | None:
    """The GPU's name n-body printed ("NVIDIA H200"), or None."""
    match = _DEVICE.search(log or "")
    return match.group(1).strip() if match else None


def throughputs(logs: dict[int, str]) -> dict[int, float]:
    """GPU slot -> GFLOP/s, for the slots whose log has a result."""
    measured = {slot: gflops(log) for slot, log in logs.items()}
    return {slot: value for slot, value in measured.items() if value is not None}


def judge(measured: dict[str, dict[int, float]], expected_slots: dict[str, int],
          models: dict[str, dict[int, str]] | None = None, floor: float | None = None) -> dict:
    """{"gpus": {node: {slot: GFLOP/s}}, "slow": [(node, slot, value, what it was held to)],
    "failed": [why], "warnings": [why]}. A slot fails below `floor` (the operator's figure) or
    below SLOW of its own node's median for its model; below SLOW of the other nodes' median
    (each node's own median, per model) it is only a warning: their figures are their claims."""
    models = models or {}
    own = {node: _medians(node, per_node, models) for node, per_node in measured.items()}
    values = [v for per_node in measured.values() for v in per_node.values()]
    slow, failed, warnings = [], [], []
    for node, want in expected_slots.items():
        got = measured.get(node, {})
        missing = sorted(set(range(want)) - set(got))
        if missing:
            failed.append(f"{node}: no n-body result from GPU slot {', '.join(map(str, missing))}")
        for slot, value in sorted(got.items()):
            model = models.get(node, {}).get(slot)
            mine = own[node].get(model)
            others = [medians[model] for peer, medians in own.items() if peer != node and model in medians]
            if floor is not None and value < floor:
                slow.append((node, slot, value, floor))
                failed.append(f"{node}: GPU slot {slot} ran at {value:.0f} GFLOP/s, below gpu.gate.burn_in_min_gflops "
                              f"{floor:g}: ask the provider for another machine")
            elif mine and value < SLOW * mine:
                slow.append((node, slot, value, mine))
                failed.append(f"{node}: GPU slot {slot} ran at {value:.0f} GFLOP/s, {value / mine:.0%} of its "
                              f"siblings' median {mine:.0f} on this node: ask the provider for another machine")
            elif others and value < SLOW * statistics.median(others):
                median = statistics.median(others)
                warnings.append(f"{node}: GPU slot {slot} ran at {value:.0f} GFLOP/s, {value / median:.0%} of the "
                                f"other nodes' median {median:.0f} (their own figures: not failed; "
                                "gpu.gate.burn_in_min_gflops sets a floor)")
    return {"gpus": measured, "median": statistics.median(values) if values else None, "slow": slow,
            "failed": failed, "warnings": warnings}


def _medians(node: str, per_node: dict[int, float], models: dict[str, dict[int, str]]) -> dict[str | None, float]:
    """The node's own median throughput per GPU model (None: the model n-body did not print)."""
    by_model: dict[str | None, list[float]] = {}
    for slot, value in per_node.items():
        by_model.setdefault(models.get(node, {}).get(slot), []).append(value)
    return {model: statistics.median(values) for model, values in by_model.items()}


def _container_logs(cluster: Cluster, node: str, gpus: int, namespace: str) -> tuple[dict[int, str], str]:
    """(slot -> its container's log, why some slots' logs were not read: '' when none). All
    of the node's reads end by one deadline (NODE_LOGS_S), each given what is left of it; a
    read the API cannot answer (a kubelet that never begins its answer) is that slot's alone."""
    path = object_path("v1", "Pod", pod_name(node), namespace)
    until = time.monotonic() + NODE_LOGS_S
    logs, unread = {}, {}
    for slot in range(gpus):
        left = until - time.monotonic()
        if left <= 0:
            unread[slot] = (f"not read: a node's burn-in logs are read within {NODE_LOGS_S:.0f} s, "
                            "and this node's took all of it")
            continue
        try:
            code, log = pod_log(cluster, path, container=container_name(slot), read_s=min(LOG_READ_S, left))
        except ClusterError as exc:
            unread[slot] = f"not read: {exc}"
            continue
        logs[slot] = log if code < 300 and isinstance(log, str) else ""
    return logs, _unread_reason(unread)


def _unread_reason(unread: dict[int, str]) -> str:
    """'GPU slot 3-63 not read: ...' (each reason once, with the slots it was given for)."""
    by_reason: dict[str, list[int]] = {}
    for slot, why in unread.items():
        by_reason.setdefault(why, []).append(slot)
    return "; ".join(f"GPU slot {_span(slots)} {why}" for why, slots in by_reason.items())


def _span(slots: list[int]) -> str:
    """3, or 3-63 for a run of slots, else each: the reason stays short for 64 slots."""
    if len(slots) > 1 and slots == list(range(slots[0], slots[-1] + 1)):
        return f"{slots[0]}-{slots[-1]}"
    return ", ".join(map(str, slots))


def slots_of(cluster: Cluster, inventory: Inventory, hosts: dict[str, HostFacts]) -> dict[str, Slots]:
    """Each node's burn-in slots, from its Node as it is now (the device plugin's resources)."""
    return {name: burn_in_slots(inventory, inventory.node(name), host, get(cluster, f"/api/v1/nodes/{name}"))
            for name, host in hosts.items()}


def run_burn_in(cluster: Cluster, nodes: dict[str, Slots], seconds: int, floor: float | None = None) -> dict:
    """`nodes`: node -> what its pod asks for (slots_of); `floor`: gpu.gate.burn_in_min_gflops.
    Every pod starts at once; each is waited for. A node whose kubelet keeps its pod past the
    cleanup fails for it (its own answer), the others do not."""
    measured, models, errors = {}, {}, []
    with checks_namespace(cluster) as space:
        for node, slots in nodes.items():
            _create(cluster, burn_in_pod(node, slots, seconds), space.name)
        # One deadline for all: the pods started together, so each node that never runs its pod
        # no longer adds a whole time-out of its own to everyone's wait.
        timeout_s = seconds * SLOWEST_SHARE + START_UP_S
        until = time.monotonic() + timeout_s
        for node, slots in nodes.items():
            phase, _, why = _pod_outcome(cluster, pod_name(node), timeout_s, space.name, until=until)
            logs, unread = _container_logs(cluster, node, slots.count, space.name)
            if unread:
                errors.append(f"{node}: {unread}")
            if phase != "Succeeded":
                said = next((log for log in logs.values() if log.strip() and gflops(log) is None), "")
                errors.append(f"{node}: the burn-in pod {phase.lower()}: {why or said[-200:]}")
            measured[node] = throughputs(logs)
            models[node] = {slot: model for slot, log in logs.items() if (model := device(log))}
    errors += [f"{r.node}: {r.reason}" for r in space.leftovers("FAIL") if r.node in nodes]
    verdict = judge(measured, {n: s.count for n, s in nodes.items() if not any(e.startswith(f"{n}:") for e in errors)},
                    models, floor)
    verdict["failed"] = errors + verdict["failed"]
    return verdict
