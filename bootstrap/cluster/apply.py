"""`up`, cluster side: nodes Ready, labels and taints, the components, MIG settled.

Helm is called only for releases whose version or values changed since the last apply
(their digests are kept in the cluster, in kube-system/bootstrap-releases).
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

from bootstrap.cluster.node_status import node_ready
from bootstrap.cluster import helm
from bootstrap.cluster.client import (UNREAD, Cluster, ClusterError, apply_object, get, get_all, merge_patch, object_path, path_of,
                                      request, wait_for)
from bootstrap.cluster.drain import CORDONED_FOR_UPGRADE, cordoned_for_upgrade, uncordon
from bootstrap.cluster.components import gpu_operator, gpu_sharing
from bootstrap.cluster.gate_rules import may_hold, without_gate
from bootstrap.inventory.model import Inventory

DIGESTS = ("kube-system", "bootstrap-releases")
NODE_TIMEOUT_S = 300
MIG_TIMEOUT_S = 900
MIG_POLL_S = 2.0
MIG_WHY = 300  # characters of a node's MIG state and reason kept (the node writes them)


NODES = "/api/v1/nodes"


def wait_nodes_ready(cluster: Cluster, names: list[str], timeout_s: float = NODE_TIMEOUT_S,
                     first: dict | None = None) -> dict[str, dict]:
    """`first`: the node list as just read, for the first look."""
    seen = [first] if first is not None else []

    def check():
        listed = seen.pop() if seen else get(cluster, NODES)
        nodes = {n["metadata"]["name"]: n for n in (listed or {}).get("items", [])}
        missing = [n for n in names if n not in nodes or not node_ready(nodes[n])]
        check.last = f"not Ready: {', '.join(missing)}" if missing else None
        return nodes if not missing else None
    check.last = None
    # Just joined, a node is Ready a moment later (its kubelet's next status): look again soon.
    return wait_for(f"nodes {', '.join(names)} to be Ready", check, timeout_s, first_interval_s=0.25)


def taint_dict(taint: str) -> dict:
    key_value, effect = taint.rsplit(":", 1)
    key, _, value = key_value.partition("=")
    return {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}


def label_and_taint(cluster: Cluster, inventory: Inventory, nodes: dict[str, dict],
                    labels: dict[str, dict[str, str]]) -> list[str]:
    changed = []
    for node in inventory.nodes:
        current = nodes.get(node.name)
        if current is None:
            continue
        have = current["metadata"].get("labels", {})
        want = {k: v for k, v in labels.get(node.name, {}).items() if have.get(k) != v}
        taints = list(current.get("spec", {}).get("taints", []) or [])
        if not may_hold(node):
            # A server registered gated by an earlier version (or gated by `health --cordon`):
            # opened before the releases, whose Deployments may have nowhere else to run.
            taints = without_gate(taints)
        for taint in map(taint_dict, node.taints):
            if not any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"] for t in taints):
                taints.append(taint)
        patch: dict = {}
        if want:
            patch["metadata"] = {"labels": want}
        if taints != (current.get("spec", {}).get("taints") or []):
            patch["spec"] = {"taints": taints}
        if patch:
            merge_patch(cluster, f"/api/v1/nodes/{node.name}", patch)
            changed.append(node.name)
    return changed


DIGESTS_PATH = object_path("v1", "ConfigMap", DIGESTS[1], DIGESTS[0])


def digests_in(found: dict | None) -> dict[str, str]:
    return dict((found or {}).get("data") or {})


def read_digests(cluster: Cluster) -> dict[str, str]:
    return digests_in(get(cluster, DIGESTS_PATH))


class DigestRecord:
    """The ConfigMap that records each applied release's digest, written one release at a
    time: a merge patch of that release's key once the record exists (one request, no read
    first, and releases of a wave that finish together cannot undo each other's entries),
    else the record created with it. `exists`: as the cluster side read it."""

    def __init__(self, cluster: Cluster, exists: bool):
        self.cluster, self.exists = cluster, exists

    def record(self, name: str, digest: str) -> None:
        data = {"data": {name: digest}}
        if self.exists:
            status, body = self._patch(data)
            if status != 404:  # (deleted meanwhile: created below)
                return self._raise_unless_ok(status, body)
        status, body = request(self.cluster, "POST", object_path("v1", "ConfigMap", None, DIGESTS[0]),
                               {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": DIGESTS[1], "namespace": DIGESTS[0]}, **data})
        self.exists = True
        if status == 409:  # created meanwhile (another run): patched, once
            status, body = self._patch(data)
        self._raise_unless_ok(status, body)

    def _patch(self, data: dict):
        return request(self.cluster, "PATCH", DIGESTS_PATH, data, content_type="application/merge-patch+json")

    @staticmethod
    def _raise_unless_ok(status: int, body: dict) -> None:
        if status >= 300:
            raise ClusterError(f"cannot record the applied releases in ConfigMap {DIGESTS[0]}/{DIGESTS[1]}: "
                               f"{body.get('message', status)}")


def restart_device_plugin(cluster: Cluster) -> None:
    """The operator does not watch its device plugin ConfigMap: roll the plugin by hand."""
    path = "/apis/apps/v1/namespaces/gpu-operator/daemonsets/nvidia-device-plugin-daemonset"
    if get(cluster, path) is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        merge_patch(cluster, path, {"spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": stamp}}}}})


def wait_mig(cluster: Cluster, wanted: dict[str, str], timeout_s: float = MIG_TIMEOUT_S) -> dict[str, str]:
    """Wait for MIG Manager's verdict on each node (its label nvidia.com/mig.config.state);
    returns the nodes whose layout did not apply, each with why. A node's labels are its own
    answer (its agent may write them), so one node's `failed`, or one that never settles by
    the deadline, is that node's failure: the wait for the others goes on."""
    pending, failed = dict(wanted), {}
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while pending:
        for name, layout in list(pending.items()):
            node = get(cluster, f"/api/v1/nodes/{name}") or {}
            labels = (node.get("metadata") or {}).get("labels") or {}
            states[name] = str(labels.get(gpu_sharing.MIG_STATE_LABEL, "unset"))[:MIG_WHY]
            if states[name] == "success":
                del pending[name]
            elif states[name] == "failed":
                reason = ((node.get("metadata") or {}).get("annotations") or {}).get(
                    "nvidia.com/mig.config.state.reason") or "see the nvidia-mig-manager pod's log"
                failed[name] = f"MIG layout {layout} failed on {name}: {str(reason)[:MIG_WHY]}"
                del pending[name]
        if pending and time.monotonic() > deadline:
            break
        if pending:
            time.sleep(MIG_POLL_S)
    for name, layout in pending.items():
        failed[name] = (f"MIG layout {layout} not applied on {name} after {timeout_s:.0f}s "
                        f"({gpu_sharing.MIG_STATE_LABEL}={states.get(name, 'unset')})")
    return failed


