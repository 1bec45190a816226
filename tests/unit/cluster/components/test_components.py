"""Cluster-side components, checked against what upstream publishes (../shared/upstream):
every Helm value we set must be a key of the chart's own values.yaml, every plain object
must pass the Kubernetes schema (kubernetes-validate) or the CRD's openAPIV3Schema, and the
device-plugin / mig-parted / RDMA configs must have the shape of upstream's examples."""

import copy
import json
from dataclasses import replace

import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_facts_parsers import h200_probe_output
from upstream import upstream

from bootstrap.cluster.components import (ComponentError, desired_manifests, desired_patches, desired_prerequisites, desired_releases, gpu_operator, gpu_sharing, node_labels, rdma, storage, versions)
from bootstrap.cluster.components.cluster_plan import plan_cluster
from bootstrap.host.facts.host_facts import ContainerdConfig, RdmaDevice
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.errors import InvalidInput
from bootstrap.inventory.loader import parse_inventory
from bootstrap.inventory.model import Mig
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them

KUBE_VERSION = "1.33"
CNI_BIN = "/var/lib/rancher/k3s/data/cni"
H200 = replace(parse_host_facts(h200_probe_output()), containerd=ContainerdConfig(["runc", "nvidia"], CNI_BIN))
CPU = replace(H200, gpus=[], mig_profiles=[], nvidia_pci=[], driver_version=None, cuda_version=None)
IB = RdmaDevice("mlx5_0", 1, "InfiniBand", "ACTIVE", ["ibp26s0"])
ROCE = RdmaDevice("mlx5_1", 1, "Ethernet", "ACTIVE", ["ens1f0np0"])


def inventory(extra: str = "", nodes: str = ""):
    return parse_inventory(f"""\
cluster: t
nodes:
  - {{name: cp-1, address: 10.0.0.1, role: server}}
  - {{name: g1, address: 10.0.0.2}}
{nodes}{extra}""")


def facts_for(inv, gpu=H200, cpu=CPU):
    return {n.name: (cpu if n.role == "server" else gpu) for n in inv.nodes}


def releases_by_name(inv, facts=None, **kw):
    return {r.name: r for r in desired_releases(inv, facts if facts is not None else facts_for(inv), gpu_nodes(inv, facts if facts is not None else facts_for(inv)), **kw)}


def operator_values(inv, facts=None):
    """The release values, with each sharing ConfigMap's data shown where the values name it
    (the tool applies those ConfigMaps itself, before the release)."""
    facts = facts if facts is not None else facts_for(inv)
    values = releases_by_name(inv, facts)["gpu-operator"].values
    maps = {m["metadata"]["name"]: m for m in gpu_operator.config_maps(inv, facts, gpu_nodes(inv, facts)) if m["kind"] == "ConfigMap"}
    for section in ("devicePlugin", "migManager"):
        config = values.get(section, {}).get("config", {})
        if config.get("name") in maps:
            assert config["create"] is False  # the chart must not create (and own) it too
            config["data"] = maps[config["name"]]["data"]
    return values


# A cluster that shares GPUs every way at once: time-slicing (cluster-wide), MPS, a MIG
# layout, MIG profiles, plus RDMA, NFS and Volcano queues: one plan that touches everything.
MIXED = """\
  - {name: g-mps, address: 10.0.0.3, gpu: {sharing: {mps: {replicas: 2}}}}
  - {name: g-mig, address: 10.0.0.4, gpu: {sharing: {mig: {layout: all-1g.18gb}}}}
  - {name: g-prof, address: 10.0.0.5, gpu: {sharing: {mig: {profiles: {3g.71gb: 2}}}}}
"""
MIXED_EXTRA = """\
gpu: {sharing: {time_slicing: {replicas: 4}}}
network: {rdma: {interfaces: [ibp26s0, ens1f0np0], subnet: 192.168.0.0/16}}
storage: {default: nfs, nfs: {server: 10.0.0.5, share: /srv/nfs, mount_options: [nfsvers=4.1, hard]}}
volcano: {queues: [{name: research, weight: 3}, {name: batch}]}
"""


def mixed():
    inv = inventory(MIXED_EXTRA, MIXED)
    return inv, facts_for(inv, gpu=replace(H200, rdma=[IB, ROCE]))


# --- upstream checkers ---------------------------------------------------------------------

# Values that are lists or free-form maps in the charts: whatever is under them is ours.
LEAF_KEYS = {"env", "data", "tolerations", "nodeSelector", "annotations", "affinity", "resources"}


def missing_value_paths(ours: dict, defaults, path: str = "") -> list[str]:
    """Key paths we set that the chart's default values.yaml does not have."""
    missing = []
    for key, value in ours.items():
        where = f"{path}.{key}" if path else key
        if not isinstance(defaults, dict) or key not in defaults:
            missing.append(where)
            continue
        default = defaults[key]
        if key in LEAF_KEYS or default is None or default == {}:
            continue  # free-form, or `~` (any value) in the chart
        if isinstance(default, dict):
            if not isinstance(value, dict):
                missing.append(f"{where} (the chart has a map here)")
            else:
                missing += missing_value_paths(value, default, where)
        elif isinstance(value, dict):
            missing.append(f"{where} (the chart has a {type(default).__name__} here)")
    return missing


def test_key_path_checker_finds_unknown_and_misplaced_keys():
    defaults = {"a": {"b": 1, "env": [], "data": {}, "c": None}, "d": True}
    assert missing_value_paths({"a": {"b": 2, "env": [{"x": 1}], "data": {"k": "v"}, "c": {"any": 1}}}, defaults) == []
    assert missing_value_paths({"a": {"zz": 1}, "e": 1}, defaults) == ["a.zz", "e"]
    assert missing_value_paths({"d": {"x": 1}}, defaults) == ["d (the chart has a bool here)"]
    assert missing_value_paths({"a": 5}, defaults) == ["a (the chart has a map here)"]


def load_yaml(relative: str):
    return yaml.safe_load(upstream(relative).read_text())


