"""Removing a Node from the cluster, the one way `rebuild` and `scale-down` both do it.

A server leaves through k3s's etcd member controller (never a force-delete of its member):
on `etcd.k3s.cattle.io/remove=true` the leader's controller removes the member named by the
node's etcd annotations and marks it `etcd.k3s.cattle.io/removed-node-name` (k3s-io/k3s
pkg/etcd/member_controller.go, sync), and only then its Node goes; its node-password secret
goes too, so a replacement may reuse the name (k3s keeps one password per node name).

The caller makes sure k3s no longer runs on the host (a lost machine in `rebuild`; stopped
and disabled first in `scale-down`): a k3s that starts again joins again, as a new etcd
member (see bootstrap.flows.scale_down)."""

from __future__ import annotations

from bootstrap.cluster.client import Cluster, get, merge_patch, request, wait_for

REMOVE_ANNOTATION = "etcd.k3s.cattle.io/remove"
REMOVED_ANNOTATION = "etcd.k3s.cattle.io/removed-node-name"
MEMBER_REMOVAL_TIMEOUT_S = 120


def remove_node(cluster: Cluster, name: str, *, etcd_member: bool) -> None:
    path = f"/api/v1/nodes/{name}"
    if etcd_member:
        merge_patch(cluster, path, {"metadata": {"annotations": {REMOVE_ANNOTATION: "true"}}})

        def member_gone():
            node = get(cluster, path)
            return node is None or REMOVED_ANNOTATION in node.get("metadata", {}).get("annotations", {})

        wait_for(f"etcd to remove member {name}", member_gone, MEMBER_REMOVAL_TIMEOUT_S)
    request(cluster, "DELETE", path)
    request(cluster, "DELETE", f"/api/v1/namespaces/kube-system/secrets/{name}.node-password.k3s")