def untraced(name: str):
    return contextlib.nullcontext()


def apply_cluster(cluster: Cluster, inventory: Inventory, plan, say=print,
                  wait_for: list[str] | None = None, trace=untraced, prefetched: dict | None = None) -> dict:
    """Converge the cluster side to `plan` (or what `plan()` returns, asked once the nodes
    are Ready); returns what changed (for the summary), and under "compared" the paths read to
    compare (what a later run may read ahead: warm_connections).
    `wait_for`: the nodes that must be Ready first (default: every node of the inventory);
    `trace(name)`: a context manager around each part (bootstrap.progress.phase);
    `prefetched`: objects read a moment ago ({path: object or None}), taken instead of reading
    them again (a run whose hosts did not change: nothing it did can have changed them)."""
    summary = {"labelled": [], "objects": [], "releases": []}
    def compared(plan) -> list[str]:
        """Everything a converged cluster is compared with. What is read of the manifests
        and patches counts only while no release has been installed since."""
        return [DIGESTS_PATH] + [path_of(o) for o in plan.prerequisites] + [path_of(o) for o in plan.manifests] \
            + [path_of(p.body) for p in plan.patches]

    seen: dict = {}
    read_early = not callable(plan)
    if read_early:  # known already (a converged host side): the node list and the rest at once
        with trace("cluster: read objects"):
            known = prefetched or {}
            wanted = [NODES] + compared(plan)
            seen = {path: known[path] for path in wanted if path in known}
            seen.update(get_all(cluster, [path for path in wanted if path not in known]))
    with trace("cluster: nodes Ready"):
        nodes = wait_nodes_ready(cluster, [n.name for n in inventory.nodes] if wait_for is None else wait_for,
                                 first=seen.pop(NODES, None))
    if not read_early:
        plan = plan()
    labels = plan.labels
    summary["labelled"] = label_and_taint(cluster, inventory, nodes, labels)
    # A rolling upgrade that stopped and was fixed by hand: its cordons, now the node is back.
    for name in cordoned_for_upgrade(n for n in nodes.values() if node_ready(n)):
        uncordon(cluster, name, CORDONED_FOR_UPGRADE)
        summary["objects"].append(f"Node {name} uncordoned (cordoned for an upgrade, Ready again)")
    if not read_early:
        with trace("cluster: read objects"):
            seen = get_all(cluster, compared(plan))
    plugin_config_changed = False
    for obj in plan.prerequisites:
        result = apply_object(cluster, obj, seen[path_of(obj)])
        if result != "unchanged":
            summary["objects"].append(f"{obj['kind']} {obj['metadata']['name']} {result}")
            plugin_config_changed |= obj["metadata"]["name"] == gpu_operator.DEVICE_PLUGIN_CONFIGMAP
    digests = digests_in(seen[DIGESTS_PATH])
    todo = helm.releases_to_apply(plan.releases, digests)
    version = helm.check_version() if todo else None
    new = {r.name: version for r in todo if helm.release_state(r, digests) == helm.NOT_INSTALLED}
    summary["releases"] = install_releases(cluster, todo, DigestRecord(cluster, seen[DIGESTS_PATH] is not None),
                                           say, trace, new, version)
    # After an install, what the releases may have changed is read again, all at once.
    fresh = get_all(cluster, [path_of(o) for o in plan.manifests] + [path_of(p.body) for p in plan.patches]) \
        if todo else seen
    for obj in plan.manifests:
        result = apply_object(cluster, obj, fresh.get(path_of(obj), UNREAD))
        if result != "unchanged":
            summary["objects"].append(f"{obj['kind']} {obj['metadata']['name']} {result}")
    for patch in plan.patches:
        summary["objects"] += apply_patch(cluster, patch, fresh.get(path_of(patch.body), UNREAD))
    if plugin_config_changed and gpu_operator.RELEASE not in summary["releases"]:
        restart_device_plugin(cluster)
    mig = {name: node_labels[gpu_sharing.MIG_LABEL] for name, node_labels in labels.items()
           if node_labels.get(gpu_sharing.MIG_LABEL, gpu_sharing.MIG_DISABLED) != gpu_sharing.MIG_DISABLED}
    # The gate keeps these gated; `up` ends with exit 1. A layout the plan could not spell out
    # from its node's own table is that node's failure already, not waited for.
    unbuilt = plan.mig_failed
    summary["mig_failed"] = {**unbuilt, **wait_mig(cluster, {n: l for n, l in mig.items() if n not in unbuilt})}
    summary["nodes"] = nodes  # as read: the acceptance gate (flows.gate) reads their taints, no second GET
    summary["compared"] = [NODES] + compared(plan)
    return summary


