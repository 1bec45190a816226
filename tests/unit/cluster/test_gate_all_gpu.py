"""A cluster of GPU machines only comes up: the taints the tool plans for each node (its
config.yaml's node-taint: the inventory's `taints:` and the acceptance gate's) leave every
Deployment it installs, and each of k3s's own add-ons, a node to run on. The Deployments'
tolerations are the charts' own values.yaml (../shared/upstream) with the tool's values over
them, as Helm merges them; k3s's add-ons' are quoted from its manifests below. The stand-in
API marks a Deployment ready without placing its pods, so only this test sees a deadlock."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import yaml
from test_components import CPU, H200, chart_defaults, load_yaml
from test_gate_rules import longhorn_setting_tolerations, lookup, tolerates

from bootstrap.cluster.checks import CheckResult
from bootstrap.cluster.components import desired_releases
from bootstrap.cluster.gate_rules import FAILED_OPEN, GATE_KEY, GATE_REASON, decide, may_hold, node_state
from bootstrap.host.parts import k3s_service
from bootstrap.host.plan.all_hosts import make_plans
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.host.release import online_artifacts
from bootstrap.inventory.loader import load_inventory, parse_inventory
from bootstrap.topology import resolve_topology
from repo_paths import ROOT

TOKENS = JoinTokens("tok", "agent-tok")

# k3s-io/k3s manifests/coredns.yaml (commit 66c487bd), metrics-server/metrics-server-deployment.yaml
# (63f2211b), local-storage.yaml (d804db30) and traefik.yaml's valuesContent (68de3872): the
# same three tolerations in each.
K3S_ADDON_TOLERATIONS = [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                         {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                         {"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"}]
K3S_ADDONS = {"coredns": "coredns", "metrics-server": "metrics-server",
              "local-path-provisioner": "local-storage", "traefik": "traefik"}  # Deployment: its k3s `disable` name

# Each chart's Deployments: (values path that turns it on, or None; the values paths its pods
# take tolerations from, all of them; the first of a "a|b" pair that is set). A Longhorn
# "setting:" path is a taintToleration setting (`kubectl taint` syntax), not a list.
CHART_DEPLOYMENTS = {
    "gpu-operator": {  # values.yaml v26.7.0; NFD: charts/node-feature-discovery/values.yaml
        "gpu-operator": (None, ["operator.tolerations"]),
        "nfd-master": ("node-feature-discovery.master.enable", ["node-feature-discovery.master.tolerations"]),
        "nfd-gc": ("node-feature-discovery.gc.enable", ["node-feature-discovery.gc.tolerations"]),
    },
    "volcano": {  # values.yaml 1.15.1: a component's own tolerations, else custom.default_tolerations
        f"volcano-{part}": (f"custom.{key}_enable", [f"custom.{key}_tolerations|custom.default_tolerations"])
        for part, key in (("scheduler", "scheduler"), ("controllers", "controller"), ("admission", "admission"))
    },
    "csi-driver-nfs": {"csi-nfs-controller": (None, ["controller.tolerations"])},  # values.yaml 4.13.4
    "longhorn": {  # values.yaml 1.12.1: global.tolerations for the user-deployed ones
        "longhorn-driver-deployer": (None, ["global.tolerations", "longhornDriver.tolerations"]),
        "longhorn-ui": (None, ["global.tolerations", "longhornUI.tolerations"]),
        "csi-attacher/provisioner/resizer/snapshotter": (None, ["setting:defaultSettings.taintToleration"]),
    },
}


def helm_merged(defaults: dict, ours: dict) -> dict:
    """Helm's coalescing of `--values` over a chart's values.yaml: maps merge, anything else
    (a list of tolerations too) is replaced whole."""
    out = copy.deepcopy(defaults)
    for key, value in ours.items():
        out[key] = helm_merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def defaults_of(chart: str) -> dict:
    defaults = chart_defaults(chart)
    if chart == "gpu-operator":  # the subchart's values under the parent's `node-feature-discovery:`
        sub = load_yaml("gpu-operator/v26.7.0/charts/node-feature-discovery/values.yaml")
        defaults["node-feature-discovery"] = helm_merged(sub, defaults["node-feature-discovery"])
    return defaults


def tolerations_at(values: dict, path: str) -> list[dict]:
    if path.startswith("setting:"):
        return longhorn_setting_tolerations(lookup(values, path.removeprefix("setting:")))
    for choice in path.split("|"):
        found = lookup(values, choice)
        if found:
            return list(found)
    return []


def deployments(inv, facts) -> dict[str, list[dict]]:
    """Every Deployment the cluster gets, with the tolerations its pods carry."""
    out = {name: K3S_ADDON_TOLERATIONS for name, disable in K3S_ADDONS.items() if disable not in inv.k3s.disable}
    gpu = resolve_topology(inv, facts).gpu_nodes_of(inv)
    for release in desired_releases(inv, facts, gpu):
        values = helm_merged(defaults_of(release.chart), release.values)
        for name, (switch, paths) in CHART_DEPLOYMENTS.get(release.chart, {}).items():
            if switch is None or lookup(values, switch):
                out[f"{release.name}/{name}"] = [t for p in paths for t in tolerations_at(values, p)]
    return out


def planned_taints(inv, facts) -> dict[str, list[dict]]:
    """Each node's taints as its planned config.yaml registers it (node-taint, key=value:effect)."""
    artifacts = {"amd64": online_artifacts(inv.k3s.version, "amd64")}
    plans = make_plans(inv, facts, TOKENS, artifacts, "0123456789abcdef").plans
    out = {}
    for name, plan in plans.items():
        (config,) = [u for u in plan.uploads if u.path == k3s_service.CONFIG]
        flags = yaml.safe_load(config.content).get("node-taint") or []
        out[name] = [{"key": k, "value": v, "effect": e}
                     for k, v, e in ((*f.rsplit(":", 1)[0].partition("=")[::2], f.rsplit(":", 1)[1]) for f in flags)]
    return out


