"""Everything the cluster should run, from the inventory and the hosts' facts. Pure.

Lists come in dependency order: apply releases first, in order, then manifests, then
patches. (Multus before anything that starts pods; charts before the custom resources
whose CRDs they install: NetworkAttachmentDefinitions after rke2-multus(-crd), Queues
after Volcano.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.cluster.components import gpu_operator, gpu_sharing, rdma, storage, trust, volcano
from bootstrap.cluster.components.release import Patch, Release
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory, Node
from bootstrap.checks.providers import topology_labels


def desired_releases(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> list[Release]:
    releases: list[Release | None] = []
    if inventory.network.rdma:
        releases += rdma.multus_releases(inventory, rdma.cni_dirs(inventory, facts_by_node))
    releases += [storage.nfs_release(inventory), storage.longhorn_release(inventory)]
    if gpu:
        releases.append(gpu_operator.release(inventory, facts_by_node, gpu))
    releases.append(volcano.release(inventory))
    return [r for r in releases if r is not None]


def desired_prerequisites(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> list[dict]:
    """Objects that releases refer to, applied before them."""
    if not gpu:
        return []
    return gpu_operator.config_maps(inventory, facts_by_node, gpu)


def desired_manifests(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> list[dict]:
    manifests: list[dict | None] = []
    if inventory.network.rdma:
        manifests += rdma.manifests(inventory, rdma.cni_dirs(inventory, facts_by_node), gpu)
    manifests.append(storage.nfs_storage_class(inventory))
    manifests += volcano.queues(inventory)
    return [m for m in manifests if m is not None]


def desired_patches(inventory: Inventory) -> list[Patch]:
    patch = storage.local_path_patch(inventory)
    return [patch] if patch else []


def node_labels(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> dict[str, dict[str, str]]:
    """Every node's wanted labels: its provider and region, the inventory's own, then the
    GPU-sharing ones (which win, since the operator acts on them), then the trust and RDMA
    labels (the tool's own selectors)."""
    sharing = gpu_sharing.sharing_labels(inventory, facts_by_node, gpu)
    trusted = trust.trust_labels(inventory)
    with_rdma = rdma.rdma_labels(inventory, facts_by_node)
    return {node.name: {**topology_labels(node), **{str(k): str(v) for k, v in node.labels.items()},
                        **sharing.get(node.name, {}), **trusted.get(node.name, {}), **with_rdma.get(node.name, {})}
            for node in inventory.nodes}


@dataclass(frozen=True)
class ClusterPlan:
    """What the cluster should hold, built once and read by `up` (apply), `plan` and `status`."""

    labels: dict[str, dict[str, str]]  # node -> wanted labels
    prerequisites: list[dict]  # objects releases refer to
    releases: list[Release]
    manifests: list[dict]
    patches: list[Patch]
    # GPU nodes whose MIG layout could not be spelled out from their own profile table, each
    # with why: that node's failure (the gate keeps it gated), never the cluster side's.
    mig_failed: dict[str, str] = field(default_factory=dict)


def plan_cluster(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> ClusterPlan:
    """`gpu`: the run's GPU nodes (bootstrap.topology: resolved once, never here)."""
    return ClusterPlan(labels=node_labels(inventory, facts_by_node, gpu),
                       prerequisites=desired_prerequisites(inventory, facts_by_node, gpu),
                       releases=desired_releases(inventory, facts_by_node, gpu),
                       manifests=desired_manifests(inventory, facts_by_node, gpu),
                       patches=desired_patches(inventory),
                       mig_failed=gpu_sharing.mig_plan(inventory, facts_by_node, gpu).failed)
