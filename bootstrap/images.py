"""The images a cluster needs before its first job, and how to tell whether a node has one.

Pure. `validate` runs these images; `up` pulls them (and `images.prepull`) on every GPU node
ahead of time, so a multi-gigabyte CUDA image is not downloaded while the checks wait.
"""

from __future__ import annotations

import re

from bootstrap.inventory.model import Inventory

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


def prepull_images(inventory: Inventory) -> list[str]:
    """Validation images first, then the inventory's, without repeats."""
    seen, result = set(), []
    for image in validation_images(inventory) + list(inventory.images.prepull):
        if normalise(image) not in seen:
            seen.add(normalise(image))
            result.append(image)
    return result


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
