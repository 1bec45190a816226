"""Cordon and drain a node through the eviction API, so PodDisruptionBudgets are respected."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bootstrap.cluster.client import Cluster, get, merge_patch, request


@dataclass
class DrainResult:
    evicted: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # pod -> why (a PDB, usually)
    forced: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.blocked


def pods_on(cluster: Cluster, node: str) -> list[dict]:
    found = get(cluster, f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}") or {}
    return found.get("items", [])


def evictable(pod: dict) -> bool:
    """DaemonSet pods come back at once and mirror (static) pods cannot be evicted."""
    meta = pod.get("metadata", {})
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences", []) or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


def gpu_pods_on(cluster: Cluster, node: str) -> list[str]:
    names = []
    for pod in pods_on(cluster, node):
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in pod.get("spec", {}).get("containers", []):
            limits = (container.get("resources") or {}).get("limits") or {}
            if any(k.startswith("nvidia.com/") for k in limits):
                names.append(f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}")
                break
    return names


# Marks a cordon the tool made for a rolling upgrade: a later run knows the cordon is its
# own to lift (an operator's own cordons are left alone).
CORDONED_FOR_UPGRADE = "bootstrap.k3s/cordoned-for-upgrade"


def cordon(cluster: Cluster, node: str, mark: str | None = None) -> None:
    patch: dict = {"spec": {"unschedulable": True}}
    if mark:
        patch["metadata"] = {"annotations": {mark: "true"}}
    merge_patch(cluster, f"/api/v1/nodes/{node}", patch)


def uncordon(cluster: Cluster, node: str, mark: str | None = None) -> None:
    patch: dict = {"spec": {"unschedulable": None}}
    if mark:
        patch["metadata"] = {"annotations": {mark: None}}
    merge_patch(cluster, f"/api/v1/nodes/{node}", patch)


def cordoned_for_upgrade(nodes) -> list[str]:
    """Names of the Node objects the tool cordoned for an upgrade."""
    return [n["metadata"]["name"] for n in nodes
            if (n["metadata"].get("annotations") or {}).get(CORDONED_FOR_UPGRADE) == "true"]


def drain(cluster: Cluster, node: str, timeout_s: float, force: bool) -> DrainResult:
    result = DrainResult()
    deadline = time.monotonic() + timeout_s
    while True:
        pending = [p for p in pods_on(cluster, node) if evictable(p)]
        if not pending:
            result.blocked.clear()
            return result
        for pod in pending:
            meta = pod["metadata"]
            key = f"{meta.get('namespace', 'default')}/{meta['name']}"
            eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "default")}}
            status, body = request(cluster, "POST",
                                   f"/api/v1/namespaces/{meta.get('namespace', 'default')}/pods/{meta['name']}/eviction",
                                   eviction)
            if status < 300 or status == 404:
                result.evicted.append(key)
                result.blocked.pop(key, None)
            elif status == 429:
                result.blocked[key] = body.get("message", "a PodDisruptionBudget forbids it")
            else:
                result.blocked[key] = body.get("message", f"eviction failed ({status})")
        if time.monotonic() > deadline:
            if force:
                for key in list(result.blocked):
                    namespace, name = key.split("/", 1)
                    request(cluster, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
                    result.forced.append(key)
                result.blocked.clear()
            return result
        time.sleep(2)
