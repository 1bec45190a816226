"""How each GPU node shares its GPUs, as the GPU Operator wants it: named device-plugin
configs (time-slicing, MPS), mig-parted layouts, and the node labels that pick them.

Formats follow NVIDIA/k8s-device-plugin README v0.20.0 (time-slicing / MPS blocks), the
GPU Operator docs' time-slicing ConfigMaps, and mig-parted v0.15.0 `examples/config.yaml`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import yaml

from bootstrap.cluster.components.release import canonical_json
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory, Mig, Node, Sharing
from bootstrap.checks import mig as mig_rules

DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"
MIG_LABEL = "nvidia.com/mig.config"
MIG_DISABLED = "all-disabled"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
GPU_RESOURCE = "nvidia.com/gpu"


def mig_strategy(inventory: Inventory) -> str:
    # The loader guarantees one strategy for the whole cluster; it is one chart value.
    sharings = [inventory.gpu.sharing] + [n.gpu.sharing for n in inventory.nodes if n.gpu.sharing]
    return next((s.mig.strategy for s in sharings if s and s.mig), "single")


# --- device plugin (time-slicing, MPS) -------------------------------------------------

def device_plugin_key(sharing: Sharing, strategy: str) -> str:
    """One name per distinct setup, readable in `kubectl get node --show-labels`."""
    if sharing.mig:
        return f"mig-{strategy}"
    if sharing.mps:
        return f"mps-{sharing.mps.replicas}"
    if sharing.time_slicing:
        ts = sharing.time_slicing
        return f"ts-{ts.replicas}" + ("-renamed" if ts.rename_by_default else "")
    return "none"


def device_plugin_config(sharing: Sharing, strategy: str) -> dict:
    # A MIG node's plugin must use the cluster's MIG strategy; every other node has none.
    config: dict = {"version": "v1", "flags": {"migStrategy": strategy if sharing.mig else "none"}}
    resources = None
    if sharing.mps and not sharing.mig:
        resources = [{"name": GPU_RESOURCE, "replicas": sharing.mps.replicas}]
        config["sharing"] = {"mps": {"resources": resources}}
    elif sharing.time_slicing and not sharing.mig:
        ts = sharing.time_slicing
        resources = [{"name": GPU_RESOURCE, "replicas": ts.replicas}]
        config["sharing"] = {"timeSlicing": {"renameByDefault": ts.rename_by_default, "resources": resources}}
    return config


def _uses_device_plugin_config(sharings: list[Sharing]) -> bool:
    # MIG alone needs no named config: the operator passes mig.strategy to the plugin.
    return any((s.time_slicing or s.mps) and not s.mig for s in sharings)


def device_plugin_configs(inventory: Inventory, gpu: list[Node]) -> dict[str, str] | None:
    """Config name -> the plugin's config file (YAML), or None when no node time-slices or uses MPS."""
    sharings = [inventory.sharing_for(n) for n in gpu]
    if not _uses_device_plugin_config(sharings):
        return None
    strategy = mig_strategy(inventory)
    configs = {}
    for sharing in [inventory.gpu.sharing] + sharings:
        configs[device_plugin_key(sharing, strategy)] = yaml.safe_dump(
            device_plugin_config(sharing, strategy), sort_keys=False)
    return configs


def default_device_plugin_key(inventory: Inventory) -> str:
    return device_plugin_key(inventory.gpu.sharing, mig_strategy(inventory))


# --- MIG (mig-parted layouts) --------------------------------------------------------

def mig_config_name(mig: Mig) -> str:
    if mig.profiles:
        # Same profiles, same name: nodes that ask alike share one entry.
        digest = hashlib.sha256(canonical_json(mig.profiles).encode()).hexdigest()
        return f"custom-{digest[:8]}"
    return mig.layout or MIG_DISABLED


class MigUnbuilt(ValueError):
    """A node's named MIG layout cannot be spelled out from its own profile table."""


