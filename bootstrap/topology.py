"""The cluster's shape as the probe found it, resolved once per run and read by everyone:
which nodes are GPU nodes, each node's node-ip and external IP, whether the embedded
registry mirror is on, the first server, and (once preflight passes) the k3s release per
architecture. Pure: inventory + facts in. A flow keeps the one it made on its `Run`
(bootstrap.flows.run); a part that needs a derived fact is given it, never recomputes it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.registries import embedded_mirror_on
from bootstrap.inventory.model import Inventory, Node
from bootstrap.checks.node_addresses import NodeAddresses, choose_all


def is_gpu_node(inventory: Inventory, node: Node, facts: HostFacts | None) -> bool:
    """The inventory's gpu.enabled wins; else the host's GPUs decide. A host that does not
    answer (no facts) is a GPU node only when the inventory says so."""
    if node.gpu.enabled is not None:
        return node.gpu.enabled
    return facts is not None and facts.gpu_hardware


def gpu_nodes(inventory: Inventory, facts: dict[str, HostFacts]) -> list[Node]:
    """The cluster's GPU nodes, in inventory order: the one answer every part reads."""
    return [n for n in inventory.nodes if is_gpu_node(inventory, n, facts.get(n.name))]


@dataclass(frozen=True)
class Topology:
    gpu_nodes: tuple[str, ...]  # names, in inventory order
    addresses: dict[str, NodeAddresses]  # per node: node-ip (internal) and node-external-ip
    embedded_mirror: bool  # k3s's embedded registry mirror (hostparts.registries.embedded_mirror_on)
    first_server: str  # the cluster-init server, where snapshots are taken
    # The k3s release per architecture ({arch: K3sArtifacts}) and its version: resolved
    # (online for a channel) only once preflight found nothing wrong.
    releases: dict = field(default_factory=dict)
    target_version: str | None = None

    def is_gpu(self, name: str) -> bool:
        return name in self.gpu_nodes

    def gpu_nodes_of(self, inventory: Inventory) -> list[Node]:
        """The GPU nodes as `inventory`'s nodes (the run's resolved one: with node-ips), in its order."""
        return [n for n in inventory.nodes if n.name in self.gpu_nodes]

    def with_releases(self, releases: dict) -> "Topology":
        target = next(iter(releases.values())).version if releases else None
        return replace(self, releases=releases, target_version=target)


def resolve_topology(inventory: Inventory, facts: dict[str, HostFacts]) -> Topology:
    gpu = tuple(n.name for n in gpu_nodes(inventory, facts))
    return Topology(gpu_nodes=gpu, addresses=choose_all(inventory, facts),
                    embedded_mirror=embedded_mirror_on(inventory, bool(gpu)),
                    first_server=inventory.servers[0].name)
