"""NVIDIA GPU Operator release values for k3s (checked against the chart's v26.7.0 values.yaml)."""

from __future__ import annotations

import yaml

from bootstrap.cluster.components import gpu_sharing, trust, versions
from bootstrap.cluster.components.release import Release
from bootstrap.cluster.gate_rules import GATE_TOLERATION
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.k3s_service import CONTAINERD_SOCKET
from bootstrap.host.parts.packages import needs_host_toolkit
from bootstrap.inventory.model import Component, Inventory, Node

NAMESPACE = "gpu-operator"
RELEASE = "gpu-operator"  # the Helm release name (apply.py restarts its device plugin)
DEVICE_PLUGIN_CONFIGMAP = "bootstrap-device-plugin-config"
MIG_PARTED_CONFIGMAP = "bootstrap-mig-parted-config"


# The toolkit's containerd config source: the file only, never `containerd config dump`.
RUNTIME_CONFIG_SOURCE = "file"


def toolkit_env() -> list[dict]:
    """k3s's socket and the file config source, for every operator version and k3s line.

    The socket: the toolkit signals containerd through it. It must not rewrite k3s's
    containerd config: pointing older toolkits (< v25.10) at k3s's config.toml.tmpl replaces
    the template k3s renders its CNI and registry settings from (NVIDIA/gpu-operator issue
    473). k3s finds the runtime the toolkit installs by itself when it renders containerd's
    config (k3s-io/k3s pkg/agent/containerd/nvidia.go, findNvidiaContainerRuntimes:
    /usr/local/nvidia/toolkit/nvidia-container-runtime) and registers the `nvidia`
    RuntimeClass; from v25.10 GPUs reach pods through CDI (the RKE2 docs' recipe, used in k3s
    PR #11065).

    RUNTIME_CONFIG_SOURCE=file: with no CONTAINERD_CONFIG the operator mounts the host's
    /etc/containerd as the toolkit's config folder (NVIDIA/gpu-operator v26.7.0
    controllers/object_controls.go, transformRuntimeConfigAndSocketMounts), and toolkit
    v1.20.0 reads the config it extends from `chroot /host containerd config dump` first, the
    file second (NVIDIA/nvidia-container-toolkit v1.20.0
    cmd/nvidia-ctk-installer/container/runtime/runtime.go, config-source default
    [command, file]; pkg/config/engine/containerd/containerd.go, CommandLineSource). That
    runs whatever `containerd` is on the host's PATH, never k3s's (k3s keeps its own under
    /var/lib/rancher/k3s/data/, with its config in agent/etc/containerd/), so on every k3s
    line alike (containerd 1.7 to v1.31.5, 2.0 from v1.31.6 and v1.32.2, 2.1 to 2.3 later)
    nothing the toolkit reads or writes there is k3s's. A k3s-only host has no such binary:
    the dump fails and the file is read, as with this setting. A host with its own
    containerd 2.x (a Docker install's containerd.io) dumps its config migrated to version
    3 or 4; the toolkit writes /etc/containerd/conf.d/99-nvidia.toml at that version, and
    that containerd then refuses to start ("drop-in config version 4 higher than root
    config version 2", NVIDIA/aicr#1688, fixed there by this setting). With the file as the
    only source the drop-in has the root config's own version (2 when there is none:
    parseVersion). Toolkits before v1.18.0 do not know the variable and ignore it."""
    return [{"name": "CONTAINERD_SOCKET", "value": CONTAINERD_SOCKET},
            {"name": "RUNTIME_CONFIG_SOURCE", "value": RUNTIME_CONFIG_SOURCE}]


DRIVER_UPGRADE_POLICY = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 1,
    "maxUnavailable": 1,
    # GPU pods are evicted by the operator; a drain also moves the node's other pods, with
    # a time-out so that one stuck pod cannot hold the rollout forever.
    "drain": {"enable": True, "force": False, "timeoutSeconds": 300, "deleteEmptyDir": True},
}


