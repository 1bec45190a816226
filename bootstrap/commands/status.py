"""`bootstrap status INVENTORY`: nodes, GPUs, what the cluster advertises, components, snapshots."""

from __future__ import annotations

import json
import time

from bootstrap.cluster.node_status import ready_word
from bootstrap.hosts.connections import open_hosts
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir

RESOURCE_PREFIXES = ("nvidia.com/", "rdma/")


def run(args, console) -> int:
    from bootstrap import snapshots
    from bootstrap.facts.pyinfra_fact import HostFactsFact

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "status"):  # first contact pins host keys (and the API tunnel's)
        with open_hosts(inventory, list(inventory.nodes), "status", console) as session:
            facts = session.gather(HostFactsFact)
        nodes, components = cluster_view(inventory, state, facts)
    newest = snapshots.newest(state) if (state.path / "snapshots").exists() else None
    rows = []
    for node in inventory.nodes:
        host = facts.get(node.name)
        api = (nodes or {}).get(node.name, {})
        allocatable = {k: v for k, v in api.get("status", {}).get("allocatable", {}).items()
                       if k.startswith(RESOURCE_PREFIXES)}
        rows.append({
            "node": node.name, "role": node.role, "answers_ssh": host is not None,
            "ready": ready_word(api),
            "gpus": f"{len(host.gpus)} x {host.gpus[0].name}" if host and host.gpus else "-",
            "driver": host.driver_version if host and host.driver_version else "-",
            "cuda": host.cuda_version if host and host.cuda_version else "-",
            # what the node runs: during a rolling upgrade, which side of it each node is on
            "k3s": api.get("status", {}).get("nodeInfo", {}).get("kubeletVersion")
            or (host.k3s.version if host and host.k3s and host.k3s.version else "-"),
            "cordoned": bool(api.get("spec", {}).get("unschedulable")),
            "allocatable": allocatable,
        })
    report = {"cluster": inventory.cluster, "state_dir": str(state.path), "api": nodes is not None,
              "nodes": rows, "components": components,
              "newest_snapshot": None if newest is None else {
                  "file": newest.name, "age_hours": round((time.time() - newest.taken) / 3600, 1)}}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"cluster {inventory.cluster} (state: {state.path})" + ("" if nodes is not None else "; API unreachable"))
    print(f"{'NODE':<14} {'ROLE':<7} {'STATE':<18} {'K3S':<14} {'GPUS':<22} {'DRIVER':<12} {'CUDA':<5} ALLOCATABLE")
    for r in rows:
        state_word = (r["ready"] if r["answers_ssh"] else "NO-SSH") + (",cordoned" if r["cordoned"] else "")
        alloc = ", ".join(f"{k}={v}" for k, v in sorted(r["allocatable"].items())) or "-"
        print(f"{r['node']:<14} {r['role']:<7} {state_word:<18} {r['k3s']:<14} {r['gpus']:<22} {r['driver']:<12} "
              f"{r['cuda']:<5} {alloc}")
    for name, info in components.items():
        print(f"component {name}: {info['version']} ({info['state']})")
    applied = state.path / "applied-inventory.sha256"
    if applied.exists():
        import hashlib
        from pathlib import Path

        same = applied.read_text().split()[0] == hashlib.sha256(Path(inventory.source).read_bytes()).hexdigest()
        print("inventory: " + ("as last applied by `up`" if same else "changed since the last `up` (run `bootstrap plan`)"))
    print("newest snapshot: " + (f"{newest.name}, {report['newest_snapshot']['age_hours']} h old" if newest
                                 else "none (`bootstrap snapshot` takes one)"))
    return 0


def cluster_view(inventory, state, facts):
    """Node objects and component versions, or (None, {}) when no server's API answers."""
    from bootstrap.cluster.apply import read_digests
    from bootstrap.components.cluster_plan import plan_cluster
    from bootstrap.cluster.client import connect, get
    from bootstrap.errors import BootstrapError

    try:
        with connect(inventory, state) as cluster:
            nodes = {n["metadata"]["name"]: n for n in (get(cluster, "/api/v1/nodes") or {}).get("items", [])}
            digests = read_digests(cluster)
    except BootstrapError:
        return None, {}
    components = {}
    try:
        releases = plan_cluster(inventory, facts).releases
    except BootstrapError:
        releases = []
    from bootstrap.helm import release_state

    for release in releases:
        components[release.name] = {"version": release.version, "state": release_state(release, digests)}
    return nodes, components