def schedulable(tolerations: list[dict], taints: list[dict]) -> bool:
    """kube-scheduler's TaintToleration filter: every NoSchedule/NoExecute taint tolerated."""
    return all(any(tolerates(t, taint) for t in tolerations) for taint in taints
               if taint["effect"] in ("NoSchedule", "NoExecute"))


THREE_SERVERS = """\
cluster: all-gpu
k3s: {version: v1.33.5+k3s1}
gpu: {gate: {enabled: true}}
storage: {default: %s, nfs: {server: 10.0.0.50, share: /srv/nfs}}
nodes:
  - {name: s1, address: 10.0.0.1, role: server}
  - {name: s2, address: 10.0.0.2, role: server}
  - {name: s3, address: 10.0.0.3, role: server}
  - {name: a1, address: 10.0.0.11}
  - {name: a2, address: 10.0.0.12, taints: ["nvidia.com/gpu=true:NoSchedule"]}
"""


def all_gpu(name: str):
    if name == "minimal":
        inv = load_inventory(ROOT / "inventories" / "minimal.yaml")
        inv = replace(inv, k3s=replace(inv.k3s, version="v1.33.5+k3s1"))
    else:
        inv = parse_inventory(THREE_SERVERS % ("longhorn" if name == "3-servers-longhorn" else "nfs"), "inv.yaml")
    return inv, {node.name: H200 for node in inv.nodes}


