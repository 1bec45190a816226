"""The inventory as typed, validated data. Built only by `loader.load_inventory`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum


class Role(StrEnum):
    """A node's k3s role. A str: the inventory's plain "server"/"agent" compare equal."""

    SERVER = "server"
    AGENT = "agent"


class Component(StrEnum):
    """The cluster components, as the inventory names them (the keys of `charts:`)."""

    GPU_OPERATOR = "gpu_operator"
    MULTUS = "multus"  # with whereabouts, which ships inside the multus chart
    RDMA_SHARED_DEVICE_PLUGIN = "rdma_shared_device_plugin"
    NFS_CSI = "nfs_csi"
    LONGHORN = "longhorn"
    VOLCANO = "volcano"


@dataclass(frozen=True)
class SecretRef:
    """A secret named by reference: an environment variable or a file, never inline."""

    env: str | None = None
    file: str | None = None
    # Filled in by bootstrap.state.secrets.with_secret_values before planning, so the planners
    # that render it stay pure; never shown (repr) and not part of equality.
    value: str | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        return f"${self.env}" if self.env else f"file {self.file}"


@dataclass(frozen=True)
class SshSettings:
    user: str = "root"
    key: str | None = None
    port: int = 22
    sudo: bool | None = None  # None: sudo unless the user is root
    jump: str | None = None  # user@host[:port] of a bastion
    password: SecretRef | None = None
    key_passphrase: SecretRef | None = None
    connect_timeout: int = 10

    @property
    def use_sudo(self) -> bool:
        return self.user != "root" if self.sudo is None else self.sudo


@dataclass(frozen=True)
class SnapshotS3:
    """k3s uploads each snapshot (scheduled or on demand) here itself."""

    bucket: str
    endpoint: str = "s3.amazonaws.com"
    region: str = "us-east-1"
    folder: str | None = None
    access_key: SecretRef | None = None
    secret_key: SecretRef | None = None
    insecure: bool = False


@dataclass(frozen=True)
class EtcdSnapshots:
    schedule: str = "0 */6 * * *"
    retention: int = 12
    s3: SnapshotS3 | None = None


@dataclass(frozen=True)
class K3sSettings:
    version: str | None = None
    channel: str | None = None  # stable | latest | testing | v1.33; used when no version
    airgap: str | None = None  # folder with the k3s binary (and images tarball)
    tls_san: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    flannel_iface: str | None = None
    flannel_backend: str = "vxlan"
    cluster_cidr: str | None = None
    service_cidr: str | None = None
    snapshots: EtcdSnapshots = field(default_factory=EtcdSnapshots)
    # Seconds from a node's last word to the eviction of its pods; None: by network.mode
    # (hostplan.k3sconfig.LOST_NODE_EVICTION_S).
    lost_node_eviction_s: int | None = None
    # More config.yaml keys (k3s flag names) for servers and for agents; k3s rejects unknown ones.
    server_config: dict = field(default_factory=dict)
    agent_config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TimeSlicing:
    replicas: int
    rename_by_default: bool = False


@dataclass(frozen=True)
class Mig:
    layout: str | None = None  # a named mig-parted layout such as all-1g.18gb
    profiles: dict = field(default_factory=dict)  # profile name -> instances per GPU
    strategy: str = "single"


@dataclass(frozen=True)
class Mps:
    replicas: int


@dataclass(frozen=True)
class Sharing:
    time_slicing: TimeSlicing | None = None
    mig: Mig | None = None
    mps: Mps | None = None

    @property
    def mode(self) -> str:
        if self.mig:
            return "mig"
        if self.mps:
            return "mps"
        if self.time_slicing:
            return "time-slicing"
        return "none"


@dataclass(frozen=True)
class ContainerToolkit:
    # An apt source line for nvidia-container-toolkit; default: NVIDIA's repository.
    # Air-gapped sites point it at their mirror.
    apt_source: str | None = None
    version: str | None = None  # pin, e.g. "1.17.8-1"


# The acceptance gate's checks (bootstrap.cluster.gate): each GPU node's own.
GATE_CHECKS = ("health", "gpu-pod", "capacity", "rdma", "burn-in", "nccl")
# By default every check but the burn-in (it takes the node's GPUs for burn_in_s); `rdma`
# applies only with network.rdma, `nccl` only with validate.nccl (its image and floor).
DEFAULT_GATE_CHECKS = ("health", "gpu-pod", "capacity", "rdma", "nccl")


@dataclass(frozen=True)
class GateSettings:
    """`gpu.gate`: a GPU node joins tainted and takes workload pods only once its checks pass."""

    enabled: bool = True
    checks: tuple[str, ...] = DEFAULT_GATE_CHECKS
    burn_in_s: int = 120  # with `burn-in` in checks: n-body on every GPU of the node, this long
    # The least GFLOP/s a GPU slot's n-body run may show (the operator's figure for the model
    # rented); unset: a slot is held only against its own node's other slots.
    burn_in_min_gflops: float | None = None


@dataclass(frozen=True)
class GpuSettings:
    driver: str = "preinstalled"  # preinstalled | host | operator
    cuda: str | None = None
    driver_branch: str | None = None  # host mode: e.g. "570" (default: the distribution's recommended)
    sharing: Sharing = field(default_factory=Sharing)
    container_toolkit: ContainerToolkit = field(default_factory=ContainerToolkit)
    # GPU health checks: "warn" (report, never block), "strict" (a node with a health error
    # is left out of `up`), "off" (not probed).
    health: str = "warn"
    gate: GateSettings = field(default_factory=GateSettings)
    # The GPUs each GPU node should have (the machine type rented): a node showing fewer is a
    # health error. Unset: each node is held to the GPUs on its own PCI bus, never to a peer's.
    count: int | None = None
    # The inventory has a `gpu:` section (even one of defaults only): it asks for GPUs, which
    # makes the cluster a GPU cluster (bootstrap.topology.gpu_cluster). Not compared.
    written: bool = field(default=False, compare=False, repr=False)


@dataclass(frozen=True)
class NodeGpu:
    """Per-node GPU overrides; anything unset comes from the cluster-wide `gpu:`."""

    enabled: bool | None = None  # force a node to be treated as GPU / non-GPU
    sharing: Sharing | None = None
    count: int | None = None  # the GPUs this node should have (over gpu.count)


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    role: str = Role.AGENT
    node_ip: str | None = None  # private address for cluster traffic when `address` is public
    labels: dict = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    ssh: dict = field(default_factory=dict)  # per-node overrides of SshSettings fields
    gpu: NodeGpu = field(default_factory=NodeGpu)
    rdma_interfaces: tuple[str, ...] | None = None
    provider: str | None = None  # where the machine is rented (free text: lambda, hetzner, ...)
    region: str | None = None  # the provider's region: the topology.kubernetes.io/region label
    # false: a machine whose root you do not trust with more than its own kubelet's rights
    # (bootstrap.cluster.components.trust keeps over-privileged pods off it); servers always are.
    trusted: bool = True


@dataclass(frozen=True)
class Rdma:
    mode: str = "shared"
    interfaces: tuple[str, ...] = ()
    subnet: str | None = None
    resource_name: str = "rdma/rdma_shared_device_a"
    # interface -> "infiniband" | "ethernet", where its name does not say (ib*: InfiniBand)
    link_layer: dict = field(default_factory=dict)


class NetworkMode(StrEnum):
    """How nodes reach each other: over a private network they share (a provider's VPC), or
    over their public addresses, encrypted (machines rented at several providers)."""

    PRIVATE = "private"
    PUBLIC = "public"


@dataclass(frozen=True)
class NetworkSettings:
    rdma: Rdma | None = None
    mode: str = NetworkMode.PRIVATE

    @property
    def public(self) -> bool:
        return self.mode == NetworkMode.PUBLIC


@dataclass(frozen=True)
class Nfs:
    server: str
    share: str
    mount_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class StorageSettings:
    default: str = "local-path"  # local-path | nfs | longhorn
    nfs: Nfs | None = None
    longhorn_replicas: int = 2


@dataclass(frozen=True)
class Queue:
    name: str
    weight: int = 1
    reclaimable: bool = True  # Volcano's own default: idle capacity may be lent and taken back


@dataclass(frozen=True)
class VolcanoSettings:
    enabled: bool = True
    queues: tuple[Queue, ...] = ()


@dataclass(frozen=True)
class RegistryAuth:
    username: str | None = None
    password: SecretRef | None = None
    token: SecretRef | None = None


@dataclass(frozen=True)
class RegistrySettings:
    mirrors: dict = field(default_factory=dict)  # registry -> tuple of endpoint URLs
    auth: dict = field(default_factory=dict)  # host -> RegistryAuth


# Registries whose images nodes share peer to peer when the embedded mirror is on: where
# the images of a GPU cluster come from (CUDA and NGC images, charts' images, k3s's own).
DEFAULT_MIRRORED_REGISTRIES = ("docker.io", "registry.k8s.io", "nvcr.io", "ghcr.io", "quay.io")


@dataclass(frozen=True)
class ImageSettings:
    embedded_mirror: bool | None = None  # k3s's embedded registry mirror; None: on for GPU clusters
    mirror_registries: tuple = DEFAULT_MIRRORED_REGISTRIES
    prepull: tuple = ()  # image references pulled on every GPU node by `up`


@dataclass(frozen=True)
class Nccl:
    enabled: bool = True
    min_busbw_gbps: float | None = None
    image: str | None = None  # nccl-tests with MPI and sshd (default: see bootstrap.cluster.checks)
    gpus_per_node: int | None = None  # default: every GPU of the node


@dataclass(frozen=True)
class ValidateSettings:
    gpu_pod: bool = True
    image: str | None = None
    nccl: Nccl | None = None
    timeout_s: int = 600


@dataclass(frozen=True)
class ChartPin:
    """`charts: {<component>: VERSION}`, or with where the chart comes from instead of the
    component's public repository: a chart archive (`helm package` output, relative to the
    inventory file) or another repository (an https mirror or an `oci://` registry)."""

    version: str
    archive: str | None = None
    repo: str | None = None


@dataclass(frozen=True)
class Inventory:
    cluster: str
    nodes: tuple[Node, ...]
    source: str = "<inventory>"
    ssh: SshSettings = field(default_factory=SshSettings)
    k3s: K3sSettings = field(default_factory=K3sSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    volcano: VolcanoSettings = field(default_factory=VolcanoSettings)
    registries: RegistrySettings = field(default_factory=RegistrySettings)
    images: ImageSettings = field(default_factory=ImageSettings)
    validate: ValidateSettings = field(default_factory=ValidateSettings)
    charts: dict = field(default_factory=dict)  # component -> ChartPin (version, and where the chart comes from)
    state_dir: str | None = None

    @property
    def servers(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == Role.SERVER)

    @property
    def agents(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == Role.AGENT)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def sharing_for(self, node: Node) -> Sharing:
        return node.gpu.sharing if node.gpu.sharing is not None else self.gpu.sharing

    def gpu_count_for(self, node: Node) -> int | None:
        """The GPUs the operator wrote this node should have, or None (not pinned)."""
        return node.gpu.count if node.gpu.count is not None else self.gpu.count

    def ssh_for(self, node: Node) -> SshSettings:
        if not node.ssh:
            return self.ssh
        return replace(self.ssh, **node.ssh)
