"""The one table of what each cluster component installs by default, and where from.

Every entry can be pinned per cluster with `charts: {<component>: <version>}` in the
inventory (the keys are the inventory's component names). Versions are passed to Helm
verbatim: charts differ in whether they carry a `v` prefix (gpu-operator `v26.7.0`,
csi-driver-nfs `4.13.4` since 4.11.0), so we never add or strip one for the user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bootstrap.cluster.components.release import ComponentError
from bootstrap.inventory.model import Component, Inventory


@dataclass(frozen=True)
class Source:
    chart: str | None  # None: not a chart; we render plain manifests (see `image`)
    repo: str | None  # an https chart repository or an oci:// registry
    version: str
    image: str | None = None  # for plain manifests: the image the version tags
    archive: str | None = None  # a local chart archive (absolute path) instead of the repository


# One entry per Component (tests check none is missing).
DEFAULTS: dict[Component, Source] = {
    Component.GPU_OPERATOR: Source("gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "v26.7.0"),
    # Multus with the whereabouts IPAM subchart (`rke2-whereabouts`), the chart k3s documents.
    Component.MULTUS: Source("rke2-multus", "https://rke2-charts.rancher.io", "v4.3.017"),
    # Mellanox publishes no chart for the plugin; we render its DaemonSet + ConfigMap
    # (modelled on deployment/k8s/base/ at network-operator-v26.1.1, identical at v1.5.3).
    Component.RDMA_SHARED_DEVICE_PLUGIN: Source(None, None, "v1.5.3", image="ghcr.io/mellanox/k8s-rdma-shared-dev-plugin"),
    Component.NFS_CSI: Source("csi-driver-nfs", "https://raw.githubusercontent.com/kubernetes-csi/csi-driver-nfs/master/charts",
                      "4.13.4"),
    Component.LONGHORN: Source("longhorn", "https://charts.longhorn.io", "1.12.1"),
    Component.VOLCANO: Source("volcano", "https://volcano-sh.github.io/helm-charts", "1.15.1"),
}

# From rke2-multus v4.3.009 the NetworkAttachmentDefinition and whereabouts CRDs live in a
# separate chart, rke2-multus-crd, released with the same number without the `v`
# (rancher/rke2-charts PR #1116: charts/rke2-multus/rke2-multus-crd/4.3.009/templates holds
# the whereabouts CRDs; rke2 itself bundled it from v4.3.010, rancher/rke2 PR #10998).
MULTUS_CRD_CHART = "rke2-multus-crd"
MULTUS_CRD_SPLIT = (4, 3, 9)


def source(inventory: Inventory, component: str) -> Source:
    default = DEFAULTS[component]
    pin = inventory.charts.get(component)
    if pin is None:
        return default
    archive = None
    if pin.archive:
        path = Path(pin.archive).expanduser()
        archive = str(path if path.is_absolute() else Path(inventory.source).parent / path)
    return Source(default.chart, pin.repo or default.repo, pin.version, default.image, archive)


def multus_crd_source(multus: Source) -> Source | None:
    """rke2-multus-crd for this rke2-multus (None before the split): the same number without
    the `v`, from the same repository, or `helm package`'s NAME-VERSION.tgz beside an archive."""
    if version_tuple(multus.version) < MULTUS_CRD_SPLIT:
        return None
    version = multus.version.lstrip("v")
    archive = None if multus.archive is None else str(Path(multus.archive).parent / f"{MULTUS_CRD_CHART}-{version}.tgz")
    return Source(MULTUS_CRD_CHART, multus.repo, version, archive=archive)


def version_tuple(version: str) -> tuple[int, int, int]:
    """`v26.7.0` -> (26, 7, 0); `v4.3.017` -> (4, 3, 17); suffixes like `-rc1` are ignored."""
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise ComponentError(f"cannot read chart version {version!r}", "write it as MAJOR.MINOR.PATCH, e.g. v26.7.0")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]
