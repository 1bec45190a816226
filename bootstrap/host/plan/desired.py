"""What each host should hold: the host parts' files, packages and downloads, for one node.

Pure: inventory in, specs out. The parts (bootstrap.host.parts) own the paths and contents;
this puts together what one node gets from each of them.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, field

from bootstrap.cluster.gate_rules import may_hold
from bootstrap.host.release import K3sArtifacts
from bootstrap.host.parts import k3s_binary, k3s_images, k3s_service, kernel, packages, registries
from bootstrap.host.parts.base import FileSpec, text_file
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.host.images import prepull_images
from bootstrap.inventory.model import Inventory, Node


@dataclass
class Desired:
    files: list[FileSpec] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)  # apt packages
    toolkit_source: str | None = None  # apt line for nvidia-container-toolkit, when needed
    k3s_download: K3sArtifacts | None = None  # online install: fetch on the host
    gpu: bool = False
    prepull: list[str] = field(default_factory=list)  # images this node should hold before jobs start
    k3s_version: str | None = None  # the k3s this node is to run (None: an air-gap binary of unknown version)
    sysctls: dict[str, str] = field(default_factory=dict)  # kernel settings k3s needs here

    def paths(self) -> list[str]:
        return [f.path for f in self.files]


def desired_state(inventory: Inventory, node: Node, tokens: JoinTokens, artifacts: K3sArtifacts,
                  gpu: bool, driver_packages: list[str], join_via: Node | None = None,
                  embedded_mirror: bool = False, os_release: tuple[str | None, str | None] = (None, None),
                  current_config_sha: str | None = None) -> Desired:
    """`os_release`: the host's (ID, VERSION_ID), for the images named after the OS (the GPU
    Operator's driver). `current_config_sha`: the sha256 of the host's config.yaml now."""
    desired = Desired(gpu=gpu, sysctls=kernel.sysctls(ipv6_pods=pods_have_ipv6(inventory)),
                      k3s_version=artifacts.version)
    host_toolkit = gpu and packages.needs_host_toolkit(inventory)
    config = gated_config(inventory, node, tokens, join_via, embedded_mirror, host_toolkit,
                          gpu and inventory.gpu.gate.enabled and may_hold(node), current_config_sha)
    desired.files += kernel.files(desired.sysctls) + k3s_service.files(inventory, node, config, k3s_images.BEFORE_START)
    desired.files += [f for f in [registries.file(inventory, embedded_mirror), k3s_binary.file(artifacts)] if f]
    desired.files += k3s_images.files(artifacts)
    if artifacts.binary is None:
        desired.k3s_download = artifacts
    desired.packages = packages.component_packages(inventory, gpu) + list(driver_packages)
    if gpu:
        desired.prepull = prepull_images(inventory, *os_release)
        desired.files += k3s_images.pulls_record(desired.prepull)
    if host_toolkit:
        desired.toolkit_source = packages.toolkit_source_line(inventory, artifacts.arch)
        desired.files.append(text_file(packages.TOOLKIT_SOURCE, desired.toolkit_source + "\n"))
    return desired


def gated_config(inventory: Inventory, node: Node, tokens: JoinTokens, join_via, embedded_mirror: bool,
                 host_toolkit: bool, gate: bool, current_config_sha: str | None) -> str:
    """The node's config.yaml, with the acceptance gate's node-taint when `gate` (a GPU agent:
    bootstrap.cluster.gate_rules.may_hold). A node whose config.yaml is exactly the one it
    would get without the gate (built before the gate) keeps it: a new config.yaml restarts
    k3s, and k3s would not taint a registered node anyway; the cluster side taints that node
    through the API (bootstrap.cluster.gate.nodes_to_judge, run_gate)."""
    def render(gated: bool) -> str:
        return k3sconfig.render(k3sconfig.node_config(inventory, node, tokens, join_via, embedded_mirror,
                                                      nvidia_default_runtime=host_toolkit, gated=gated))

    if not gate:
        return render(False)
    ungated = render(False)
    if current_config_sha is not None and hashlib.sha256(ungated.encode()).hexdigest() == current_config_sha:
        return ungated
    return render(True)


def pods_have_ipv6(inventory: Inventory) -> bool:
    """An IPv6 pod network (k3s.cluster_cidr), the one case where hosts must forward IPv6."""
    cidr = inventory.k3s.cluster_cidr
    return bool(cidr) and ipaddress.ip_network(cidr, strict=False).version == 6


def needs_host_toolkit_runtime(desired: Desired) -> bool:
    """The host toolkit is installed, so k3s must have detected the `nvidia` runtime."""
    return desired.toolkit_source is not None
