"""The cluster's shape as the probe found it, resolved once per run and read by everyone:
which nodes are GPU nodes, each node's node-ip and external IP, whether the embedded
registry mirror is on, the first server, and (once preflight passes) the k3s release per
architecture. Pure: inventory + facts in. A flow keeps the one it made on its `Run`
(bootstrap.flows.run); a part that needs a derived fact is given it, never recomputes it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.registries import embedded_mirror_on
from bootstrap.inventory.model import GpuSettings, Inventory, Node, NodeGpu
from bootstrap.checks.node_addresses import NodeAddresses, choose_all


def is_gpu_node(inventory: Inventory, node: Node, facts: HostFacts | None) -> bool:
    """The node's own setup: the inventory's gpu.enabled wins; else the host's GPUs decide. A
    host that does not answer (no facts) is a GPU node only when the inventory says so."""
    if node.gpu.enabled is not None:
        return node.gpu.enabled
    return facts is not None and facts.gpu_hardware


def gpu_nodes(inventory: Inventory, facts: dict[str, HostFacts]) -> list[Node]:
    """The nodes that are GPU nodes by their own setup, in inventory order. The run's GPU
    nodes are these in a GPU cluster (gpu_cluster), none otherwise: resolve_topology."""
    return [n for n in inventory.nodes if is_gpu_node(inventory, n, facts.get(n.name))]


def named_gpu_node(node: Node) -> bool:
    """The inventory names this node a GPU node: gpu.enabled: true, or a GPU setting of its
    own (sharing, count) without gpu.enabled: false."""
    return node.gpu.enabled is True or (node.gpu.enabled is None and node.gpu != NodeGpu())


def gpu_cluster(inventory: Inventory, facts: dict[str, HostFacts]) -> bool:
    """Whether the cluster is set up for GPUs: what turns on the cluster-wide settings (the
    GPU Operator, by default the embedded registry mirror, which restarts the servers and
    lists the mirrored registries in every node's registries.yaml). Decided by what the
    operator wrote (a node named a GPU node, a `gpu:` section, an NCCL check) and by the
    servers' own GPUs (whoever runs a server holds the cluster anyway), never by an agent's
    claim: one line of PCI output changes no other host. A `charts.gpu_operator` pin is no
    such word: an air-gapped inventory pins every chart it brings (the tests' lab does)."""
    asked = (inventory.gpu.written or inventory.gpu != GpuSettings() or inventory.validate.nccl is not None
             or any(named_gpu_node(n) for n in inventory.nodes))
    return asked or any(is_gpu_node(inventory, n, facts.get(n.name)) for n in inventory.servers)


@dataclass(frozen=True)
class Topology:
    gpu_nodes: tuple[str, ...]  # names, in inventory order
    addresses: dict[str, NodeAddresses]  # per node: node-ip (internal) and node-external-ip
    embedded_mirror: bool  # k3s's embedded registry mirror (hostparts.registries.embedded_mirror_on)
    first_server: str  # the cluster-init server, where snapshots are taken
    # Agents whose own GPUs go unused: they report GPUs, but the cluster is no GPU cluster
    # (gpu_cluster: nothing in the inventory asks for GPUs). Preflight says so, with the fix.
    unused_gpus: tuple[str, ...] = ()
    gpu_cluster: bool = False  # gpu_cluster(): the inventory's word, and the servers' own GPUs
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
    """In a GPU cluster every node that is a GPU node by its own setup is one (an agent's
    undeclared GPUs then change only that agent); in another, none is."""
    own = tuple(n.name for n in gpu_nodes(inventory, facts))
    cluster = gpu_cluster(inventory, facts)
    return Topology(gpu_nodes=own if cluster else (), addresses=choose_all(inventory, facts),
                    embedded_mirror=embedded_mirror_on(inventory, cluster),
                    first_server=inventory.servers[0].name, unused_gpus=() if cluster else own,
                    gpu_cluster=cluster)