def chart_defaults(chart: str) -> dict:
    files = {
        "gpu-operator": "gpu-operator/v26.7.0/values.yaml",
        "rke2-multus": "rke2-multus/v4.3.017/values.yaml",
        "csi-driver-nfs": "csi-driver-nfs/4.13.4/values.yaml",
        "longhorn": "longhorn/1.12.1/values.yaml",
        "volcano": "volcano/1.15.1/values.yaml",
    }
    defaults = load_yaml(files[chart])
    if chart == "gpu-operator":
        # `node-feature-discovery:` goes to the subchart, whose values.yaml is beside it.
        sub = load_yaml("gpu-operator/v26.7.0/charts/node-feature-discovery/values.yaml")
        parent = defaults["node-feature-discovery"]
        defaults["node-feature-discovery"] = {**sub, **{k: {**sub.get(k, {}), **v} if isinstance(v, dict) else v
                                                        for k, v in parent.items()}}
    if chart == "rke2-multus":
        # Helm hands `rke2-whereabouts:` to the subchart: its keys are the subchart's values.
        sub = load_yaml("rke2-multus/v4.3.017/charts/rke2-whereabouts/values.yaml")
        defaults["rke2-whereabouts"] = {**sub, **defaults["rke2-whereabouts"]}
    return defaults


def check_release_values(release) -> None:
    if release.chart == versions.MULTUS_CRD_CHART:
        # No values.yaml upstream; its whereabouts CRD templates test exactly this key
        # (rancher/rke2-charts charts/rke2-multus/rke2-multus-crd/4.3.016/templates/*).
        assert release.values == {"rke2-whereabouts": {"enabled": True}}
        return
    assert missing_value_paths(release.values, chart_defaults(release.chart)) == [], release.name


def example_paths(value, free=(), path="") -> set[str]:
    """Normalised key paths with leaf types: list items are `[]`, keys of free-form maps `*`."""
    if isinstance(value, dict):
        if not value:
            return {f"{path}:{{}}"}
        out = set()
        for key, item in value.items():
            name = "*" if path.rsplit(".", 1)[-1] in free else key
            out |= example_paths(item, free, f"{path}.{name}" if path else name)
        return out
    if isinstance(value, list):
        return set().union(*(example_paths(item, free, f"{path}.[]") for item in value)) if value else {f"{path}:[]"}
    return {f"{path}:{type(value).__name__}"}


def crd_schema(relative: str) -> dict:
    crd = load_yaml(relative)
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # Every object carries these even when a CRD's schema leaves them out (the NAD CRD does).
    envelope = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    for key, sub in envelope.items():
        schema.setdefault("properties", {}).setdefault(key, sub)
    return strict(schema)


