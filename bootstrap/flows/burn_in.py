"""`bootstrap health --burn-in SECONDS`: the GPU nodes' burn-in through the API tunnel
(bootstrap.cluster.burn_in), reported per GPU."""

from __future__ import annotations

from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.cluster.burn_in import run_burn_in


def burn_in(inventory, state, nodes_gpus: dict[str, int], seconds: int, console, connect=connect_to_cluster) -> dict:
    nodes = {n: g for n, g in nodes_gpus.items() if g}
    if not nodes:
        console.say("burn-in: no GPU node to stress")
        return {"gpus": {}, "failed": []}
    console.say(f"burn-in: n-body on {sum(nodes.values())} GPU(s) of {len(nodes)} node(s) for {seconds}s")
    with connect(inventory, state) as cluster:
        verdict = run_burn_in(cluster, nodes, seconds)
    for node, per_gpu in verdict["gpus"].items():
        for gpu, value in sorted(per_gpu.items()):
            console.say(f"burn-in {node} GPU {gpu}: {value:.0f} GFLOP/s")
    console.say_lines(f"burn-in FAIL {line}" for line in verdict["failed"])
    return {"gpus": {n: {str(g): v for g, v in p.items()} for n, p in verdict["gpus"].items()},
            "median": verdict.get("median"), "failed": verdict["failed"]}
