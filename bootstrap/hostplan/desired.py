"""What each host should hold: files, packages, kernel settings. Pure: inventory in, specs out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap import templates
from bootstrap.artifacts import K3sArtifacts
from bootstrap.hostplan import k3sconfig
from bootstrap.hostplan.registries import registries_yaml
from bootstrap.images import prepull_images
from bootstrap.inventory.model import Inventory, Node

K3S_BINARY = "/usr/local/bin/k3s"
CONFIG = "/etc/rancher/k3s/config.yaml"
REGISTRIES = "/etc/rancher/k3s/registries.yaml"
IMAGES_DIR = "/var/lib/rancher/k3s/agent/images"
MODULES_FILE = "/etc/modules-load.d/bootstrap-k3s.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-bootstrap-k3s.conf"
TOOLKIT_SOURCE = "/etc/apt/sources.list.d/bootstrap-nvidia-container-toolkit.list"
TOOLKIT_KEYRING = "/usr/share/keyrings/bootstrap-nvidia-container-toolkit.asc"
NVIDIA_REPO = "https://nvidia.github.io/libnvidia-container"
MANIFEST = "/var/lib/bootstrap/manifest.json"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv6.conf.all.forwarding": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}
MODULES = ("br_netfilter", "overlay")


def unit_name(node: Node) -> str:
    return "k3s" if node.role == "server" else "k3s-agent"


def unit_path(node: Node) -> str:
    return unit_path_for(unit_name(node))


def unit_path_for(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.service"


@dataclass(frozen=True)
class FileSpec:
    path: str
    mode: int
    sha256: str
    content: bytes | None = None  # small files rendered here
    local: Path | None = None  # large files uploaded from the control machine
    secret: bool = False  # never shown, staged in a private directory
    restarts_k3s: bool = False
    image_archive: bool = False  # an image archive for k3s's containerd


def text_file(path: str, text: str, mode: int = 0o644, **kw) -> FileSpec:
    data = text.encode()
    return FileSpec(path, mode, hashlib.sha256(data).hexdigest(), content=data, **kw)


@dataclass
class Desired:
    files: list[FileSpec] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)  # apt packages
    toolkit_source: str | None = None  # apt line for nvidia-container-toolkit, when needed
    k3s_download: K3sArtifacts | None = None  # online install: fetch on the host
    gpu: bool = False
    prepull: list[str] = field(default_factory=list)  # images this node should hold before jobs start

    def paths(self) -> list[str]:
        return [f.path for f in self.files]


def toolkit_source_line(inventory: Inventory, arch: str) -> str:
    if inventory.gpu.container_toolkit.apt_source:
        return inventory.gpu.container_toolkit.apt_source
    return f"deb [signed-by={TOOLKIT_KEYRING}] {NVIDIA_REPO}/stable/deb/{arch} /"


def needs_host_toolkit(inventory: Inventory) -> bool:
    # With driver: operator the GPU Operator installs its own toolkit.
    return inventory.gpu.driver != "operator"


def component_packages(inventory: Inventory, gpu: bool) -> list[str]:
    packages = []
    if inventory.storage.default == "nfs" or inventory.storage.nfs:
        packages.append("nfs-common")
    if inventory.storage.default == "longhorn":
        packages.append("open-iscsi")
    if inventory.network.rdma and gpu:
        packages.append("rdma-core")
    return packages


def desired_state(inventory: Inventory, node: Node, token: str, artifacts: K3sArtifacts,
                  gpu: bool, driver_packages: list[str], join_via: Node | None = None,
                  embedded_mirror: bool = False) -> Desired:
    desired = Desired(gpu=gpu)
    config = k3sconfig.render(k3sconfig.node_config(inventory, node, token, join_via, embedded_mirror))
    desired.files += [
        text_file(MODULES_FILE, templates.render("host/modules-k3s.conf")),
        text_file(SYSCTL_FILE, templates.render("host/sysctl-k3s.conf.j2", sysctls=SYSCTLS)),
        text_file(unit_path(node), templates.render("host/k3s.service.j2", cluster=inventory.cluster,
                                                    mode="server" if node.role == "server" else "agent",
                                                    binary=K3S_BINARY), restarts_k3s=True),
        text_file(CONFIG, config, 0o600, secret=True, restarts_k3s=True),
    ]
    registries = registries_yaml(inventory, embedded_mirror)
    if registries is not None:
        desired.files.append(text_file(REGISTRIES, registries, 0o600, secret=True, restarts_k3s=True))
    if artifacts.binary is not None:
        desired.files.append(FileSpec(K3S_BINARY, 0o755, artifacts.binary.sha256, local=artifacts.binary.path,
                                      restarts_k3s=True))
        for archive in artifacts.images:
            # k3s imports these when it starts; a running node imports a new one at once
            # (see plan_host), so adding images restarts nothing.
            desired.files.append(FileSpec(f"{IMAGES_DIR}/{archive.path.name}", 0o644, archive.sha256,
                                          local=archive.path, image_archive=True))
    else:
        desired.k3s_download = artifacts
    desired.packages = component_packages(inventory, gpu) + list(driver_packages)
    if gpu:
        desired.prepull = prepull_images(inventory)
    if gpu and needs_host_toolkit(inventory):
        desired.toolkit_source = toolkit_source_line(inventory, artifacts.arch)
        desired.files.append(text_file(TOOLKIT_SOURCE, desired.toolkit_source + "\n"))
    return desired


def needs_host_toolkit_runtime(desired: Desired) -> bool:
    """The host toolkit is installed, so k3s must have detected the `nvidia` runtime."""
    return desired.toolkit_source is not None