def strict(schema):
    """The API server prunes unknown fields silently; we want them to fail the test."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


CRDS = {
    "NetworkAttachmentDefinition": "multus/networks-crd.yaml",
    "Queue": "volcano/1.15.1/crd/bases/scheduling.volcano.sh_queues.yaml",
}


def validate_object(obj: dict) -> None:
    if obj["kind"] in CRDS:
        crd = load_yaml(CRDS[obj["kind"]])
        assert obj["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        jsonschema.validate(obj, crd_schema(CRDS[obj["kind"]]))
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_crd_validator_rejects_unknown_and_mistyped_fields():
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
             "spec": {"weight": 1}}
    validate_object(queue)
    with pytest.raises(jsonschema.ValidationError):
        validate_object({**queue, "spec": {"weight": 1, "weigth": 2}})
    with pytest.raises(jsonschema.ValidationError):
        validate_object({**queue, "spec": {"weight": 0}})  # the CRD's minimum is 1


def planned(extra: str = ""):
    inv = inventory(extra)
    return inv, facts_for(inv)


SCENARIOS = {
    "mixed": mixed,
    "defaults": lambda: planned("gpu: {driver: preinstalled}\n"),  # a gpu: section: a GPU cluster (topology)
    "operator-driver": lambda: planned("gpu: {driver: operator}\n"),
    "operator-driver-old-version": lambda: planned("gpu: {driver: operator}\ncharts: {gpu_operator: v24.9.2}\n"),
    "longhorn": lambda: planned("storage: {default: longhorn, longhorn_replicas: 3}\ngpu: {driver: preinstalled}\n"),
    # An untrusted agent: every release's trusted-nodes selector, in keys the charts have.
    "untrusted-agent": lambda: (lambda inv: (inv, facts_for(inv)))(inventory(
        "storage: {default: longhorn, nfs: {server: 10.0.0.5, share: /srv/nfs}}\ngpu: {driver: operator}\n",
        "  - {name: g2, address: 10.0.0.3, trusted: false}\n")),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_values_key_exists_in_the_charts_values(name):
    inv, facts = SCENARIOS[name]()
    releases = desired_releases(inv, facts, gpu_nodes(inv, facts))
    assert releases
    for release in releases:
        check_release_values(release)


def test_multus_is_thin_and_the_crd_chart_comes_from_v4_3_009():
    # Thick Multus mounts /etc/cni/net.d and /opt/cni/bin whatever the values say; k3s's
    # CNI dirs are elsewhere, so the tool turns thick off explicitly (the chart key exists).
    inv, facts = mixed()
    multus = releases_by_name(inv, facts)["multus"]
    assert multus.values["thickPlugin"] == {"enabled": False}
    check_release_values(multus)
    for version, crd_chart in (("v4.3.008", False), ("v4.3.009", True), ("v4.3.010", True)):
        pinned = inventory(MIXED_EXTRA + f"charts: {{multus: {version}}}\n", MIXED)
        names = releases_by_name(pinned, facts_for(pinned, gpu=replace(H200, rdma=[IB, ROCE])))
        assert ("multus-crd" in names) is crd_chart, version


# Every plain object the tool applies in each scenario (prerequisites, then manifests): the
# list is asserted first, so no scenario can pass by validating nothing.
GPU_NAMESPACE = ("Namespace", None, "gpu-operator")
APPLIED = {
    "mixed": [GPU_NAMESPACE, ("ConfigMap", "gpu-operator", "bootstrap-device-plugin-config"),
              ("ConfigMap", "gpu-operator", "bootstrap-mig-parted-config"),
              ("ConfigMap", "kube-system", "rdma-devices"), ("DaemonSet", "kube-system", "rdma-shared-dp-ds"),
              ("NetworkAttachmentDefinition", "default", "rdma-ibp26s0"),
              ("NetworkAttachmentDefinition", "default", "rdma-ens1f0np0"),
              ("StorageClass", None, "nfs-csi"), ("Queue", None, "research"), ("Queue", None, "batch")],
    "defaults": [GPU_NAMESPACE],
    "operator-driver": [GPU_NAMESPACE],
    "operator-driver-old-version": [GPU_NAMESPACE],
    "longhorn": [GPU_NAMESPACE],
    "untrusted-agent": [GPU_NAMESPACE, ("StorageClass", None, "nfs-csi")],
}


def test_every_scenario_has_its_applied_objects_listed():
    assert set(APPLIED) == set(SCENARIOS)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_manifest_passes_its_schema(name):
    inv, facts = SCENARIOS[name]()
    objects = desired_prerequisites(inv, facts, gpu_nodes(inv, facts)) + desired_manifests(inv, facts, gpu_nodes(inv, facts))
    assert [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects] == APPLIED[name]
    for obj in objects:
        validate_object(obj)


def test_default_versions_match_the_upstream_charts():
    for component, relative in (("multus", "rke2-multus/v4.3.017/Chart.yaml"),
                                ("nfs_csi", "csi-driver-nfs/4.13.4/Chart.yaml"),
                                ("longhorn", "longhorn/1.12.1/Chart.yaml"),
                                ("volcano", "volcano/1.15.1/Chart.yaml")):
        chart = load_yaml(relative)
        assert (versions.DEFAULTS[component].chart, versions.DEFAULTS[component].version) == \
               (chart["name"], str(chart["version"]))
    # gpu-operator's in-tree Chart.yaml says v1.0.0-devel; the release tag names the data.
    assert load_yaml("gpu-operator/v26.7.0/Chart.yaml")["name"] == "gpu-operator"
    assert versions.DEFAULTS["gpu_operator"].version == "v26.7.0"


# --- GPU sharing -----------------------------------------------------------------------------

def plugin_config(values: dict, key: str) -> dict:
    return yaml.safe_load(values["devicePlugin"]["config"]["data"][key])


def device_plugin_example_paths() -> set[str]:
    paths = set()
    for relative in ("k8s-device-plugin/0.20.0/readme-examples/time-slicing.yaml",
                     "k8s-device-plugin/0.20.0/readme-examples/mps.yaml",
                     "k8s-device-plugin/0.20.0/readme-examples/config-file.yaml"):
        paths |= example_paths(load_yaml(relative))
    for relative in ("k8s-device-plugin/examples/time-slicing-config-sample.yaml",
                     "k8s-device-plugin/examples/time-slicing-config-fine.yaml"):
        for text in load_yaml(relative)["data"].values():
            paths |= example_paths(yaml.safe_load(text))
    return paths


def test_time_slicing_mps_and_mig_nodes_get_distinct_configs_and_labels():
    inv, facts = mixed()
    values = operator_values(inv, facts)
    config = values["devicePlugin"]["config"]
    assert config["name"] == gpu_operator.DEVICE_PLUGIN_CONFIGMAP
    assert config["default"] == "ts-4"
    assert set(config["data"]) == {"ts-4", "mps-2", "mig-single"}
    labels = node_labels(inv, facts, gpu_nodes(inv, facts))
    in_rdma = {rdma.RDMA_LABEL: "true"}  # the mixed cluster has network.rdma
    assert labels["g1"] == {"nvidia.com/device-plugin.config": "ts-4", "nvidia.com/mig.config": "all-disabled", **in_rdma}
    assert labels["g-mps"]["nvidia.com/device-plugin.config"] == "mps-2"
    # spelled out from its own table (g-prof uses profiles), and named by what it holds
    assert labels["g-mig"].pop("nvidia.com/mig.config").startswith("all-1g.18gb-")
    assert labels["g-mig"] == {"nvidia.com/device-plugin.config": "mig-single", "nvidia.com/mig.strategy": "single",
                               **in_rdma}
    assert labels["g-prof"]["nvidia.com/mig.config"].startswith("custom-")
    assert labels["cp-1"] == in_rdma  # no GPU, no sharing labels


def test_device_plugin_configs_have_the_upstream_format():
    inv, facts = mixed()
    values = operator_values(inv, facts)
    allowed = device_plugin_example_paths()
    for key in values["devicePlugin"]["config"]["data"]:
        assert example_paths(plugin_config(values, key)) <= allowed, key
    # Word for word the GPU Operator docs' time-slicing-config-all (plus the explicit
    # renameByDefault: false that their time-slicing-config-sample spells out).
    docs = yaml.safe_load(load_yaml("k8s-device-plugin/examples/time-slicing-config-all.yaml")["data"]["any"])
    ours = plugin_config(values, "ts-4")
    assert ours["sharing"]["timeSlicing"].pop("renameByDefault") is False
    assert ours == docs
    mps = {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}
    assert plugin_config(values, "mps-2")["sharing"] == mps
    assert plugin_config(values, "mig-single") == {"version": "v1", "flags": {"migStrategy": "single"}}


def test_rename_by_default_gets_its_own_config():
    inv = inventory("gpu: {sharing: {time_slicing: {replicas: 8, rename_by_default: true}}}\n")
    values = operator_values(inv)
    assert values["devicePlugin"]["config"]["default"] == "ts-8-renamed"
    assert plugin_config(values, "ts-8-renamed")["sharing"]["timeSlicing"]["renameByDefault"] is True


def test_no_sharing_leaves_the_device_plugin_alone():
    inv = inventory()
    values = operator_values(inv)
    assert "devicePlugin" not in values
    assert node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))["g1"] == {"nvidia.com/mig.config": "all-disabled"}


def test_mig_layout_alone_uses_the_operators_own_layouts():
    inv = inventory("gpu: {sharing: {mig: {layout: all-1g.18gb, strategy: mixed}}}\n")
    values = operator_values(inv)
    assert values["mig"] == {"strategy": "mixed"}
    assert values["migManager"] == {"config": {"default": "all-disabled"}}  # nothing custom
    assert "devicePlugin" not in values  # the operator passes mig.strategy to the plugin
    assert node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))["g1"] == {"nvidia.com/mig.config": "all-1g.18gb",
                                                      "nvidia.com/mig.strategy": "mixed"}


def mig_parted_example_paths() -> set[str]:
    free = ("mig-configs", "mig-devices")
    paths = example_paths(load_yaml("mig-parted/v0.15.0/examples/config.yaml"), free)
    operator_default = load_yaml("mig-parted/gpu-operator-v26.7.0/0400_configmap.yaml")["data"]["config.yaml"]
    return paths | example_paths(yaml.safe_load(operator_default), free)


def test_mig_profiles_make_a_custom_mig_parted_config():
    inv, facts = mixed()
    config = operator_values(inv, facts)["migManager"]["config"]
    assert config["name"] == gpu_operator.MIG_PARTED_CONFIGMAP
    assert config["default"] == "all-disabled" and set(config["data"]) == {"config.yaml"}
    parted = yaml.safe_load(config["data"]["config.yaml"])
    assert example_paths(parted, ("mig-configs", "mig-devices")) <= mig_parted_example_paths()
    custom = node_labels(inv, facts, gpu_nodes(inv, facts))["g-prof"]["nvidia.com/mig.config"]
    assert parted["mig-configs"][custom] == [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.71gb": 2}}]
    assert parted["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    # The named layout of the other node is spelled out from its profile table, and says
    # what the operator's own default layout of that name says for the H200.
    operator_default = yaml.safe_load(load_yaml("mig-parted/gpu-operator-v26.7.0/0400_configmap.yaml")
                                      ["data"]["config.yaml"])
    spelled = node_labels(inv, facts, gpu_nodes(inv, facts))["g-mig"]["nvidia.com/mig.config"]
    assert parted["mig-configs"][spelled] == operator_default["mig-configs"]["all-1g.18gb"]


def test_a_media_engine_layout_uses_mig_parteds_name_and_a_valid_label():
    from bootstrap.inventory.kube import label_value_error

    inv = inventory(MIXED_EXTRA, MIXED.replace("layout: all-1g.18gb}", "layout: all-1g.18gb.me}"))
    facts = facts_for(inv, gpu=replace(H200, rdma=[IB, ROCE]))
    label = node_labels(inv, facts, gpu_nodes(inv, facts))["g-mig"]["nvidia.com/mig.config"]
    assert label.startswith("all-1g.18gb.me-") and label_value_error(label) is None
    parted = yaml.safe_load(operator_values(inv, facts)["migManager"]["config"]["data"]["config.yaml"])
    operator_default = yaml.safe_load(load_yaml("mig-parted/gpu-operator-v26.7.0/0400_configmap.yaml")
                                      ["data"]["config.yaml"])
    assert parted["mig-configs"][label] == operator_default["mig-configs"]["all-1g.18gb.me"]


def test_custom_mig_config_names_are_stable_and_distinct():
    a = gpu_sharing.mig_config_name(Mig(profiles={"3g.71gb": 2}))
    assert a == gpu_sharing.mig_config_name(Mig(profiles={"3g.71gb": 2}))
    assert a != gpu_sharing.mig_config_name(Mig(profiles={"2g.35gb": 3}))
    assert a.startswith("custom-") and len(a) <= 63


def test_named_layout_next_to_profiles_needs_the_nodes_profile_table():
    """Without its own table the node's layout cannot be spelled out: that node's failure
    (plan_cluster's mig_failed, the gate keeps it gated), and the cluster side goes on."""
    inv, facts = mixed()
    facts["g-mig"] = replace(H200, mig_profiles=[])
    plan = plan_cluster(inv, facts, gpu_nodes(inv, facts))
    assert set(plan.mig_failed) == {"g-mig"} and "no MIG profile table is known" in plan.mig_failed["g-mig"]
    parted = gpu_sharing.mig_parted_config(inv, facts, gpu_nodes(inv, facts))
    assert not any(name.startswith("all-1g.18gb") for name in parted["mig-configs"])


def made_up_table(facts):
    """A host's own MIG profile table, rewritten: 1g.18gb holds 1 instance, not 7."""
    return replace(facts, mig_profiles=[replace(p, instances_total=1, instances_free=1, placements=p.placements[:1])
                                        if p.name == "1g.18gb" else p for p in facts.mig_profiles])


def test_one_nodes_made_up_mig_table_changes_no_other_nodes_config_or_label():
    """g-mig2 reports a table of its own making for the same layout: it gets an entry of its
    own; g-mig's entry and label stay what they are without it. Before, the two entries under
    one name raised a ComponentError and the cluster side stopped for everyone."""
    two = MIXED + "  - {name: g-mig2, address: 10.0.0.6, gpu: {sharing: {mig: {layout: all-1g.18gb}}}}\n"
    inv = inventory(MIXED_EXTRA, two)
    honest = facts_for(inv, gpu=replace(H200, rdma=[IB, ROCE]))
    hostile = {**honest, "g-mig2": made_up_table(honest["g-mig2"])}
    assert plan_cluster(inv, hostile, gpu_nodes(inv, hostile)).mig_failed == {}
    alone = gpu_sharing.mig_plan(inv, honest, gpu_nodes(inv, honest))
    plan = gpu_sharing.mig_plan(inv, hostile, gpu_nodes(inv, hostile))
    assert plan.failed == {} and plan.names["g-mig"] == alone.names["g-mig"] != plan.names["g-mig2"]
    assert plan.config["mig-configs"][plan.names["g-mig"]] == alone.config["mig-configs"][alone.names["g-mig"]]
    assert plan.config["mig-configs"][plan.names["g-mig2"]] == [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 1}}]
    labels = node_labels(inv, hostile, gpu_nodes(inv, hostile))
    assert labels["g-mig"]["nvidia.com/mig.config"] == plan.names["g-mig"]
    assert labels["g-mig2"]["nvidia.com/mig.config"] == plan.names["g-mig2"]


