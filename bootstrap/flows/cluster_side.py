"""The cluster side: components through the API tunnel, then the checks.

A converged cluster stays untouched: the checks run when anything changed (or on demand,
`bootstrap validate`).
"""

from __future__ import annotations

import contextlib
import time

from bootstrap.cluster.apply import apply_cluster
from bootstrap.cluster.client import connect as connect_to_cluster
from bootstrap.cluster.read_ahead import remember
from bootstrap.cluster.components.cluster_plan import plan_cluster
from bootstrap.cluster.components.rdma import warning_lines as rdma_warning_lines
from bootstrap.errors import EXIT_FAILED, EXIT_OK, HostsFailed
from bootstrap.flows.gate import failure, gate_phase
from bootstrap.flows.run import Run
from bootstrap.host.images import download_lines
from bootstrap.cluster.checks import render_table, run_checks


def cluster_phase(run: Run, *, validate: bool, hosts_changed: bool = True,
                  wait_for: list[str] | None = None) -> bool:
    """Components through the API tunnel (`run.connect`: the tunnel; a sandboxed API in
    tests), then the checks (raises when one fails) when anything changed: a converged
    cluster stays untouched (`bootstrap validate` re-checks it). `wait_for`: the nodes to
    wait for Ready (default every node of the inventory). The hosts' facts are read once
    the nodes are Ready (`up` probes them again meanwhile: Run.settled_facts). Returns
    whether anything in the cluster changed."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        with run.console.phase("cluster: tunnel"):
            cluster = stack.enter_context(run.connect(run.inventory, run.state))
        # Facts at hand: the plan now, so its objects are read with the node list.
        gpu = run.topology.gpu_nodes_of(run.inventory)
        plan = (lambda: plan_cluster(run.inventory, run.settled_facts(), gpu)) if run.reprobing \
            else plan_cluster(run.inventory, run.facts, gpu)
        # Read ahead while the hosts were probed (host_phase.connect_early): current when no
        # host changed since, so nothing this run did can have changed them.
        summary = apply_cluster(cluster, run.inventory, plan, run.console.say, wait_for=wait_for,
                                trace=run.console.phase, prefetched=None if hosts_changed else cluster.prefetched)
        remember(run.state, summary.pop("compared"))
        mig_failed = summary.pop("mig_failed", {})  # each node's own: the others went on
        run.console.say_lines(f"mig: {why}" for why in mig_failed.values())
        run.console.say_lines(rdma_warning_lines(run.inventory, run.settled_facts()))  # each node's own
        gate_failed = failure(gate_phase(run, cluster, summary.pop("nodes", None), mig_failed))
    for line in download_lines(run.inventory, run.settled_facts(), run.topology.gpu_nodes_of(run.inventory)):  # k3s pulls them in the background
        run.console.say(line)
    changes = len(summary["labelled"]) + len(summary["objects"]) + len(summary["releases"])
    say_summary(run.console, summary, changes, time.monotonic() - started)
    if validate and not (changes or hosts_changed):
        run.console.say("validate: nothing changed, checks not re-run (`bootstrap validate` runs them)")
    elif validate and validate_cluster(run.inventory, run.state, run.settled_facts(), run.console,
                                       gpu=run.topology.gpu_nodes_of(run.inventory), connect=run.connect) != 0:
        raise HostsFailed("validation failed", "see the FAIL lines above; `bootstrap validate` re-runs the checks")
    if gate_failed or mig_failed:
        raise nodes_failed(gate_failed, mig_failed)
    return bool(changes)


def nodes_failed(gate_failed: str | None, mig_failed: dict[str, str]) -> HostsFailed:
    """What `up` ends with when a GPU node failed the gate or its MIG layout (exit 1)."""
    parts = [f"MIG layout not applied on {', '.join(mig_failed)}"] if mig_failed else []
    hints = ["see the mig: lines above; check the layout fits the GPU (bootstrap facts shows its profiles)"] \
        if mig_failed else []
    if gate_failed:
        parts.append(gate_failed)
        hints.append("see the gate: lines above (the reason is also on the node, annotation "
                     "bootstrap.k3s/gate-reason); fix or replace the machine (`bootstrap rebuild`), then `bootstrap up`")
    return HostsFailed("; ".join(parts), "; ".join(hints))


def say_summary(console, summary: dict, changes: int, seconds: float) -> None:
    console.event("cluster", releases=list(summary["releases"]), objects=list(summary["objects"]),
                  relabelled=list(summary["labelled"]))
    if changes:
        for line in summary["objects"]:
            console.say(f"  {line}")
        console.say(f"cluster: {len(summary['releases'])} release(s) applied, {len(summary['objects'])} object(s) "
                    f"changed, {len(summary['labelled'])} node(s) relabelled ({seconds:.1f}s)")
    else:
        console.say(f"cluster: no change ({seconds:.1f}s)")


def validate_cluster(inventory, state, facts, console, *, gpu, as_json: bool = False,
                     connect=connect_to_cluster) -> int:
    """The checks (bootstrap.cluster.checks) as a table, JSON or events; exit 1 when one fails.
    `gpu`: the GPU nodes as the run's topology resolved them."""
    with connect(inventory, state) as cluster:
        results = run_checks(cluster, inventory, facts, gpu)

    if console.json:  # inside `up --json`: one event, not a document
        console.event("validate", checks=[r.to_dict() for r in results])
    elif as_json:
        console.document({"cluster": inventory.cluster, "checks": [r.to_dict() for r in results]})
    else:
        console.say(render_table(results))
    failed = [r for r in results if r.status == "FAIL"]
    if failed and not as_json and not console.json:
        console.say(f"{len(failed)} check(s) failed")
    return EXIT_FAILED if failed else EXIT_OK

