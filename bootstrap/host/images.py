"""The images a cluster needs before its first job, and how to tell whether a node has one.

Pure. `validate` runs these images; the GPU Operator runs its own on every GPU node. `up`
has k3s pull them (and `images.prepull`) on every GPU node as soon as k3s runs there, in
the background (bootstrap.host.parts.k3s_images), so multi-gigabyte images download while
everything else happens; only a pod that runs one waits for it.
"""

from __future__ import annotations

import re

from bootstrap.cluster.components import versions
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Component, Inventory, Node

GPU_TEST_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
BUSYBOX = "busybox:1.36"
NCCL_IMAGE = "ghcr.io/coreweave/nccl-tests:12.4.1-cudnn-devel-ubuntu22.04-nccl2.21.5-1-85f9143"


def validation_images(inventory: Inventory) -> list[str]:
    images = []
    if inventory.validate.gpu_pod:
        images.append(inventory.validate.image or GPU_TEST_IMAGE)
    images.append(BUSYBOX)  # the PVC writer and the gang job's members
    nccl = inventory.validate.nccl
    if nccl is not None and nccl.enabled:
        images.append(nccl.image or NCCL_IMAGE)
    return images


# What the GPU Operator chart runs on a GPU node, per chart version: its values.yaml
# (<section>.repository/image:version; a missing version is the chart's appVersion, which
# NVIDIA sets to the chart version) and the node-feature-discovery subchart (Chart.yaml
# dependency; its image tag is v<chart version>). tests/unit/host/test_images.py checks this
# table against the upstream chart. Only what the defaults enable for container workloads:
# the sandbox-workload parts (vfio, vGPU, kata, confidential computing) are off unless
# sandboxWorkloads.enabled, and dcgm, gds, gdrcopy are off by default.
GPU_OPERATOR_IMAGES: dict[str, dict[str, str]] = {
    "v26.7.0": {
        "validator": "nvcr.io/nvidia/gpu-operator:v26.7.0",  # the validator and the operator itself
        "device_plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",  # also GPU feature discovery
        "dcgm_exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
        "mig_manager": "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0",
        "nfd": "registry.k8s.io/nfd/node-feature-discovery:v0.19.0",
        "toolkit": "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0",  # when the toolkit runs in the cluster
        "driver_manager": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",  # driver: operator
        # driver: operator; the operator tags it <version>-<os id><os version> (ubuntu24.04)
        "driver": "nvcr.io/nvidia/driver:595.91.07",
    },
}


def gpu_operator_images(inventory: Inventory, os_id: str | None = None,
                        os_version_id: str | None = None) -> list[str]:
    """The GPU Operator's images a GPU node will run, for the chart version this cluster
    installs and its driver mode; none for a chart version the table does not know (a pin
    of `charts.gpu_operator`). The driver image only with the node's OS (its tag names it)."""
    table = GPU_OPERATOR_IMAGES.get(versions.source(inventory, Component.GPU_OPERATOR).version)
    if table is None:
        return []
    images = [table[k] for k in ("validator", "device_plugin", "dcgm_exporter", "mig_manager", "nfd")]
    if inventory.gpu.driver == "operator":  # the driver and the toolkit run in the cluster
        images += [table["toolkit"], table["driver_manager"]]
        if os_id and os_version_id and re.fullmatch(r"[a-z0-9._-]+", os_id + os_version_id):
            images.append(f"{table['driver']}-{os_id}{os_version_id}")
    return images


def prepull_images(inventory: Inventory, os_id: str | None = None, os_version_id: str | None = None) -> list[str]:
    """What a GPU node should hold: validation images first, then the inventory's, then the
    GPU Operator's, without repeats."""
    seen, result = set(), []
    for image in validation_images(inventory) + list(inventory.images.prepull) + \
            gpu_operator_images(inventory, os_id, os_version_id):
        if normalise(image) not in seen:
            seen.add(normalise(image))
            result.append(image)
    return result


def downloads_in_progress(inventory: Inventory, facts_by_node: dict[str, HostFacts],
                          gpu: list[Node]) -> dict[str, list[str]]:
    """Per GPU node, what it should hold and its k3s does not yet: the pulls still going on."""
    wanted = {n.name: prepull_images(inventory, facts_by_node[n.name].os_id, facts_by_node[n.name].os_version_id)
              for n in gpu if n.name in facts_by_node}  # a host that did not answer the later probe: unknown
    return still_downloading(wanted, {name: facts.images for name, facts in facts_by_node.items()})


def download_lines(inventory: Inventory, facts_by_node: dict[str, HostFacts], gpu: list[Node]) -> list[str]:
    """For `up`'s output: one line per GPU node still downloading (the pods that run one of
    these images wait for it; nothing else does)."""
    return [f"images: {name} is still downloading {len(refs)} in the background (k3s logs a failed pull): "
            f"{', '.join(refs)}"
            for name, refs in downloads_in_progress(inventory, facts_by_node, gpu).items()]


def still_downloading(wanted: dict[str, list[str]], present: dict[str, tuple[str, ...] | None]) -> dict[str, list[str]]:
    """Per node, the wanted images its k3s does not hold yet (a node whose store could not
    be read is left out: nothing can be said about it)."""
    return {name: missing(images, present[name]) for name, images in sorted(wanted.items())
            if present.get(name) is not None and missing(images, present[name])}


def normalise(ref: str) -> str:
    """The full name containerd stores: docker.io/library/busybox:latest for `busybox`."""
    name, digest = (ref.split("@", 1) + [""])[:2]
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and not digest:
        name += ":latest"
    first = name.split("/", 1)[0]
    if "/" not in name or not re.search(r"[.:]|^localhost$", first):
        name = "docker.io/" + (name if "/" in name else "library/" + name)
    return f"{name}@{digest}" if digest else name


def repository(ref: str) -> str:
    """The name without tag or digest: ghcr.io/x/y for ghcr.io/x/y:1 or ghcr.io/x/y@sha256:..."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def missing(wanted: list[str], present: tuple[str, ...] | None) -> list[str]:
    """Images of `wanted` a node does not hold; all of them when its store is unknown.
    A reference by digest counts as held when its repository is: crictl lists digests
    shortened, so they cannot be compared."""
    if present is None:
        return list(wanted)
    have = {normalise(p) for p in present}
    repositories = {repository(p) for p in have}
    return [image for image in wanted
            if (repository(normalise(image)) not in repositories if "@" in image else normalise(image) not in have)]
