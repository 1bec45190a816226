"""Cluster-side components (GPU Operator, RDMA networking, storage, Volcano) as Helm
releases and Kubernetes objects. Pure: inventory + facts in, plans out; `bootstrap.cluster.helm`
applies releases."""

from bootstrap.cluster.components.cluster_plan import (ClusterPlan, desired_manifests, desired_patches, desired_prerequisites, desired_releases, node_labels, plan_cluster)
from bootstrap.cluster.components.release import ComponentError, Patch, Release

__all__ = ["ClusterPlan", "ComponentError", "Patch", "Release", "desired_manifests", "desired_patches",
           "desired_prerequisites", "desired_releases", "node_labels", "plan_cluster"]