def test_a_table_the_layout_cannot_fit_fails_that_node_alone():
    inv, facts = mixed()
    facts["g-mig"] = replace(H200, mig_profiles=[p for p in H200.mig_profiles if p.name != "1g.18gb"])
    plan = plan_cluster(inv, facts, gpu_nodes(inv, facts))
    assert set(plan.mig_failed) == {"g-mig"} and plan.mig_failed["g-mig"].startswith("MIG layout all-1g.18gb on g-mig")
    custom = plan.labels["g-prof"]["nvidia.com/mig.config"]
    assert custom in yaml.safe_load(plan.prerequisites[-1]["data"]["config.yaml"])["mig-configs"]


@pytest.mark.parametrize("driver, driver_enabled, toolkit_enabled", [
    ("preinstalled", False, False), ("host", False, False), ("operator", True, True)])
def test_driver_modes(driver, driver_enabled, toolkit_enabled):
    values = operator_values(inventory(f"gpu: {{driver: {driver}}}\n"))
    assert values["driver"]["enabled"] is driver_enabled
    assert values["toolkit"]["enabled"] is toolkit_enabled
    # The toolkit's env only matters where the operator runs the toolkit.
    assert ("env" in values["toolkit"]) is toolkit_enabled


def test_an_operator_driver_upgrade_goes_one_drained_node_at_a_time():
    policy = operator_values(inventory("gpu: {driver: operator}\n"))["driver"]["upgradePolicy"]
    assert policy["autoUpgrade"] is True and policy["maxParallelUpgrades"] == 1 and policy["maxUnavailable"] == 1
    assert policy["drain"]["enable"] is True and policy["drain"]["timeoutSeconds"] > 0
    assert "upgradePolicy" not in operator_values(inventory("gpu: {driver: preinstalled}\n"))["driver"]