@pytest.mark.parametrize("name", ["minimal", "3-servers-nfs", "3-servers-longhorn"])
def test_on_a_cluster_of_gpu_machines_only_every_deployment_has_a_node(name):
    inv, facts = all_gpu(name)
    assert {n.name for n in resolve_topology(inv, facts).gpu_nodes_of(inv)} == {n.name for n in inv.nodes}
    taints = planned_taints(inv, facts)
    workloads = deployments(inv, facts)
    expected = {"coredns", "metrics-server", "local-path-provisioner", "traefik", "gpu-operator/gpu-operator",
                "gpu-operator/nfd-master", "gpu-operator/nfd-gc", "volcano/volcano-scheduler",
                "volcano/volcano-controllers", "volcano/volcano-admission"}
    expected |= {"csi-driver-nfs/csi-nfs-controller"} if inv.storage.nfs else set()
    expected |= {"longhorn/longhorn-driver-deployer", "longhorn/longhorn-ui"} if "longhorn" in name else set()
    assert set(workloads) >= expected
    stuck = [workload for workload, tolerations in workloads.items()
             if not any(schedulable(tolerations, node_taints) for node_taints in taints.values())]
    assert not stuck, f"no node for {stuck}: the nodes' taints {taints}"
    # The gate still holds every GPU agent; no server.
    gated = {node for node, node_taints in taints.items() if any(t["key"] == GATE_KEY for t in node_taints)}
    assert gated == {n.name for n in inv.nodes if may_hold(n)} == {n.name for n in inv.agents}


def test_the_gate_alone_is_what_would_deadlock_it():
    """The check above sees the deadlock: with the gate's taint on the servers too, the GPU
    Operator's Deployment (the control-plane taint only) has nowhere to run."""
    inv, facts = all_gpu("3-servers-nfs")
    gate = {"key": GATE_KEY, "value": "pending", "effect": "NoSchedule"}
    everywhere_gated = {node: taints + ([gate] if node.startswith("s") else [])
                        for node, taints in planned_taints(inv, facts).items()}
    operator = deployments(inv, facts)["gpu-operator/gpu-operator"]
    assert not [node for node in everywhere_gated if schedulable(operator, everywhere_gated[node])]


def test_a_cpu_server_with_gpu_agents_keeps_the_agents_gated():
    inv, _ = all_gpu("3-servers-nfs")
    facts = {n.name: (CPU if n.role == "server" else H200) for n in inv.nodes}
    taints = planned_taints(inv, facts)
    assert {node for node, ts in taints.items() if any(t["key"] == GATE_KEY for t in ts)} == {"a1", "a2"}


def test_a_servers_failure_is_reported_but_does_not_hold_it():
    results = [CheckResult("gpu-health", "FAIL", "Xid 79", "s1"), CheckResult("gpu-health", "FAIL", "Xid 79", "a1")]
    inv, _ = all_gpu("3-servers-nfs")
    server, agent = (decide(n.name, results, holds=may_hold(n)) for n in (inv.node("s1"), inv.node("a1")))
    assert not server.passed and not server.held and server.annotation == "gpu-health: Xid 79"
    assert not agent.passed and agent.held
    assert not decide("s2", results, holds=False).held and not decide("a2", results).held  # both passed


def test_status_shows_a_server_that_failed_but_takes_workloads():
    from test_host_phase_flow import healthy_host  # imported here: the flows' fixtures, only this test

    from bootstrap.flows.inspection import node_row, render_status

    inv, _ = all_gpu("3-servers-nfs")
    failed_open = {"metadata": {"annotations": {GATE_REASON: "gpu-health: Xid 79\x1b[2J"}}, "spec": {},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    state, reason = node_state(failed_open)
    assert state == FAILED_OPEN and reason.startswith("gpu-health: Xid 79") and "\x1b" not in reason
    row = node_row(inv.node("s1"), healthy_host("s1"), failed_open)
    text = "\n".join(render_status({"cluster": "t", "state_dir": "s", "api": True, "nodes": [row], "components": {},
                                    "inventory_as_applied": None, "newest_snapshot": None}))
    assert "Ready,gated" not in text and "\x1b" not in text
    assert "gate s1: failed, takes workloads all the same (a server is never gated): gpu-health: Xid 79" in text
