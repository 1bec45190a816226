"""Storage classes: k3s's built-in local-path, csi-driver-nfs, or Longhorn; exactly one default."""

from __future__ import annotations

from bootstrap.cluster.components import trust, versions
from bootstrap.cluster.components.release import ComponentError, Patch, Release
from bootstrap.cluster.gate_rules import GATE_TOLERATION, GATE_TOLERATION_LONGHORN
from bootstrap.inventory.model import Component, Inventory

DEFAULT_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
LOCAL_PATH = "local-path"
NFS_CLASS = "nfs-csi"
NFS_NAMESPACE = "kube-system"
LONGHORN_NAMESPACE = "longhorn-system"


def _flag(on: bool) -> str:
    return "true" if on else "false"  # annotation values are strings


def local_path_patch(inventory: Inventory) -> Patch | None:
    """k3s ships `local-path` as the default class; when another class is the default, it
    must stop being one (two defaults make PVCs without a class ambiguous)."""
    disabled = "local-storage" in inventory.k3s.disable
    if disabled:
        if inventory.storage.default == LOCAL_PATH:
            raise ComponentError("storage.default is local-path but k3s.disable lists local-storage",
                                 "remove local-storage from k3s.disable, or choose nfs or longhorn")
        return None
    return Patch({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                  "metadata": {"name": LOCAL_PATH,
                               "annotations": {DEFAULT_ANNOTATION: _flag(inventory.storage.default == LOCAL_PATH)}}})


def nfs_release(inventory: Inventory) -> Release | None:
    if inventory.storage.nfs is None:
        if inventory.storage.default == "nfs":
            raise ComponentError("storage.default is nfs but storage.nfs is not set",
                                 "add storage: {nfs: {server: ..., share: ...}}")
        return None
    src = versions.source(inventory, Component.NFS_CSI)
    # The chart's defaults fit k3s (kubelet in /var/lib/kubelet); the class is ours, below. Its
    # node plugin DaemonSet tolerates every taint (values.yaml 4.13.4, node.tolerations:
    # [{operator: Exists}]), the acceptance gate's too (tests check it against the chart); its
    # ServiceAccount has no role. The controller's reads any Secret by name and creates and
    # deletes PersistentVolumes (templates/rbac-csi-nfs.yaml): on trusted nodes only.
    selector = trust.trusted_selector(inventory)
    values = {"controller": {"nodeSelector": selector}} if selector else {}
    return Release("csi-driver-nfs", NFS_NAMESPACE, src.chart, src.repo, src.version, values, src.archive)


def nfs_storage_class(inventory: Inventory) -> dict | None:
    nfs = inventory.storage.nfs
    if nfs is None:
        return None
    # Shape of csi-driver-nfs deploy/example/storageclass-nfs.yaml (v4.13.4).
    storage_class = {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": NFS_CLASS, "annotations": {DEFAULT_ANNOTATION: _flag(inventory.storage.default == "nfs")}},
        "provisioner": "nfs.csi.k8s.io",
        "parameters": {"server": nfs.server, "share": nfs.share},
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": True,
    }
    if nfs.mount_options:
        storage_class["mountOptions"] = list(nfs.mount_options)
    return storage_class


def longhorn_release(inventory: Inventory) -> Release | None:
    if inventory.storage.default != "longhorn":
        return None  # opt-in only: it needs iSCSI on every node and privileged daemons
    replicas = inventory.storage.longhorn_replicas
    src = versions.source(inventory, Component.LONGHORN)
    values = {
        "persistence": {"defaultClass": True, "defaultClassReplicaCount": replicas},
        # Volumes made outside the StorageClass (UI); the chart demands a string, and this
        # setting takes per-data-engine JSON (default '{"v1":"3","v2":"3"}').
        "defaultSettings": {"defaultReplicaCount": f'{{"v1":"{replicas}","v2":"{replicas}"}}',
                            # The system-managed components (CSI plugin, engine image, instance
                            # managers) run on a GPU node the acceptance gate still holds
                            # (values.yaml 1.12.1, defaultSettings.taintToleration).
                            "taintToleration": GATE_TOLERATION_LONGHORN},
        # The longhorn-manager DaemonSet (values.yaml 1.12.1, longhornManager.tolerations).
        "longhornManager": {"tolerations": [GATE_TOLERATION]},
    }
    selector = trust.trusted_selector(inventory)
    if selector:
        # longhorn-service-account (the manager's, the driver deployer's; templates/
        # clusterrole.yaml 1.12.1) edits ClusterRoles, ClusterRoleBindings and every Node: the
        # manager, UI and driver deployer (global.nodeSelector) and the system-managed
        # components (instance managers, CSI plugin, engine images) stay on trusted nodes, so
        # an untrusted node attaches no Longhorn volume.
        values["global"] = {"nodeSelector": selector}
        values["defaultSettings"]["systemManagedComponentsNodeSelector"] = trust.longhorn_selector_setting(inventory)
    return Release("longhorn", LONGHORN_NAMESPACE, src.chart, src.repo, src.version, values, src.archive)