def _mig_entry(node: Node, mig: Mig, facts: HostFacts | None) -> list[dict]:
    if mig.profiles:
        return [{"devices": "all", "mig-enabled": True, "mig-devices": dict(sorted(mig.profiles.items()))}]
    if mig.layout == MIG_DISABLED:
        return [{"devices": "all", "mig-enabled": False}]
    if mig.layout == "all-enabled":
        return [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    # A named layout inside our own config: mig-parted no longer sees its built-in (or the
    # operator's per-node generated) layouts, so spell it out from the node's profile table.
    table = mig_rules.table_for_gpu(facts.mig_profiles if facts else [])
    if not table:
        raise MigUnbuilt(f"MIG layout {mig.layout} on {node.name} must be spelled out (another node uses "
                         "MIG profiles), but no MIG profile table is known for this node; run `bootstrap facts` "
                         "on it, or give it profiles: {...} instead of a layout")
    try:
        wanted = mig_rules.requested(mig, table)
    except mig_rules.MigMisfit as exc:
        raise MigUnbuilt(f"MIG layout {mig.layout} on {node.name}: {exc}") from None
    return [{"devices": "all", "mig-enabled": True, "mig-devices": dict(sorted(wanted.items()))}]


@dataclass(frozen=True)
class MigPlan:
    """Our own mig-parted config (None: the operator's own layouts), the config each MIG node's
    label names, and the nodes whose layout could not be spelled out, each with why."""

    config: dict | None
    names: dict[str, str]  # node -> its nvidia.com/mig.config
    failed: dict[str, str]


def _spelled_name(mig: Mig, entry: list[dict]) -> str:
    """A named layout spelled out from a node's own table is named by what it holds as well:
    nodes whose tables differ (another GPU model, or a host that reports a made-up table) get
    entries of their own, so one node's table never changes another's config or label."""
    if mig.profiles or mig.layout in (MIG_DISABLED, "all-enabled"):
        return mig_config_name(mig)
    return f"{mig.layout}-{hashlib.sha256(canonical_json(entry).encode()).hexdigest()[:8]}"


def mig_plan(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> MigPlan:
    """Our own mig-parted config is needed only when some node asks for `profiles:`. A node
    whose layout cannot be spelled out from its own table is that node's failure (named in
    `failed`, left out of the config; the gate keeps it gated), never the cluster's."""
    mig_nodes = [(n, m) for n in gpu if (m := inventory.sharing_for(n).mig)]
    if not any(m.profiles for _, m in mig_nodes):
        return MigPlan(None, {n.name: mig_config_name(m) for n, m in mig_nodes}, {})
    configs: dict[str, list] = {MIG_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    names, failed = {}, {}
    for node, mig in mig_nodes:
        try:
            entry = _mig_entry(node, mig, facts_by_node.get(node.name))
        except MigUnbuilt as exc:
            names[node.name], failed[node.name] = mig_config_name(mig), str(exc)
            continue
        names[node.name] = _spelled_name(mig, entry)
        configs[names[node.name]] = entry
    return MigPlan({"version": "v1", "mig-configs": configs}, names, failed)


def mig_parted_config(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> dict | None:
    """Our own mig-parted config, needed only when some node asks for `profiles:`; else
    None and the operator's own layouts (generated per node since v26.3) are used."""
    return mig_plan(inventory, facts_by_node, gpu).config


# --- node labels ------------------------------------------------------------------------

def sharing_labels(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> dict[str, dict[str, str]]:
    strategy = mig_strategy(inventory)
    with_plugin_config = device_plugin_configs(inventory, gpu) is not None
    mig_names = mig_plan(inventory, facts_by_node, gpu).names
    labels: dict[str, dict[str, str]] = {}
    for node in gpu:
        sharing, facts = inventory.sharing_for(node), facts_by_node.get(node.name) or HostFacts()
        mine = labels.setdefault(node.name, {})
        if with_plugin_config:
            mine[DEVICE_PLUGIN_LABEL] = device_plugin_key(sharing, strategy)
        if sharing.mig:
            mine[MIG_LABEL] = mig_names[node.name]
            mine[MIG_STRATEGY_LABEL] = strategy  # what GFD would set; known before it runs
        elif facts.mig_capable:
            # Explicit, so a node taken off MIG in the inventory is switched back.
            mine[MIG_LABEL] = MIG_DISABLED
    return labels