# One k3s release per containerd k3s embeds (k3s's release notes, Embedded Component Versions):
# 1.7.27 (v1.30.14+k3s2), 2.0.2 (v1.31.6+k3s1, the first 2.x), 2.2.4 (v1.33.13+k3s1), 2.3.2 (v1.36.2+k3s1).
K3S_LINES = ["v1.30.14+k3s2", "v1.31.6+k3s1", "v1.33.13+k3s1", "v1.36.2+k3s1"]


@pytest.mark.parametrize("k3s", K3S_LINES)
@pytest.mark.parametrize("version", ["v26.7.0", "v25.10.0", "v25.3.4", "v24.9.2"])
def test_toolkit_env_is_the_socket_and_the_file_source_on_every_k3s_line(version, k3s):
    """No CONTAINERD_CONFIG: older operators pointed it at k3s's config.toml.tmpl, which
    replaces the template k3s renders its CNI settings from (gpu-operator issue 473).
    RUNTIME_CONFIG_SOURCE=file: toolkit v1.20.0 (operator v26.7.0's) would otherwise read
    `containerd config dump` of whatever containerd the host has on its PATH (never k3s's,
    whatever its line), and a containerd 2.x there reports config version 3 or 4, which the
    drop-in it writes then carries, and that containerd refuses to start (NVIDIA/aicr#1688)."""
    inv = inventory(f"gpu: {{driver: operator}}\ncharts: {{gpu_operator: {version}}}\nk3s: {{version: {k3s}}}\n")
    assert inv.k3s.version == k3s
    release = releases_by_name(inv)["gpu-operator"]
    assert release.version == version
    env = {e["name"]: e["value"] for e in release.values["toolkit"]["env"]}
    assert env == {"CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock", "RUNTIME_CONFIG_SOURCE": "file"}
    assert all(isinstance(v, str) for v in env.values())  # env values must be strings


def test_no_gpu_nodes_no_gpu_operator():
    inv = inventory()
    assert "gpu-operator" not in releases_by_name(inv, {n.name: CPU for n in inv.nodes})


def test_inventory_labels_are_kept_and_sharing_labels_added():
    inv = inventory(nodes="  - {name: g2, address: 10.0.0.3, labels: {pool: h200, team: ml}}\n")
    labels = node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))
    assert labels["g2"] == {"pool": "h200", "team": "ml", "nvidia.com/mig.config": "all-disabled"}


# --- RDMA ------------------------------------------------------------------------------

def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def test_multus_and_whereabouts_use_the_cni_dirs_from_facts():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\n")
    old_bin = "/var/lib/rancher/k3s/data/current/bin"  # pre-October-2024 k3s: proves nothing is hard-coded
    facts = facts_for(inv, gpu=replace(H200, containerd=ContainerdConfig([], old_bin), rdma=[IB]),
                      cpu=replace(CPU, containerd=ContainerdConfig([], old_bin)))
    releases = releases_by_name(inv, facts)
    conf = rdma.K3S_CNI_CONF_DIR
    assert releases["multus"].values["config"]["cni_conf"] == {
        "confDir": conf, "binDir": old_bin, "kubeconfig": f"{conf}/multus.d/multus.kubeconfig",
        "multusAutoconfigDir": conf}
    assert releases["multus"].values["rke2-whereabouts"] == {
        "enabled": True, "fullnameOverride": "whereabouts", "cniConf": {"confDir": conf, "binDir": old_bin},
        "nodeSelector": {rdma.RDMA_LABEL: "true"}}
    assert releases["multus"].values["labels"] == {"nodeSelector": {rdma.RDMA_LABEL: "true"}}
    assert (releases["multus"].chart, releases["multus"].repo) == ("rke2-multus", "https://rke2-charts.rancher.io")
    # The CRD chart comes first and carries the same number without the v.
    names = [r.name for r in desired_releases(inv, facts, gpu_nodes(inv, facts))]
    assert names.index("multus-crd") < names.index("multus")
    assert (releases["multus-crd"].chart, releases["multus-crd"].version) == ("rke2-multus-crd", "4.3.017")


def test_cni_bin_dir_is_the_servers_and_must_be_known():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\n")
    unknown = facts_for(inv, gpu=replace(H200, containerd=None), cpu=replace(CPU, containerd=None))
    with pytest.raises(ComponentError, match="CNI bin dir is unknown: no server's"):
        desired_releases(inv, unknown, gpu_nodes(inv, unknown))
    # An agent's answer alone never sets the chart value.
    only_agent = facts_for(inv, cpu=replace(CPU, containerd=None))
    with pytest.raises(ComponentError, match="CNI bin dir is unknown"):
        desired_releases(inv, only_agent, gpu_nodes(inv, only_agent))


HOSTILE_NODES = "  - {name: g2, address: 10.0.0.3}\n"


def test_an_agent_reporting_another_cni_bin_dir_changes_nothing_for_the_others():
    """Issue 32: g2's agent claims another containerd bin dir. Before, that stopped the
    cluster side for every node ("nodes use different CNI bin dirs"); now the chart value is
    the server's, and g2 alone is named and left out of RDMA (its Multus could not work)."""
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\n", HOSTILE_NODES)
    hostile = replace(H200, rdma=[IB], containerd=ContainerdConfig(["runc"], "/tmp/evil" + "x" * 5000))
    facts = {**facts_for(inv, gpu=replace(H200, rdma=[IB])), "g2": hostile}
    releases = releases_by_name(inv, facts)
    assert releases["multus"].values["config"]["cni_conf"]["binDir"] == CNI_BIN
    assert releases["multus"].values["rke2-whereabouts"]["cniConf"]["binDir"] == CNI_BIN
    [nad] = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "NetworkAttachmentDefinition")
    assert cni_config(nad)["type"] == "host-device"
    labels = node_labels(inv, facts, gpu_nodes(inv, facts))
    assert {n: labels[n][rdma.RDMA_LABEL] for n in ("cp-1", "g1", "g2")} == {"cp-1": "true", "g1": "true", "g2": "false"}
    [line] = rdma.warning_lines(inv, facts)
    assert line.startswith("rdma: g2 is left out of RDMA") and f"the cluster's (the servers') is {CNI_BIN}" in line
    assert len(line) < 600  # the host's answer is quoted cut short
    assert rdma.warning_lines(inv, facts_for(inv)) == []  # agents that agree with the server


