"""RDMA for pods: Multus + whereabouts (rke2-multus chart), the Mellanox RDMA shared device
plugin (our manifests), and one NetworkAttachmentDefinition per RDMA netdev."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
from dataclasses import dataclass

import yaml

from bootstrap import templates
from bootstrap.cluster.components import versions
from bootstrap.host.parts.k3s_service import K3S_DATA_DIR
from bootstrap.cluster.components.release import ComponentError, Release
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.kube import nad_name  # one derivation, shared with the inventory check
from bootstrap.inventory.model import Component, Inventory, Node

NAMESPACE = "kube-system"
NAD_NAMESPACE = "default"
CONFIGMAP = "rdma-devices"
# k3s's CNI config dir (the kubelet's --cni-conf-dir under k3s); the bin dir is read from
# containerd's generated config on the servers, since it moved between k3s releases.
K3S_CNI_CONF_DIR = f"{K3S_DATA_DIR}/agent/etc/cni/net.d"
DEFAULT_SUBNET = "172.29.0.0/16"  # used when network.rdma.subnet is not given
RDMA_HCA_MAX = 63  # pods that may share one HCA; the value NVIDIA's Network Operator examples use
PLUGIN_UPDATE_INTERVAL = 300  # seconds between device rescans (upstream example value)
INFINIBAND, ETHERNET = "InfiniBand", "Ethernet"  # as sysfs spells ports/N/link_layer
# Multus, whereabouts and the RDMA device plugin run only where this label is "true". The
# tool sets it on every node, "false" where the node's own answers do not fit the cluster's
# RDMA settings (node_problems). Under node-restriction.kubernetes.io/ so that a kubelet
# cannot set it on its own Node (see bootstrap.cluster.components.trust).
RDMA_LABEL = "node-restriction.kubernetes.io/bootstrap.k3s-rdma"
RDMA_NODES = {RDMA_LABEL: "true"}
SHOWN = 120  # characters of a host's answer quoted in a warning


@dataclass(frozen=True)
class CniDirs:
    bin_dir: str
    conf_dir: str = K3S_CNI_CONF_DIR


def _bin_dir(facts: HostFacts | None) -> str | None:
    return facts.containerd.cni_bin_dir if facts and facts.containerd else None


def cni_dirs(inventory: Inventory, facts_by_node: dict[str, HostFacts], conf_dir: str = K3S_CNI_CONF_DIR) -> CniDirs:
    """The CNI bin dir k3s's containerd uses: one chart value for every node, so it is the
    first server's answer (inventory order), never an agent's: whoever runs a server holds
    the cluster anyway. A node that reports another is named by node_problems and left out
    of RDMA; it never stops the others."""
    for server in inventory.servers:
        if found := _bin_dir(facts_by_node.get(server.name)):
            return CniDirs(found, conf_dir)
    raise ComponentError("the CNI bin dir is unknown: no server's containerd config was read",
                         "run `bootstrap facts` after k3s is installed on the servers")


# --- Multus + whereabouts -------------------------------------------------------------

def multus_values(dirs: CniDirs) -> dict:
    # Keys as in the k3s docs (networking/multus-ipams); multusAutoconfigDir must point at
    # k3s's dir too, so Multus finds flannel's config to delegate to. Thin Multus only: the
    # thick plugin's DaemonSet mounts /etc/cni/net.d and /opt/cni/bin whatever the values
    # say (rancher/rke2-charts charts/rke2-multus/rke2-multus/v4.3.009/templates/
    # daemonSet-thick.yaml, hostPath volumes cni and cnibin), and k3s keeps its CNI config and
    # binaries under /var/lib/rancher/k3s: thick Multus would never see flannel.
    return {
        "config": {"cni_conf": {
            "confDir": dirs.conf_dir,
            "binDir": dirs.bin_dir,
            "kubeconfig": f"{dirs.conf_dir}/multus.d/multus.kubeconfig",
            "multusAutoconfigDir": dirs.conf_dir,
        }},
        "rke2-whereabouts": {"enabled": True, "fullnameOverride": "whereabouts",
                             "cniConf": {"confDir": dirs.conf_dir, "binDir": dirs.bin_dir},
                             "nodeSelector": dict(RDMA_NODES)},
        "thickPlugin": {"enabled": False},
        # Off the nodes left out of RDMA: on one whose containerd reads another bin dir,
        # 00-multus.conf would name a binary it cannot find and no pod there would start.
        # The thin DaemonSet's selector is labels.nodeSelector (rke2-multus
        # templates/daemonSet.yaml); Helm merges it with the chart's kubernetes.io/os.
        "labels": {"nodeSelector": dict(RDMA_NODES)},
    }


def multus_releases(inventory: Inventory, dirs: CniDirs) -> list[Release]:
    src = versions.source(inventory, Component.MULTUS)
    main = Release("multus", NAMESPACE, src.chart, src.repo, src.version, multus_values(dirs), src.archive)
    crd = versions.multus_crd_source(src)
    if crd is None:
        return [main]
    # The CRD chart renders the whereabouts CRDs only when told whereabouts is on (its
    # templates test `rke2-whereabouts.enabled`, e.g. rke2-multus-crd 4.3.016).
    crds = Release("multus-crd", NAMESPACE, crd.chart, crd.repo, crd.version, {"rke2-whereabouts": {"enabled": True}},
                   crd.archive)
    return [crds, main]


# --- the RDMA shared device plugin ------------------------------------------------------

def resource_parts(inventory: Inventory) -> tuple[str, str]:
    prefix, _, name = inventory.network.rdma.resource_name.partition("/")
    return prefix, name


def resource_key(inventory: Inventory) -> str:
    """What pods request in resources.limits, e.g. `rdma/rdma_shared_device_a: 1`."""
    return "/".join(resource_parts(inventory))


def interfaces(inventory: Inventory, gpu: list[Node]) -> list[str]:
    """Every RDMA netdev any GPU node uses, in inventory order (a node may name its own)."""
    rdma = inventory.network.rdma
    names: list[str] = []
    per_node = [n.rdma_interfaces if n.rdma_interfaces is not None else rdma.interfaces
                for n in gpu] or [rdma.interfaces]
    for wanted in per_node:
        names += [i for i in wanted if i not in names]
    return names


def plugin_config(inventory: Inventory, gpu: list[Node]) -> dict:
    prefix, name = resource_parts(inventory)
    entry: dict = {"resourceName": name, "rdmaHcaMax": RDMA_HCA_MAX,
                   "selectors": {"ifNames": interfaces(inventory, gpu)}}
    if prefix != "rdma":  # the plugin's default prefix
        entry["resourcePrefix"] = prefix
    return {"periodicUpdateInterval": PLUGIN_UPDATE_INTERVAL, "configList": [entry]}


def plugin_manifests(inventory: Inventory, gpu: list[Node]) -> list[dict]:
    config = json.dumps(plugin_config(inventory, gpu), indent=2) + "\n"
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE}, "data": {"config.json": config}}
    src = versions.source(inventory, Component.RDMA_SHARED_DEVICE_PLUGIN)
    daemonset = yaml.safe_load(templates.render(
        "components/rdma-shared-dev-plugin.yaml.j2", namespace=NAMESPACE, configmap=CONFIGMAP,
        image=f"{src.image}:{src.version}", label=RDMA_LABEL, config_sha256=hashlib.sha256(config.encode()).hexdigest()))
    return [configmap, daemonset]


# --- NetworkAttachmentDefinitions --------------------------------------------------------

def link_layer(inventory: Inventory, interface: str) -> str:
    """An RDMA interface's link type, one for the cluster (its NetworkAttachmentDefinition):
    network.rdma.link_layer when the inventory names it, else its name, as the kernel and
    udev give it: IPoIB netdevs are ib* (linux drivers/infiniband/ulp/ipoib/ipoib_main.c
    names them "ib%d"; systemd src/udev/udev-builtin-net_id.c gives ARPHRD_INFINIBAND the
    prefix "ib"), RoCE ones eth* or en*. Never a host's answer: one node claiming InfiniBand
    would turn every node's pods to host-device (node_problems names it instead)."""
    named = (inventory.network.rdma.link_layer or {}).get(interface)
    if named:
        return INFINIBAND if named == "infiniband" else ETHERNET
    return INFINIBAND if interface.startswith("ib") else ETHERNET


