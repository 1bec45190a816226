"""GPU burn-in (`bootstrap health --burn-in SECONDS`): a pod per GPU node that runs CUDA's
n-body benchmark on each of its GPUs for about SECONDS, judged by its output: every GPU's
throughput against its siblings' (the same model, on any node), so a slow GPU stands out.

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

from bootstrap.cluster.checks import NAMESPACE, _create, _pod, _pod_outcome, cleanup
from bootstrap.cluster.client import Cluster, object_path, pod_log, request
from bootstrap.inventory.kube import derived_name

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


def pod_name(node: str) -> str:
    """A node name may be up to 253 characters: cut safely, as the GPU test pods' are."""
    return derived_name("burn-in-", node)


def container_name(slot: int) -> str:
    return f"gpu-{slot}"


def iterations(seconds: int) -> int:
    return max(10, int(seconds) * ITERATIONS_PER_SECOND)  # n-body's own default is 10


def burn_in_pod(node: str, gpus: int, seconds: int) -> dict:
    """One pod on `node`, one container per GPU, each n-body's benchmark on its own GPU."""
    pod = _pod(pod_name(node), node, BURN_IN_IMAGE, {"nvidia.com/gpu": 1})
    template = pod["spec"]["containers"][0]
    args = ["-benchmark", f"-numbodies={BODIES}", f"-i={iterations(seconds)}"]
    pod["spec"]["containers"] = [dict(template, name=container_name(slot), args=args) for slot in range(int(gpus))]
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


def judge(measured: dict[str, dict[int, float]], expected_gpus: dict[str, int],
          models: dict[str, dict[int, str]] | None = None) -> dict:
    """{"gpus": {node: {slot: GFLOP/s}}, "slow": [(node, slot, value, median)], "failed": [why]}.
    With `models`, each GPU is held against the median of its own model."""
    models = models or {}
    by_model: dict[str | None, list[float]] = {}
    for node, per_node in measured.items():
        for slot, value in per_node.items():
            by_model.setdefault(models.get(node, {}).get(slot), []).append(value)
    medians = {model: statistics.median(values) for model, values in by_model.items()}
    values = [v for per_node in measured.values() for v in per_node.values()]
    slow, failed = [], []
    for node, want in expected_gpus.items():
        got = measured.get(node, {})
        missing = sorted(set(range(want)) - set(got))
        if missing:
            failed.append(f"{node}: no n-body result from GPU slot {', '.join(map(str, missing))}")
        for slot, value in sorted(got.items()):
            median = medians.get(models.get(node, {}).get(slot))
            if median and value < SLOW * median:
                slow.append((node, slot, value, median))
                failed.append(f"{node}: GPU slot {slot} ran at {value:.0f} GFLOP/s, {value / median:.0%} of its "
                              f"siblings' median {median:.0f}: ask the provider for another machine")
    return {"gpus": measured, "median": statistics.median(values) if values else None, "slow": slow,
            "failed": failed}


def _container_logs(cluster: Cluster, node: str, gpus: int) -> dict[int, str]:
    path = object_path("v1", "Pod", pod_name(node), NAMESPACE)
    logs = {}
    for slot in range(gpus):
        code, log = pod_log(cluster, path, container=container_name(slot))
        logs[slot] = log if code < 300 and isinstance(log, str) else ""
    return logs


def run_burn_in(cluster: Cluster, nodes: dict[str, int], seconds: int) -> dict:
    """`nodes`: node -> its GPU count. Every pod starts at once; each is waited for."""
    request(cluster, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NAMESPACE}})
    measured, models, errors = {}, {}, []
    try:
        for node, gpus in nodes.items():
            _create(cluster, burn_in_pod(node, gpus, seconds))
        for node, gpus in nodes.items():
            phase, _, why = _pod_outcome(cluster, pod_name(node), seconds * SLOWEST_SHARE + START_UP_S)
            logs = _container_logs(cluster, node, gpus)
            if phase != "Succeeded":
                said = next((log for log in logs.values() if log.strip() and gflops(log) is None), "")
                errors.append(f"{node}: the burn-in pod {phase.lower()}: {why or said[-200:]}")
            measured[node] = throughputs(logs)
            models[node] = {slot: model for slot, log in logs.items() if (model := device(log))}
    finally:
        cleanup(cluster)
    verdict = judge(measured, {n: g for n, g in nodes.items() if not any(e.startswith(f"{n}:") for e in errors)},
                    models)
    verdict["failed"] = errors + verdict["failed"]
    return verdict
