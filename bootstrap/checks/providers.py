"""Machines rented at several providers: which provider and region each node is at, as
labels on its Node, and the layouts that lose the control plane with one provider. Pure.

The region goes under Kubernetes' well-known key `topology.kubernetes.io/region`, which a
kubelet may set on its own Node (kubernetes/kubernetes pkg/kubelet/apis/well_known_labels.go,
`kubeletLabels`); the provider under the tool's own prefix, so pods can be kept within one
provider with a nodeSelector or a topology spread.
"""

from __future__ import annotations

from collections import Counter

from bootstrap.inventory.model import Inventory, Node

PROVIDER_LABEL = "bootstrap.k3s/provider"
REGION_LABEL = "topology.kubernetes.io/region"
NO_PROVIDER = "(no provider)"  # nodes the inventory gives no provider: one group


def topology_labels(node: Node) -> dict[str, str]:
    labels = {}
    if node.provider:
        labels[PROVIDER_LABEL] = node.provider
    if node.region:
        labels[REGION_LABEL] = node.region
    return labels


def group_of(node: Node) -> str:
    return node.provider or NO_PROVIDER


def provider_groups(nodes) -> dict[str, list[Node]]:
    """provider -> its nodes, in inventory order (nodes without a provider form one group)."""
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(group_of(node), []).append(node)
    return groups


def quorum_loss_by_provider(inventory: Inventory) -> str | None:
    """The layout, when the servers sit at more than one provider and losing one provider
    would take a majority of them (embedded etcd then stops: no quorum), else None."""
    servers = inventory.servers
    counts = Counter(group_of(s) for s in servers)
    if len(servers) < 2 or len(counts) < 2:
        return None
    majority = len(servers) // 2 + 1
    breaking = [p for p, n in counts.items() if len(servers) - n < majority]
    if not breaking:
        return None
    layout = ", ".join(f"{p} {n} ({', '.join(s.name for s in servers if group_of(s) == p)})"
                       for p, n in counts.most_common())
    return f"servers: {layout}; losing {' or '.join(breaking)} loses etcd quorum ({majority} of {len(servers)} needed)"
