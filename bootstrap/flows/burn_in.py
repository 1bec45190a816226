"""`bootstrap health --burn-in SECONDS`: the GPU nodes' burn-in through the API tunnel
(bootstrap.cluster.burn_in), reported per GPU."""

from __future__ import annotations

from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.cluster.burn_in import run_burn_in, slots_of


def burn_in(inventory, state, hosts: dict, seconds: int, console, connect=connect_to_cluster) -> dict:
    """`hosts`: node -> its facts (the nodes to stress)."""
    hosts = {n: h for n, h in hosts.items() if h.gpus}
    if not hosts:
        console.say("burn-in: no GPU node to stress")
        return {"gpus": {}, "failed": [], "warnings": []}
    with connect(inventory, state) as cluster:
        slots = slots_of(cluster, inventory, hosts)
        console.say(f"burn-in: n-body on {sum(s.count for s in slots.values())} GPU slot(s) of {len(slots)} node(s) "
                    f"for {seconds}s")
        verdict = run_burn_in(cluster, slots, seconds, inventory.gpu.gate.burn_in_min_gflops)
    for node, per_gpu in verdict["gpus"].items():
        for gpu, value in sorted(per_gpu.items()):
            console.say(f"burn-in {node} GPU {gpu}: {value:.0f} GFLOP/s")
    console.say_lines(f"burn-in FAIL {line}" for line in verdict["failed"])
    console.say_lines(f"burn-in WARN {line}" for line in verdict["warnings"])
    return {"gpus": {n: {str(g): v for g, v in p.items()} for n, p in verdict["gpus"].items()},
            "median": verdict.get("median"), "failed": verdict["failed"], "warnings": verdict["warnings"]}
