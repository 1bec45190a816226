"""GPU burn-in (`bootstrap health --burn-in SECONDS`): a pod per GPU node that runs CUDA's
n-body benchmark on each of its GPUs for about SECONDS, judged by its output: every GPU's
throughput against its siblings' (the same model, on any node), so a slow GPU stands out.

The n-body sample prints, per run, "= 12345.678 single-precision GFLOP/s at 20 flops per
interaction" (NVIDIA/cuda-samples Samples/5_Domain_Specific/nbody/nbody.cpp); the pod tags
each line with its GPU.
"""

from __future__ import annotations

import re
import statistics

from bootstrap.cluster.checks import NAMESPACE, _create, _pod, _pod_outcome, cleanup
from bootstrap.cluster.client import Cluster, request

BURN_IN_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.7.1"
SLOW = 0.85  # below this share of its siblings' median throughput, a GPU is slow
# A pod's log is what its node serves: numbers are matched strictly so float() cannot fail.
_LINE = re.compile(r"^gpu ([0-9]{1,3}): .*?=\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)\s+single-precision GFLOP/s", re.M)


def burn_in_pod(node: str, gpus: int, seconds: int) -> dict:
    """One pod on `node` holding all its `gpus`, n-body on each until `seconds` are up."""
    script = (f"end=$(( $(date +%s) + {int(seconds)} )); i=0; while [ $i -lt {int(gpus)} ]; do "
              "( while [ $(date +%s) -lt $end ]; do nbody -benchmark -numbodies=256000 -device=$i "
              "| grep 'GFLOP/s' | sed \"s/^/gpu $i: /\"; done ) & i=$((i+1)); done; wait")
    return _pod(f"burn-in-{node}", node, BURN_IN_IMAGE, {"nvidia.com/gpu": gpus}, ["/bin/sh", "-c", script])


def throughputs(log: str) -> dict[int, float]:
    """GPU index -> median GFLOP/s over its runs."""
    runs: dict[int, list[float]] = {}
    for gpu, value in _LINE.findall(log):
        runs.setdefault(int(gpu), []).append(float(value))
    return {gpu: statistics.median(values) for gpu, values in runs.items()}


def judge(measured: dict[str, dict[int, float]], expected_gpus: dict[str, int]) -> dict:
    """{"gpus": {node: {gpu: GFLOP/s}}, "slow": [(node, gpu, value, median)], "failed": [why]}."""
    values = [v for per_node in measured.values() for v in per_node.values()]
    median = statistics.median(values) if values else None
    slow, failed = [], []
    for node, want in expected_gpus.items():
        got = measured.get(node, {})
        missing = sorted(set(range(want)) - set(got))
        if missing:
            failed.append(f"{node}: no n-body result from GPU {', '.join(map(str, missing))}")
        for gpu, value in sorted(got.items()):
            if median and value < SLOW * median:
                slow.append((node, gpu, value, median))
                failed.append(f"{node}: GPU {gpu} ran at {value:.0f} GFLOP/s, {value / median:.0%} of its siblings' "
                              f"median {median:.0f}: ask the provider for another machine")
    return {"gpus": measured, "median": median, "slow": slow, "failed": failed}


def run_burn_in(cluster: Cluster, nodes: dict[str, int], seconds: int) -> dict:
    """`nodes`: node -> its GPU count. Every pod starts at once; each is waited for."""
    request(cluster, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": NAMESPACE}})
    measured, errors = {}, []
    try:
        for node, gpus in nodes.items():
            _create(cluster, burn_in_pod(node, gpus, seconds))
        for node in nodes:
            phase, log, why = _pod_outcome(cluster, f"burn-in-{node}", seconds + 300)
            if phase != "Succeeded":
                errors.append(f"{node}: the burn-in pod {phase.lower()}: {why or log[-200:]}")
            measured[node] = throughputs(log)
    finally:
        cleanup(cluster)
    verdict = judge(measured, {n: g for n, g in nodes.items() if not any(e.startswith(f"{n}:") for e in errors)})
    verdict["failed"] = errors + verdict["failed"]
    return verdict