def test_an_agent_claiming_infiniband_changes_nothing_for_the_others():
    """Issue 32: g2 claims InfiniBand on ens1f0np0, which g1 has as Ethernet (RoCE). Before,
    that stopped the cluster side ("InfiniBand on some nodes and Ethernet on others"), and a
    lone claim turned the attachment to host-device for every node. Now the link type follows
    the inventory (here the interface's name), and only g2 is left out."""
    inv = inventory("network: {rdma: {interfaces: [ens1f0np0]}}\n", HOSTILE_NODES)
    liar = RdmaDevice("mlx5_1", 1, "InfiniBand", "ACTIVE", ["ens1f0np0"])
    facts = {**facts_for(inv, gpu=replace(H200, rdma=[ROCE])), "g2": replace(H200, rdma=[liar])}
    [nad] = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "NetworkAttachmentDefinition")
    assert (cni_config(nad)["type"], cni_config(nad)["master"]) == ("macvlan", "ens1f0np0")
    labels = node_labels(inv, facts, gpu_nodes(inv, facts))
    assert (labels["g1"][rdma.RDMA_LABEL], labels["g2"][rdma.RDMA_LABEL]) == ("true", "false")
    [line] = rdma.warning_lines(inv, facts)
    assert line.startswith("rdma: g2 ") and "ens1f0np0 as InfiniBand, the cluster has it as Ethernet" in line
    # A lone node claiming InfiniBand does not turn the cluster's attachment to host-device.
    inv_alone = inventory("network: {rdma: {interfaces: [ens1f0np0]}}\n")
    alone = {"cp-1": CPU, "g1": replace(H200, rdma=[liar])}
    [nad] = by_kind(desired_manifests(inv_alone, alone, gpu_nodes(inv_alone, alone)), "NetworkAttachmentDefinition")
    assert cni_config(nad)["type"] == "macvlan"


def test_link_layer_from_the_inventory_where_the_name_does_not_say():
    inv = inventory("network: {rdma: {interfaces: [rdma0, ibp26s0], link_layer: {rdma0: infiniband, ibp26s0: ethernet}}}\n")
    assert inv.network.rdma.link_layer == {"rdma0": "infiniband", "ibp26s0": "ethernet"}
    nads = by_kind(desired_manifests(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv))), "NetworkAttachmentDefinition")
    assert [cni_config(n)["type"] for n in nads] == ["host-device", "macvlan"]
    assert rdma.link_layer(inventory("network: {rdma: {interfaces: [ib0]}}\n"), "ib0") == rdma.INFINIBAND
    assert rdma.link_layer(inventory("network: {rdma: {interfaces: [eth2]}}\n"), "eth2") == rdma.ETHERNET


def test_link_layer_values_are_checked_with_their_place():
    with pytest.raises(InvalidInput) as caught:
        parse_inventory("cluster: t\nnodes:\n  - {name: cp-1, address: 10.0.0.1, role: server}\n"
                        "network:\n  rdma:\n    interfaces: [rdma0]\n    link_layer: {rdma0: roce, 'bad name!': ethernet}\n",
                        "inv.yaml")
    where = {p.path: (p.line, p.message) for p in caught.value.problems}
    assert set(where) == {"network.rdma.link_layer.rdma0", "network.rdma.link_layer.bad name!"}
    assert where["network.rdma.link_layer.rdma0"][0] == 7 and "not a valid link layer" in where["network.rdma.link_layer.rdma0"][1]
    assert "is not an interface name" in where["network.rdma.link_layer.bad name!"][1]
    with pytest.raises(InvalidInput) as caught:  # a typo would leave the name to decide: refused
        inventory("network: {rdma: {interfaces: [rdma0], link_layer: {rdma1: infiniband}}}\n")
    [problem] = caught.value.problems
    assert problem.path == "network.rdma.link_layer.rdma1" and "is no RDMA interface" in problem.message


def test_older_multus_has_no_crd_chart():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\ncharts: {multus: v4.2.311}\n")
    releases = releases_by_name(inv)
    assert "multus-crd" not in releases and releases["multus"].version == "v4.2.311"


def test_rdma_device_plugin_config_from_inventory_and_node_interfaces():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\n",
                    "  - {name: g2, address: 10.0.0.3, rdma_interfaces: [ibp27s0, ibp26s0]}\n")
    facts = facts_for(inv, gpu=replace(H200, rdma=[IB]))
    configmap = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "ConfigMap")[0]
    assert configmap["metadata"] == {"name": "rdma-devices", "namespace": "kube-system"}
    config = json.loads(configmap["data"]["config.json"])
    assert config["configList"] == [{"resourceName": "rdma_shared_device_a", "rdmaHcaMax": 63,
                                     "selectors": {"ifNames": ["ibp26s0", "ibp27s0"]}}]
    assert rdma.resource_key(inv) == "rdma/rdma_shared_device_a"
    # Same shape as upstream's example config.json (its second entry uses selectors).
    example = json.loads(load_yaml("rdma-shared-dev-plugin/deployment/k8s/base/configmap.yaml")["data"]["config.json"])
    assert example_paths(config) <= example_paths(example)


def test_rdma_resource_prefix_other_than_rdma():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0], resource_name: nvidia.com/hca_shared}}\n")
    config = rdma.plugin_config(inv, gpu_nodes(inv, facts_for(inv)))
    assert config["configList"][0]["resourcePrefix"] == "nvidia.com"
    assert config["configList"][0]["resourceName"] == "hca_shared"
    assert rdma.resource_key(inv) == "nvidia.com/hca_shared"


