"""The acceptance gate's phase of `up` and `rebuild`: once the components are applied, each
gated GPU node's own checks; a node that passes takes workload pods, one that fails stays
gated with the reason on the node and here (bootstrap.cluster.gate)."""

from __future__ import annotations

from bootstrap.cluster.gate import read_nodes, run_gate
from bootstrap.cluster.gate_rules import GateDecision
from bootstrap.console_text import printable
from bootstrap.flows.run import Run


def gate_phase(run: Run, cluster, node_objects: dict | None = None,
               failed_before: dict[str, str] | None = None) -> list[GateDecision]:
    """`node_objects`: the Node objects as apply_cluster just read them (else read here);
    `failed_before`: nodes that already failed on the cluster side (their MIG layout), with why."""
    if not run.inventory.gpu.gate.enabled:
        return []
    with run.console.phase("cluster: acceptance gate"):
        nodes = node_objects if node_objects is not None else read_nodes(cluster)
        decisions, legacy, unprobed = run_gate(cluster, run.inventory, run.settled_facts(), nodes,
                                               run.topology.gpu_nodes_of(run.inventory), failed_before,
                                               gpu_cluster=run.topology.gpu_cluster)
    for name in legacy:
        run.console.say(f"gate: {name} registered before the acceptance gate: gated through the API for its checks")
    for name in unprobed:
        run.console.say(f"gate: {name}: its Node has no gate and never passed it, and its host did not answer the "
                        "probe: gated through the API without its checks, which run once it answers")
    say_decisions(run.console, decisions)
    return decisions


def say_decisions(console, decisions: list[GateDecision]) -> None:
    if not decisions:
        return
    console.event("gate", nodes=[{"node": d.node, "passed": d.passed, "held": d.held, "reason": d.reason}
                                 for d in decisions])
    for decision in decisions:
        verdict = "passed, takes workloads" if decision.passed else "not passed, stays gated" if decision.held \
            else "not passed, takes workloads all the same (a server is never gated)"
        console.say(f"gate: {decision.node}: {verdict}: {printable(decision.reason)}")


def failure(decisions: list[GateDecision]) -> str | None:
    """What `up` stops with (exit 1), or None: every node that failed, gated or, a server, not."""
    held = [d.node for d in decisions if d.held]
    open_failed = [d.node for d in decisions if not d.passed and not d.held]
    parts = [f"{len(held)} GPU node(s) failed the acceptance gate and stay gated: {', '.join(held)}"] if held else []
    if open_failed:
        parts.append(f"{len(open_failed)} GPU server(s) failed the acceptance gate and take workloads all the same "
                     f"(a server is never gated): {', '.join(open_failed)}")
    return "; ".join(parts) or None
