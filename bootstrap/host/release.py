"""Where the k3s binary (and its images) come from: the air-gap folder, or the official release.

Both paths end in the same place: a binary at bootstrap.host.parts.k3s_binary.PATH whose sha256 matches the
release's checksum file. Only "where does the binary come from" differs.
"""

from __future__ import annotations

import hashlib
import re
import urllib.request
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bootstrap.errors import UsageError
from bootstrap.host.parts.k3s_binary import release_name
from bootstrap.inventory.model import Inventory

RELEASES = "https://github.com/k3s-io/k3s/releases/download"
CHANNELS = "https://update.k3s.io/v1-release/channels"


@dataclass(frozen=True)
class LocalFile:
    path: Path
    sha256: str
    size: int = 0


@dataclass(frozen=True)
class K3sArtifacts:
    """For one architecture: a local binary (air-gap) or a download URL plus its checksum."""

    arch: str
    version: str | None  # None only for an air-gap binary of unknown version
    binary: LocalFile | None = None
    images: tuple[LocalFile, ...] = ()  # image archives k3s imports at start (agent/images)
    download_url: str | None = None
    checksums_url: str | None = None

    @property
    def binary_sha256(self) -> str | None:
        return self.binary.sha256 if self.binary else None


@lru_cache(maxsize=None)
def sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_file(path: Path) -> LocalFile:
    stat = path.stat()
    return LocalFile(path, sha256_of(path, stat.st_size, stat.st_mtime_ns), stat.st_size)


def read_checksums(folder: Path, arch: str) -> dict[str, str]:
    sums = folder / f"sha256sum-{arch}.txt"
    if not sums.exists():
        return {}
    result = {}
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            result[parts[1].lstrip("*")] = parts[0]
    return result


def airgap_folder(inventory: Inventory) -> Path:
    """k3s.airgap, relative to the inventory file."""
    folder = Path(inventory.k3s.airgap).expanduser()
    return folder if folder.is_absolute() else (Path(inventory.source).parent / folder).resolve()


def airgap_artifacts(inventory: Inventory, arch: str) -> K3sArtifacts:
    folder = airgap_folder(inventory)
    name = release_name(arch)
    binary_path = folder / name
    if not binary_path.is_file():
        raise UsageError(f"k3s.airgap: no {name} in {folder} for the {arch} hosts",
                         f"put the k3s release binary for {arch} there, named {name}")
    binary = local_file(binary_path)
    checksums = read_checksums(folder, arch)
    if name in checksums and checksums[name] != binary.sha256:
        raise UsageError(f"k3s.airgap: {binary_path} does not match sha256sum-{arch}.txt",
                         "the download is corrupt or from another release: fetch it again")
    images = []
    for candidate in image_archives(folder, arch):
        archive = local_file(candidate)
        if candidate.name in checksums and checksums[candidate.name] != archive.sha256:
            raise UsageError(f"k3s.airgap: {candidate} does not match sha256sum-{arch}.txt",
                             "the download is corrupt or from another release: fetch it again")
        images.append(archive)
    return K3sArtifacts(arch=arch, version=inventory.k3s.version, binary=binary, images=tuple(images))


# Exactly what k3s takes from agent/images: image archives in the formats rancher/wharfie's
# pkg/tarfile reads (SupportedExtensions), and `.txt` lists of images to pull
# (k3s-io/k3s pkg/agent/containerd/watcher.go isFileSupported, containerd.go preloadFile).
ARCHIVE_SUFFIXES = (".tar", ".tar.lz4", ".tar.bz2", ".tbz", ".tar.gz", ".tgz", ".tar.zst", ".tzst")
IMAGE_LIST_SUFFIX = ".txt"
ARCHIVE = re.compile("(" + "|".join(re.escape(s) for s in ARCHIVE_SUFFIXES + (IMAGE_LIST_SUFFIX,)) + ")$")
ARCHES = ("amd64", "arm64", "arm", "s390x", "riscv64")


def image_archives(folder: Path, arch: str) -> list[Path]:
    """k3s's own image archive for `arch` and every other image archive or image list in
    the folder (the user's CUDA or workload images), except those named for another arch
    (k3s-airgap-images-arm64.tar.zst, images-arm64.txt)."""
    found = []
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        if not path.is_file() or not ARCHIVE.search(path.name) or path.name.startswith("sha256sum-"):
            continue  # (the release's checksum lists are .txt files too, not image lists)
        other = [a for a in ARCHES if a != arch and re.search(rf"[-_.]{a}{ARCHIVE.pattern}", path.name)]
        if not other:
            found.append(path)
    return found


def online_artifacts(version: str, arch: str) -> K3sArtifacts:
    quoted = version.replace("+", "%2B")
    return K3sArtifacts(arch=arch, version=version,
                        download_url=f"{RELEASES}/{quoted}/{release_name(arch)}",
                        checksums_url=f"{RELEASES}/{quoted}/sha256sum-{arch}.txt")


def resolve_channel(channel: str) -> str:
    """The release a channel points at now (one HTTP request from the control machine)."""
    try:
        with urllib.request.urlopen(f"{CHANNELS}/{channel}", timeout=10) as response:
            final = response.geturl()
    except OSError as exc:
        raise UsageError(f"cannot resolve k3s channel {channel!r}: {exc}",
                         "set k3s.version to a release (e.g. v1.33.5+k3s1), or k3s.airgap to a folder") from None
    match = re.search(r"/(v\d+\.\d+\.\d+[^/]*)$", final.replace("%2B", "+"))
    if not match:
        raise UsageError(f"k3s channel {channel!r} resolved to {final}, which names no release",
                         "set k3s.version explicitly")
    return match.group(1)


def k3s_artifacts(inventory: Inventory, arches: set[str]) -> dict[str, K3sArtifacts]:
    if inventory.k3s.airgap:
        return {arch: airgap_artifacts(inventory, arch) for arch in arches}
    version = inventory.k3s.version or resolve_channel(inventory.k3s.channel or "stable")
    return {arch: online_artifacts(version, arch) for arch in arches}
