"""`bootstrap rebuild INVENTORY`: bring the cluster back after spot loss, touching nothing healthy.

1. facts from whatever answers; the API through any server that answers;
2. no server answers: restore the first inventory server from the newest snapshot, with
   the old token, and point everything at it;
3. lost nodes (NotReady, machine gone): etcd member removal for servers (the annotation,
   never a force-delete), delete the Node, clear its node-password secret;
4. replacements and repairs joined as `up` would (healthy hosts plan no change);
5. the cluster side and `validate`; a summary of what was lost, replaced and restored.
"""

from __future__ import annotations

import time

from bootstrap import snapshots
from bootstrap import up as flow
from bootstrap.commands.common import open_hosts
from bootstrap.commands.up import cluster_phase, gather_and_plan, gather_facts
from bootstrap.errors import BootstrapError, HostsFailed
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.rebuild import classify, quorum_after, stale_after_restore
from bootstrap.statedir import StateDir

REMOVE_ANNOTATION = "etcd.k3s.cattle.io/remove"
REMOVED_ANNOTATION = "etcd.k3s.cattle.io/removed-node-name"


def cluster_nodes(inventory, state):
    """{name: Node} through any server that answers, or None when none does."""
    from bootstrap.cluster.client import ClusterError, connect, get

    try:
        with connect(inventory, state) as cluster:
            return {n["metadata"]["name"]: n for n in (get(cluster, "/api/v1/nodes") or {}).get("items", [])}
    except (ClusterError, BootstrapError):
        return None


def remove_lost(inventory, state, lost: list[str], lost_servers: list[str]) -> None:
    from bootstrap.cluster.client import connect, get, merge_patch, request, wait_for

    with connect(inventory, state) as cluster:
        for name in lost:
            path = f"/api/v1/nodes/{name}"
            if name in lost_servers:
                # Through k3s's etcd member controller: the member goes, then the Node.
                merge_patch(cluster, path, {"metadata": {"annotations": {REMOVE_ANNOTATION: "true"}}})
                wait_for(f"etcd to remove member {name}",
                         lambda: REMOVED_ANNOTATION in (get(cluster, path) or {}).get("metadata", {}).get(
                             "annotations", {}) or get(cluster, path) is None, 120)
            request(cluster, "DELETE", path)
            # So that a replacement may reuse the name (k3s keeps a password per node name).
            request(cluster, "DELETE", f"/api/v1/namespaces/kube-system/secrets/{name}.node-password.k3s")


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    if not (state.path / "token").exists():
        raise BootstrapError(f"no join token in {state.path}: rebuild needs the state folder `up` wrote",
                             "restore the state folder, or set state_dir in the inventory to it")
    started = time.monotonic()
    report = {"lost": [], "replaced": [], "restored": None}
    with cluster_lock(state, "rebuild"):
        with open_hosts(inventory, list(inventory.nodes), "rebuild") as session:
            facts = gather_facts(session, inventory)
            nodes = cluster_nodes(inventory, state)
            plan = classify(inventory, nodes, facts)
            restore = None
            if nodes is None:
                snapshot = snapshots.newest(state)
                if plan.restore_on is None or snapshot is None:
                    raise HostsFailed("no server answers and the control plane cannot be restored: "
                                      + ("the first server in the inventory does not answer either"
                                         if plan.restore_on is None else f"no snapshot in {state.path}/snapshots"),
                                      "add a replacement server (first in the inventory) and keep snapshots "
                                      "(`bootstrap snapshot`)")
                restore = (plan.restore_on, snapshot)
                report["restored"] = f"{plan.restore_on} from {snapshot.name}"
            else:
                if plan.lost_servers and not quorum_after(inventory, plan.lost_servers):
                    raise HostsFailed(f"servers {', '.join(plan.lost_servers)} are lost and etcd has no quorum",
                                      "restore from a snapshot onto a new first server")
                remove_lost(inventory, state, plan.lost, plan.lost_servers)
                report["lost"] = plan.lost
            for name in plan.unreachable:
                session.failures.pop(name, None)  # expected: a lost machine, reported below
            reachable = [n for n in inventory.nodes if n.name in facts]
            session.nodes = reachable
            # Replacing the first server of an HA cluster: it must join a healthy server, not
            # start a new cluster of its own (cluster-init).
            first = inventory.servers[0]
            join_via = None
            if nodes is not None and first.name not in plan.healthy:
                join_via = next((s for s in inventory.servers if s.name in plan.healthy), None)
            facts, plans = gather_and_plan(session, inventory, state, create_token=False, facts=facts,
                                           tolerate_unreachable=True, join_via=join_via)
            rollout = plans.rollout(inventory, facts)
            if rollout:
                # Restarting running nodes on a new k3s belongs to a rolling upgrade, not to
                # a repair: nothing has been changed on the hosts yet.
                raise BootstrapError(
                    f"the inventory asks for k3s {rollout.target or '(the k3s.airgap binary)'}, and "
                    f"{', '.join(rollout.nodes)} run another release",
                    "rebuild with the k3s.version the cluster runs now, then upgrade with `bootstrap up`")
            changed = {name for name, p in plans.plans.items() if p.changed}
            if changed:
                from bootstrap.hosts.executor import execute

                for name in plan.unreachable:
                    session.fail(name, "does not answer over SSH")
                execute(session, flow.converge_steps(inventory, plans.plans, set(session.failures), restore=restore))
                flow.fetch_kubeconfig(session, inventory, state)
            report["replaced"] = sorted(changed & set(plan.join))
            failed = {n: f for n, f in session.failures.items() if n not in plan.unreachable}
        if failed:
            for failure in failed.values():
                print(f"FAILED {failure.render()}")
            raise HostsFailed(f"{len(failed)} host(s) failed: {', '.join(sorted(failed))}")
        if restore:
            # The snapshot brought back Node objects of machines that are gone: a second pass.
            nodes = cluster_nodes(inventory, state) or {}
            stale = stale_after_restore(inventory, nodes, facts)
            if stale:
                # The old servers' etcd members went with the reset: plain Node deletes.
                remove_lost(inventory, state, stale, [])
                report["lost"] = stale
        cluster_phase(inventory, state, facts, validate=not args.no_validate)
    healthy = [n for n in plan.healthy if n not in report["replaced"]]
    print(f"rebuild done in {time.monotonic() - started:.1f}s: lost {', '.join(report['lost']) or 'none'}; "
          f"joined {', '.join(report['replaced']) or 'none'}; restored {report['restored'] or 'nothing'}; "
          f"unchanged {', '.join(healthy) or 'none'}"
          + (f"; not answering {', '.join(plan.unreachable)}" if plan.unreachable else ""))
    return 0