def test_rdma_daemonset_is_upstreams_with_pinned_image_and_tolerations():
    inv, facts = mixed()
    ours = copy.deepcopy(by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "DaemonSet")[0])
    theirs = load_yaml("rdma-shared-dev-plugin/deployment/k8s/base/daemonset.yaml")
    spec = ours["spec"]["template"]["spec"]
    image = spec["containers"][0].pop("image")
    assert image == "ghcr.io/mellanox/k8s-rdma-shared-dev-plugin:v1.5.3"
    theirs["spec"]["template"]["spec"]["containers"][0].pop("image")
    assert spec.pop("tolerations") == [{"operator": "Exists"}]
    assert spec.pop("automountServiceAccountToken") is False  # the plugin never calls the API
    assert spec.pop("nodeSelector") == {rdma.RDMA_LABEL: "true"}  # not on a node left out of RDMA
    checksum = ours["spec"]["template"]["metadata"].pop("annotations")["checksum/config"]
    assert len(checksum) == 64
    ours["metadata"].pop("labels")
    assert ours == theirs


def test_rdma_daemonset_restarts_when_the_config_changes():
    def checksum(inv):
        return by_kind(desired_manifests(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv))), "DaemonSet")[0]["spec"]["template"]["metadata"][
            "annotations"]["checksum/config"]
    one = checksum(inventory("network: {rdma: {interfaces: [ibp26s0]}}\n"))
    two = checksum(inventory("network: {rdma: {interfaces: [ibp26s0, ibp27s0]}}\n"))
    assert one != two


def cni_config(nad):
    return json.loads(nad["spec"]["config"])


def test_network_attachments_per_interface_by_link_layer():
    inv, facts = mixed()
    nads = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "NetworkAttachmentDefinition")
    assert [n["metadata"]["name"] for n in nads] == ["rdma-ibp26s0", "rdma-ens1f0np0"]
    ib, roce = (cni_config(n) for n in nads)
    assert (ib["type"], ib["device"]) == ("host-device", "ibp26s0")  # IPoIB: no macvlan
    assert (roce["type"], roce["master"], roce["mode"]) == ("macvlan", "ens1f0np0", "bridge")
    # One rail each, cut from the inventory's subnet, so they never overlap.
    assert [ib["ipam"]["range"], roce["ipam"]["range"]] == ["192.168.0.0/17", "192.168.128.0/17"]
    for cni in (ib, roce):
        assert cni["ipam"]["type"] == "whereabouts" and cni["cniVersion"] == "1.0.0"
        assert cni["ipam"]["configuration_path"].startswith(rdma.K3S_CNI_CONF_DIR + "/whereabouts.d/")
        assert cni["ipam"]["kubernetes"]["kubeconfig"].startswith(rdma.K3S_CNI_CONF_DIR + "/whereabouts.d/")
        assert cni["name"] == f"rdma-{cni.get('device') or cni.get('master')}"
    # Same envelope as upstream's example object.
    example = load_yaml("multus/my-network.yaml")
    assert nads[0].keys() == example.keys() and nads[0]["spec"].keys() == example["spec"].keys()
    assert nads[0]["apiVersion"] == example["apiVersion"]


def test_single_interface_gets_the_whole_subnet_and_default_subnet_applies():
    inv = inventory("network: {rdma: {interfaces: [ens1f0np0]}}\n")
    nad = by_kind(desired_manifests(inv, facts_for(inv, gpu=replace(H200, rdma=[ROCE])), gpu_nodes(inv, facts_for(inv, gpu=replace(H200, rdma=[ROCE])))),
                  "NetworkAttachmentDefinition")[0]
    assert cni_config(nad)["ipam"]["range"] == rdma.DEFAULT_SUBNET
    assert cni_config(nad)["type"] == "macvlan"


def test_subnet_too_small_for_the_rails():
    with pytest.raises(ComponentError, match="too small"):
        rdma.subnets("10.0.0.0/30", 2)
    assert rdma.subnets("10.0.0.0/24", 3) == ["10.0.0.0/26", "10.0.0.64/26", "10.0.0.128/26"]


def test_interface_names_become_valid_object_names():
    assert rdma.nad_name("ib_P0:1") == "rdma-ib-p0-1"


# --- storage -----------------------------------------------------------------------------

K3S_LOCAL_PATH = {  # k3s manifests/local-storage.yaml, as research §7 describes it
    "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
    "metadata": {"name": "local-path", "annotations": {storage.DEFAULT_ANNOTATION: "true"}},
    "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}


def merge(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def test_local_path_default_is_a_patch_to_k3s_class():
    inv = inventory()
    [patch] = desired_patches(inv)
    assert (patch.kind, patch.name) == ("StorageClass", "local-path")
    assert patch.body["metadata"]["annotations"] == {storage.DEFAULT_ANNOTATION: "true"}
    validate_object(merge(K3S_LOCAL_PATH, patch.body))
    assert not {"csi-driver-nfs", "longhorn"} & set(releases_by_name(inv))
    assert by_kind(desired_manifests(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv))), "StorageClass") == []


def test_nfs_default_class_and_release():
    inv, facts = mixed()
    release = releases_by_name(inv, facts)["csi-driver-nfs"]
    assert (release.chart, release.version, release.namespace) == ("csi-driver-nfs", "4.13.4", "kube-system")
    [nfs] = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "StorageClass")
    assert nfs["metadata"]["annotations"] == {storage.DEFAULT_ANNOTATION: "true"}
    assert nfs["parameters"] == {"server": "10.0.0.5", "share": "/srv/nfs"}
    assert nfs["mountOptions"] == ["nfsvers=4.1", "hard"]
    # Every field ours has, upstream's example has, with the same provisioner.
    example = load_yaml("csi-driver-nfs/4.13.4/example/storageclass-nfs.yaml")
    assert set(nfs) == set(example) and nfs["provisioner"] == example["provisioner"]
    [patch] = desired_patches(inv)
    assert patch.body["metadata"]["annotations"] == {storage.DEFAULT_ANNOTATION: "false"}
    validate_object(merge(K3S_LOCAL_PATH, patch.body))


def test_nfs_not_default_when_local_path_is():
    inv = inventory("storage: {nfs: {server: nfs.example.com, share: /export}}\n")
    [nfs] = by_kind(desired_manifests(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv))), "StorageClass")
    assert nfs["metadata"]["annotations"] == {storage.DEFAULT_ANNOTATION: "false"}
    assert "mountOptions" not in nfs
    assert desired_patches(inv)[0].body["metadata"]["annotations"][storage.DEFAULT_ANNOTATION] == "true"