# Helm replaces a list value whole: the chart's own tolerations (values.yaml v26.7.0,
# `daemonsets.tolerations` and `node-feature-discovery.worker.tolerations`), plus the gate's.
# The operands (driver, toolkit, device plugin, GFD, DCGM, MIG manager) take
# daemonsets.tolerations; NFD's worker labels the node, without which no operand starts there.
DAEMONSET_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, GATE_TOLERATION]
NFD_WORKER_TOLERATIONS = [
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "value": "", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, GATE_TOLERATION]


def values(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> dict:
    # preinstalled/host: the driver and the container toolkit are on the host already.
    toolkit_in_cluster = not needs_host_toolkit(inventory)
    out: dict = {
        "driver": {"enabled": inventory.gpu.driver == "operator"},
        "toolkit": {"enabled": toolkit_in_cluster},
        "mig": {"strategy": gpu_sharing.mig_strategy(inventory)},
        "migManager": {"config": {"default": gpu_sharing.MIG_DISABLED}},
        # Every operand runs on a GPU node the acceptance gate still holds (cluster.gate_rules).
        "daemonsets": {"tolerations": DAEMONSET_TOLERATIONS},
        "node-feature-discovery": {"worker": {"tolerations": NFD_WORKER_TOLERATIONS}},
    }
    if inventory.gpu.driver == "operator":
        # A chart or driver version change swaps the driver container under running GPU
        # nodes: the operator's upgrade controller then takes one node at a time, drained.
        out["driver"]["upgradePolicy"] = DRIVER_UPGRADE_POLICY
    if toolkit_in_cluster:
        out["toolkit"]["env"] = toolkit_env()
    selector = trust.trusted_selector(inventory)
    if selector:
        # The operator creates DaemonSets and Roles and patches any Node (templates/role.yaml,
        # clusterrole.yaml v26.7.0); NFD's master and gc patch any Node: trusted nodes only.
        # The operands must run on every GPU node and take no selector (ClusterPolicy has none).
        out["operator"] = {"nodeSelector": selector}
        out["node-feature-discovery"].update({"master": {"nodeSelector": selector}, "gc": {"nodeSelector": selector}})
    # The tool applies these ConfigMaps itself (config_maps below), before the release: the
    # operator does not watch them, so the tool must know when one changed to restart the
    # device plugin; and a changed sharing setup then needs no Helm upgrade.
    if gpu_sharing.device_plugin_configs(inventory, gpu):
        out["devicePlugin"] = {"config": {"create": False, "name": DEVICE_PLUGIN_CONFIGMAP,
                                          "default": gpu_sharing.default_device_plugin_key(inventory)}}
    if gpu_sharing.mig_parted_config(inventory, facts_by_node, gpu):
        out["migManager"]["config"].update({"create": False, "name": MIG_PARTED_CONFIGMAP})
    return out


def config_maps(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> list[dict]:
    """The operator's namespace and the sharing ConfigMaps its release refers to."""
    objects: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    plugin_configs = gpu_sharing.device_plugin_configs(inventory, gpu)
    if plugin_configs:
        objects.append(_config_map(DEVICE_PLUGIN_CONFIGMAP, plugin_configs))
    mig_config = gpu_sharing.mig_parted_config(inventory, facts_by_node, gpu)
    if mig_config:
        # MIG Manager requires the key `config.yaml` in a custom mig-parted ConfigMap.
        objects.append(_config_map(MIG_PARTED_CONFIGMAP, {"config.yaml": yaml.safe_dump(mig_config, sort_keys=False)}))
    return objects


def _config_map(name: str, data: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
            "data": data}


def release(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> Release:
    src = versions.source(inventory, Component.GPU_OPERATOR)
    # operator.upgradeCRD is left at the chart's default, true: "requires
    # --disable-openapi-validation flag to be passed during helm upgrade" (values.yaml v26.7.0;
    # templates/upgrade_crd.yaml, a pre-upgrade hook Job that applies the new CRDs).
    return Release(RELEASE, NAMESPACE, src.chart, src.repo, src.version,
                   values(inventory, facts_by_node, gpu), src.archive, upgrades_own_crds=True)