def node_problems(inventory: Inventory, facts_by_node: dict[str, HostFacts]) -> dict[str, str]:
    """Per node, why its own answers do not fit the cluster's RDMA settings (its containerd's
    CNI bin dir, its interfaces' link types): such a node is left out of RDMA (RDMA_LABEL
    "false"), and only it. Nodes whose facts are missing are not judged here."""
    if not inventory.network.rdma:
        return {}
    dirs = _cluster_bin_dir(inventory, facts_by_node)
    problems = {}
    for node in inventory.nodes:
        facts = facts_by_node.get(node.name)
        if not facts:
            continue
        why = []
        if dirs and (own := _bin_dir(facts)) and own != dirs:
            why.append(f"its containerd uses the CNI bin dir {own[:SHOWN]}, the cluster's (the servers') is {dirs}")
        wanted = node.rdma_interfaces if node.rdma_interfaces is not None else inventory.network.rdma.interfaces
        for interface in wanted:
            own_layers = sorted({d.link_layer for d in facts.rdma if interface in d.netdevs and d.link_layer})
            if own_layers and own_layers != [cluster_layer := link_layer(inventory, interface)]:
                why.append(f"it reports {interface} as {'/'.join(own_layers)[:SHOWN]}, the cluster has it as "
                           f"{cluster_layer}")
        if why:
            problems[node.name] = "; ".join(why)
    return problems