# The CNI first, one chart after the other (cluster_plan's order: rke2-multus's CRDs, then
# Multus, before anything that starts pods); every other release needs none of another's
# objects (the custom resources that tie them together are applied after all releases).
CNI_FIRST = ("multus-crd", "multus")


def release_waves(releases: list) -> list[list]:
    """The releases in groups that may be installed at once, in order."""
    first = [[r] for r in releases if r.name in CNI_FIRST]
    rest = [r for r in releases if r.name not in CNI_FIRST]
    return first + ([rest] if rest else [])


def install_releases(cluster: Cluster, todo: list, digests: DigestRecord, say, trace=untraced,
                     new: dict | None = None, version: tuple | None = None) -> list[str]:
    """`helm upgrade --install --wait` each release; a wave's releases at once, so the
    critical path is its slowest release, not their sum (each waits for its own pods). A
    release's digest is recorded as soon as it is done; the first failure is raised once its
    wave has ended (the others' digests are kept, so a re-run skips them)."""
    done: list[str] = []
    for wave in release_waves(todo):
        for release in wave:
            how = "install" if (new or {}).get(release.name) else "upgrade --install"
            say(f"  helm {how} {release.name} {release.chart} {release.version}")
        errors = []
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            futures = [(release, pool.submit(_traced_install, release, cluster.kubeconfig, trace,
                                             (new or {}).get(release.name), version, say)) for release in wave]
            for release, future in futures:
                try:
                    future.result()
                except Exception as exc:  # HelmError and the like: reported after the wave
                    errors.append(exc)
                    continue
                digests.record(release.name, release.digest())
                done.append(release.name)
        if errors:
            raise errors[0]
    return done


def _traced_install(release, kubeconfig, trace, new_with=None, version=None, say=None) -> None:
    """`version`: Helm's, read once for the run (its upgrade flags); `say`: what a recovery of a
    release a killed Helm left pending did (helm.recover_pending)."""
    with trace(f"cluster: helm {release.name}"):
        helm.upgrade_install(release, kubeconfig, new_with=new_with, version=version, say=say)


def apply_patch(cluster: Cluster, patch, current=UNREAD) -> list[str]:
    body = patch.body
    path = path_of(body)
    if current is UNREAD:
        current = get(cluster, path)
    if current is None:
        return []  # e.g. local-path disabled: nothing to mark
    wanted = body["metadata"].get("annotations", {})
    if all(current.get("metadata", {}).get("annotations", {}).get(k) == v for k, v in wanted.items()):
        return []
    merge_patch(cluster, path, {"metadata": {"annotations": wanted}})
    return [f"{body['kind']} {body['metadata']['name']} patched"]
