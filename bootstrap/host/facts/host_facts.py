"""What the tool knows about a host after one probe: plain, frozen, JSON-able values.

Every field has a default so that an unknown or unparsable source simply stays at its
"unknown" value (None / empty) instead of failing the whole fact, and so that tests and
other modules can build a HostFacts with only the fields they care about.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _jsonable(value: Any) -> Any:
    # asdict() keeps tuples and sets; JSON has only lists, and sets are not ordered.
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class _ToDict:
    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))  # type: ignore[call-overload]


@dataclass(frozen=True)
class Gpu(_ToDict):
    index: int
    uuid: str
    name: str
    pci_bus_id: str = ""
    memory_mib: int | None = None
    driver_version: str | None = None
    mig_current: bool | None = None  # None: "[N/A]", the GPU cannot do MIG
    mig_pending: bool | None = None  # differs from current until the GPU is reset
    compute_capability: str | None = None  # "9.0"
    persistence_mode: bool | None = None
    vbios_version: str | None = None

    @property
    def mig_capable(self) -> bool:
        return self.mig_current is not None


@dataclass(frozen=True)
class MigProfile(_ToDict):
    gpu_index: int
    name: str  # "1g.18gb", "1g.18gb+me"
    profile_id: int
    instances_free: int
    instances_total: int
    memory_gib: float
    placements: list[tuple[int, int]] = field(default_factory=list)  # (start, size)


@dataclass(frozen=True)
class RdmaDevice(_ToDict):
    name: str  # "mlx5_0"
    port: int
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)
    state: str | None = None  # "ACTIVE", "DOWN", ... (sysfs "4: ACTIVE" without the number)
    netdevs: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class SystemdUnit(_ToDict):
    name: str  # "k3s.service"
    load_state: str | None = None  # "loaded", "not-found", ...
    active_state: str | None = None  # "active", "inactive", "failed", ...
    unit_file_state: str | None = None  # "enabled", "disabled", ...

    @property
    def present(self) -> bool:
        return self.load_state == "loaded"

    @property
    def active(self) -> bool:
        return self.active_state == "active"


@dataclass(frozen=True)
class K3sInstall(_ToDict):
    binary: str | None = None  # path of `k3s` on PATH
    version: str | None = None  # "v1.31.4+k3s1"
    config_present: bool = False  # /etc/rancher/k3s/config.yaml
    units: list[SystemdUnit] = field(default_factory=list)  # k3s.service, k3s-agent.service
    node_ip: str | None = None  # config.yaml's node-ip: the address the node runs with
    # config.yaml's embedded-registry (None: no such line): a server the tool started with
    # the mirror (the default of a GPU cluster); preflight's gpu_setup_dropped reads it.
    embedded_registry: bool | None = None

    def unit(self, name: str) -> SystemdUnit | None:
        wanted = name if "." in name else f"{name}.service"
        return next((u for u in self.units if u.name == wanted), None)


@dataclass(frozen=True)
class ListeningPort(_ToDict):
    proto: str  # "tcp" or "udp"
    port: int
    address: str = ""  # "0.0.0.0", "::", "127.0.0.53%lo", "*"
    process: str | None = None  # only visible for our own sockets unless probed as root
    pid: int | None = None


@dataclass(frozen=True)
class PciDevice(_ToDict):
    bus_id: str  # "0000:00:06.0"
    device_id: str  # "0x2335" (H200)
    pci_class: str  # "0x030200": 0x03xxxx is a display controller, i.e. a GPU
    driver: str | None = None  # kernel driver bound: "nvidia", "nouveau", "vfio-pci", None

    @property
    def is_gpu(self) -> bool:
        return self.pci_class.startswith("0x03")


@dataclass(frozen=True)
class FileState(_ToDict):
    mode: int
    sha256: str


@dataclass(frozen=True)
class ContainerdConfig(_ToDict):
    """What k3s wrote into its generated containerd config.toml."""

    runtimes: list[str] = field(default_factory=list)  # "runc", "nvidia", "nvidia-cdi", ...
    cni_bin_dir: str | None = None


@dataclass(frozen=True)
class InterfaceAddress(_ToDict):
    """One line of `ip -o addr show`: an address a socket on this host can bind."""

    interface: str  # "eth0" (an IPv4 label such as "eth0:1" is dropped)
    address: str  # "10.0.0.5", "fd00::5"
    prefix: int  # 24: the on-link network is address/prefix
    scope: str = "global"  # "global", "link", "host"
    flags: list[str] = field(default_factory=list)  # "secondary", "dynamic", "deprecated", "tentative", ...


@dataclass(frozen=True)
class Route(_ToDict):
    """One route of the main table (`ip route show table main`, both families)."""

    destination: str  # "default" or "10.0.0.0/24"
    family: int = 4  # 4 or 6 (a "default" line does not say)
    interface: str | None = None  # dev
    gateway: str | None = None  # via
    source: str | None = None  # src: the address the kernel picks for traffic on this route
    kind: str = "unicast"  # "unicast", "unreachable", "blackhole", "prohibit", "local", ...
    metric: int = 0


@dataclass(frozen=True)
class MachineKind(_ToDict):
    """Whether the machine is a container, and whether it has what k3s needs from the kernel
    (bootstrap.checks.machine_kind judges). None: the probe could not tell."""

    container: str | None = None  # `systemd-detect-virt --container`: "none", "docker", "lxc", "systemd-nspawn"...
    markers: list[str] = field(default_factory=list)  # "/.dockerenv", "/run/.containerenv": present
    cgroup: str | None = None  # "v2", "v1" (mounted at /sys/fs/cgroup)
    # "all": every cgroup mount is read-write; "none": none is (docker mounts them read-only);
    # "some": v1 controllers read-only beside a writable name=systemd (systemd-nspawn on a v1 host)
    cgroup_writable: str | None = None
    read_only: list[str] = field(default_factory=list)  # the read-only cgroup mounts ("memory", "cpu"; "/" for v2)
    netns: bool | None = None  # a network namespace could be made (`unshare -n`, as root)
    netfilter: str | None = None  # "ok", "denied" (iptables/nft refused, as root), "missing" (neither installed)


@dataclass(frozen=True)
class HostFacts(_ToDict):
    hostname: str | None = None
    machine_id: str | None = None  # /etc/machine-id, as kubelet reports it in its Node's nodeInfo
    os_id: str | None = None  # "ubuntu", "debian"
    os_version_id: str | None = None  # "24.04", "12"
    os_pretty: str | None = None
    arch: str | None = None  # "amd64", "arm64", else `uname -m` as is
    kernel: str | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    swap_mib: int | None = None
    # Keyed by the path asked about ("/", "/var/lib/rancher"); measured on the nearest
    # existing parent, since /var/lib/rancher does not exist before k3s is installed.
    disk_free_gib: dict[str, float] = field(default_factory=dict)
    has_systemd: bool = False
    init_process: str | None = None  # comm of PID 1
    machine: MachineKind | None = None  # container or not, and what k3s needs; None: not probed
    probe_uid: int | None = None  # 0 when probed as root (process names fully visible)
    sudo_ok: bool | None = None  # `sudo -n` works (or we are root); None when not probed
    sudo_error: str | None = None
    package_manager: str | None = None  # "apt", "dnf", "yum", "zypper", "apk"
    commands: dict[str, str] = field(default_factory=dict)  # found tools -> path
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None  # nvidia-smi present but failing
    driver_version: str | None = None
    cuda_version: str | None = None  # highest CUDA the driver supports, "13.0"
    mig_profiles: list[MigProfile] = field(default_factory=list)
    rdma: list[RdmaDevice] = field(default_factory=list)
    nvidia_pci: list[PciDevice] = field(default_factory=list)
    files: dict[str, FileState] = field(default_factory=dict)  # managed paths that exist
    modules: list[str] = field(default_factory=list)  # of br_netfilter, overlay: the loaded ones
    sysctls: dict[str, str] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)  # installed: name -> version
    held_packages: list[str] = field(default_factory=list)
    containerd: ContainerdConfig | None = None
    manifest: dict = field(default_factory=dict)  # what the tool recorded installing here
    # Why the host's manifest was refused (wrong types, a null cluster id, not JSON, too big or
    # too deep); `manifest` is then {} and whose host this is cannot be told (rules.ownership).
    manifest_error: str | None = None
    images: tuple | None = None  # image references in k3s's containerd; None: k3s not running
    k3s: K3sInstall | None = None
    listening_ports: list[ListeningPort] = field(default_factory=list)
    # Every address on the host's interfaces (None: `ip` could not tell) and its routes.
    addresses: list[InterfaceAddress] | None = None
    routes: list[Route] = field(default_factory=list)
    mtus: dict[str, int] = field(default_factory=dict)  # interface -> its MTU (`ip -o link show`)
    # The WireGuard kernel module: "loaded", "builtin", "module" (on disk, loaded on first
    # use), "missing"; None: not probed.
    wireguard: str | None = None
    # The host's clock (seconds since the epoch) at the end of the probe, and its offset
    # from the tool's clock when the output arrived (host minus tool; None: unknown).
    clock: float | None = None
    clock_offset_s: float | None = None
    # GPU health (bootstrap.host.facts.gpu_health), probed unless gpu.health is off: per GPU, and
    # the kernel's Xid reports since boot (None: not probed).
    gpu_health: list | None = None
    xids: list | None = None
    boot_id: str | None = None

    @property
    def has_wireguard(self) -> bool | None:
        return None if self.wireguard is None else self.wireguard != "missing"

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def gpu_hardware(self) -> bool:
        """NVIDIA GPUs are in the machine, whether or not a driver drives them."""
        return self.has_gpu or self.gpu_error is not None or any(d.is_gpu for d in self.nvidia_pci)

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles) or any(g.mig_capable for g in self.gpus)

    @property
    def tcp_ports(self) -> set[int]:
        return {p.port for p in self.listening_ports if p.proto == "tcp"}

    @property
    def udp_ports(self) -> set[int]:
        return {p.port for p in self.listening_ports if p.proto == "udp"}

    def interface_of(self, address: str) -> str | None:
        """The interface holding `address` (None: no interface does, or unknown)."""
        return next((a.interface for a in self.addresses or [] if a.address == address), None)

    def listener(self, port: int, proto: str = "tcp") -> ListeningPort | None:
        """A socket bound to `port`, e.g. to name the process holding 6443 (IPv4 and IPv6
        sockets of one port are separate entries: prefer one whose owner is known)."""
        bound = [p for p in self.listening_ports if p.port == port and p.proto == proto]
        return next((p for p in bound if p.process), bound[0] if bound else None)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["has_gpu"] = self.has_gpu
        data["gpu_hardware"] = self.gpu_hardware
        return data