def _cluster_bin_dir(inventory: Inventory, facts_by_node: dict[str, HostFacts]) -> str | None:
    try:
        return cni_dirs(inventory, facts_by_node).bin_dir
    except ComponentError:
        return None


def rdma_labels(inventory: Inventory, facts_by_node: dict[str, HostFacts]) -> dict[str, dict[str, str]]:
    """RDMA_LABEL on every node once network.rdma is set: "false" on those node_problems names."""
    if not inventory.network.rdma:
        return {}
    left_out = node_problems(inventory, facts_by_node)
    return {n.name: {RDMA_LABEL: "false" if n.name in left_out else "true"} for n in inventory.nodes}


def warning_lines(inventory: Inventory, facts_by_node: dict[str, HostFacts]) -> list[str]:
    """For `up`'s output: each node left out of RDMA, and why (the others go on)."""
    return [f"rdma: {name} is left out of RDMA (no Multus or RDMA device plugin there): {why}; "
            "fix that host (same k3s as the servers, or network.rdma.link_layer / its own rdma_interfaces)"
            for name, why in node_problems(inventory, facts_by_node).items()]


def subnets(subnet: str, count: int) -> list[str]:
    """One range per interface (rail), cut evenly from the inventory's subnet."""
    network = ipaddress.ip_network(subnet, strict=False)
    extra_bits = math.ceil(math.log2(count)) if count > 1 else 0
    if network.prefixlen + extra_bits > network.max_prefixlen - 2:
        raise ComponentError(f"network.rdma.subnet {subnet} is too small for {count} RDMA interfaces",
                             "give a larger subnet, e.g. a /16")
    return [str(n) for n in list(network.subnets(prefixlen_diff=extra_bits))[:count]]


def network_attachment(interface: str, ip_range: str, link_layer: str | None, dirs: CniDirs) -> dict:
    name = nad_name(interface)
    ipam = {
        "type": "whereabouts",
        "range": ip_range,
        # whereabouts otherwise looks under /etc/cni/net.d, which k3s does not use.
        "configuration_path": f"{dirs.conf_dir}/whereabouts.d/whereabouts.conf",
        "kubernetes": {"kubeconfig": f"{dirs.conf_dir}/whereabouts.d/whereabouts.kubeconfig"},
    }
    if link_layer == "InfiniBand":
        # macvlan cannot ride on IPoIB; host-device moves the netdev into the pod (one pod
        # per node at a time), with the rdma device plugin still sharing the HCA.
        cni = {"cniVersion": "1.0.0", "name": name, "type": "host-device", "device": interface, "ipam": ipam}
    else:
        cni = {"cniVersion": "1.0.0", "name": name, "type": "macvlan", "master": interface,
               "mode": "bridge", "ipam": ipam}
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": NAD_NAMESPACE},
            "spec": {"config": json.dumps(cni, indent=2)}}


def network_attachments(inventory: Inventory, dirs: CniDirs, gpu: list[Node]) -> list[dict]:
    names = interfaces(inventory, gpu)
    ranges = subnets(inventory.network.rdma.subnet or DEFAULT_SUBNET, len(names))
    return [network_attachment(i, r, link_layer(inventory, i), dirs) for i, r in zip(names, ranges)]


def manifests(inventory: Inventory, dirs: CniDirs, gpu: list[Node]) -> list[dict]:
    """`gpu`: the run's GPU nodes (bootstrap.topology)."""
    return plugin_manifests(inventory, gpu) + network_attachments(inventory, dirs, gpu)