def test_longhorn_release_values():
    inv = inventory("storage: {default: longhorn, longhorn_replicas: 3}\n")
    release = releases_by_name(inv)["longhorn"]
    assert (release.chart, release.repo, release.version, release.namespace) == (
        "longhorn", "https://charts.longhorn.io", "1.12.1", "longhorn-system")
    assert release.values["persistence"] == {"defaultClass": True, "defaultClassReplicaCount": 3}
    # The chart fails unless this is a string; the setting takes per-data-engine JSON.
    assert json.loads(release.values["defaultSettings"]["defaultReplicaCount"]) == {"v1": "3", "v2": "3"}
    assert desired_patches(inv)[0].body["metadata"]["annotations"][storage.DEFAULT_ANNOTATION] == "false"


def test_storage_choices_that_cannot_work():
    inv = inventory()  # the loader refuses default: nfs without nfs; the plan refuses it too
    inv = replace(inv, storage=replace(inv.storage, default="nfs"))
    with pytest.raises(ComponentError, match="storage.nfs is not set"):
        desired_releases(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))
    with pytest.raises(ComponentError, match="local-storage"):
        desired_patches(inventory("k3s: {disable: [local-storage]}\n"))
    assert desired_patches(inventory("k3s: {disable: [local-storage]}\nstorage: {default: longhorn}\n")) == []


# --- Volcano -------------------------------------------------------------------------------

def test_volcano_release_and_queues():
    inv, facts = mixed()
    release = releases_by_name(inv, facts)["volcano"]
    assert (release.chart, release.repo, release.version, release.namespace) == (
        "volcano", "https://volcano-sh.github.io/helm-charts", "1.15.1", "volcano-system")
    queues = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "Queue")
    assert [(q["metadata"]["name"], q["spec"]) for q in queues] == [
        ("research", {"weight": 3, "reclaimable": True}), ("batch", {"weight": 1, "reclaimable": True})]
    for queue in queues:
        validate_object(queue)


def test_volcano_disabled():
    inv = inventory("volcano: {enabled: false, queues: [{name: q}]}\n")
    assert "volcano" not in releases_by_name(inv)
    assert by_kind(desired_manifests(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv))), "Queue") == []


# --- versions, order, digests ------------------------------------------------------------

def test_chart_version_overrides():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}\n"
                    "storage: {default: longhorn, nfs: {server: a, share: /b}}\n"
                    "charts: {gpu_operator: v25.10.1, multus: v4.3.019, nfs_csi: 4.12.0, longhorn: 1.11.2, "
                    "volcano: 1.14.0, rdma_shared_device_plugin: v1.5.2}\n")
    facts = facts_for(inv)
    got = {r.name: r.version for r in desired_releases(inv, facts, gpu_nodes(inv, facts))}
    assert got == {"multus-crd": "4.3.019", "multus": "v4.3.019", "csi-driver-nfs": "4.12.0", "longhorn": "1.11.2",
                   "gpu-operator": "v25.10.1", "volcano": "1.14.0"}
    daemonset = by_kind(desired_manifests(inv, facts, gpu_nodes(inv, facts)), "DaemonSet")[0]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v1.5.2")


def test_whereabouts_cannot_be_pinned_alone():
    # Whereabouts ships inside rke2-multus: the inventory refuses the key and names the valid ones.
    from bootstrap.errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        inventory("network: {rdma: {interfaces: [ibp26s0]}}\ncharts: {whereabouts: v0.9.4}\n")
    (problem,) = caught.value.problems
    assert problem.path == "charts.whereabouts" and "multus" in problem.hint


def test_releases_come_in_dependency_order():
    inv, facts = mixed()
    names = [r.name for r in desired_releases(inv, facts, gpu_nodes(inv, facts))]
    assert names == ["multus-crd", "multus", "csi-driver-nfs", "gpu-operator", "volcano"]
    kinds = [m["kind"] for m in desired_manifests(inv, facts, gpu_nodes(inv, facts))]
    assert kinds == ["ConfigMap", "DaemonSet", "NetworkAttachmentDefinition", "NetworkAttachmentDefinition",
                     "StorageClass", "Queue", "Queue"]


def test_digest_follows_values_version_and_chart():
    inv, facts = mixed()
    one = releases_by_name(inv, facts)["gpu-operator"]
    assert one.digest() == releases_by_name(*mixed())["gpu-operator"].digest()  # deterministic
    assert replace(one, values={**one.values}).digest() == one.digest()
    assert replace(one, version="v26.3.3").digest() != one.digest()
    assert replace(one, chart="other").digest() != one.digest()
    assert replace(one, values={**one.values, "mig": {"strategy": "mixed"}}).digest() != one.digest()
    assert replace(one, repo="https://mirror.example/nvidia").digest() == one.digest()


def test_one_node_shares_the_rest_do_not():
    inv = inventory(nodes="  - {name: g2, address: 10.0.0.3, gpu: {sharing: {mps: {replicas: 2}}}}\n")
    config = operator_values(inv)["devicePlugin"]["config"]
    assert config["default"] == "none" and set(config["data"]) == {"none", "mps-2"}
    assert yaml.safe_load(config["data"]["none"]) == {"version": "v1", "flags": {"migStrategy": "none"}}
    labels = node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))
    assert labels["g1"]["nvidia.com/device-plugin.config"] == "none"
    assert labels["g2"]["nvidia.com/device-plugin.config"] == "mps-2"


def test_gpu_without_mig_gets_no_mig_label():
    no_mig = replace(H200, mig_profiles=[], gpus=[replace(g, mig_current=None, mig_pending=None) for g in H200.gpus])
    inv = inventory()
    assert node_labels(inv, facts_for(inv, gpu=no_mig), gpu_nodes(inv, facts_for(inv, gpu=no_mig)))["g1"] == {}


def test_sharing_config_maps_are_valid_objects_applied_before_the_release():
    from bootstrap.cluster.components import desired_prerequisites

    inv, facts = mixed()
    objects = desired_prerequisites(inv, facts, gpu_nodes(inv, facts))
    assert [o["kind"] for o in objects] == ["Namespace", "ConfigMap", "ConfigMap"]
    for obj in objects:
        validate_object(obj)
    cpu_only = {name: CPU for name in facts}
    assert desired_prerequisites(inv, cpu_only, gpu_nodes(inv, cpu_only)) == []  # no GPU node, no operator
