#!/usr/bin/env python3
"""Build a k3s air-gap folder around the k3s stand-in, shaped like a k3s release.

    build_airgap(dest, version="v1.33.5+k3s1") -> dest
        dest/k3s                              the stand-in (k3s_standin.py) with the version,
                                              the valid server/agent flag names, the
                                              stand-in Kubernetes API (kubeapi.py) and its
                                              certificates and TLS (k3s_pki.py) embedded
        dest/k3s-airgap-images-amd64.tar.zst  a small, valid .tar.zst placeholder
        dest/sha256sum-amd64.txt              "<sha256>  <file>" lines, as in a release

The flag names come from the product's own list (bootstrap/checks/k3s_flags.txt, made from the
k3s docs; tests/unit/inventory/test_inventory_hostile.py checks it against the upstream copy when that is
present), read at build time: the stand-in needs nothing outside the checkout.

As a command: python tests/standins/airgap.py DEST [--version vX.Y.Z+k3sN]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import struct
import sys
import tarfile
from pathlib import Path

STANDIN_SOURCE = Path(__file__).resolve().parent / "k3s_standin.py"
KUBEAPI_SOURCE = Path(__file__).resolve().parent / "kubeapi.py"
PKI_SOURCE = Path(__file__).resolve().parent / "k3s_pki.py"
H2_SOURCE = Path(__file__).resolve().parent / "h2serve.py"
FLAGS_NAME = "k3s/flags-docs-0243496.txt"  # the upstream copy, under the upstream data folder
SHIPPED_FLAGS = Path(__file__).resolve().parents[2] / "bootstrap" / "checks" / "k3s_flags.txt"
DEFAULT_VERSION = "v1.33.5+k3s1"
GO_VERSION = "go1.24.6"
EMBED_LINE = "EMBEDDED = None\n"
KUBEAPI_LINE = "KUBEAPI_SOURCE = None\n"
PKI_LINE = "PKI_SOURCE = None\n"
H2_LINE = "H2_SOURCE = None\n"
VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+(-rc\d+)?\+k3s\d+$")
# What a release's airgap image list starts with (k3s-images.txt); only names here.
PLACEHOLDER_IMAGES = (
    "docker.io/rancher/klipper-helm:v0.9.8-build20250709",
    "docker.io/rancher/klipper-lb:v0.4.13",
    "docker.io/rancher/local-path-provisioner:v0.0.31",
    "docker.io/rancher/mirrored-coredns-coredns:1.12.3",
    "docker.io/rancher/mirrored-library-busybox:1.36.1",
    "docker.io/rancher/mirrored-library-traefik:3.3.6",
    "docker.io/rancher/mirrored-metrics-server:v0.8.0",
    "docker.io/rancher/mirrored-pause:3.6",
)


def default_flags_file() -> Path:
    """The flag list the product ships and checks inventories against."""
    return SHIPPED_FLAGS


def upstream_missing() -> str | None:
    """Why the stand-in cannot be built here (for pytest.skip), or None."""
    path = default_flags_file()
    if not path.is_file():
        return f"k3s flag list not found at {path} (is this a full checkout?)"
    return None


def load_flags(path: Path) -> dict[str, list[str]]:
    """{"server": [...], "agent": [...]} from lines "server: NAME" / "agent: NAME"."""
    flags: dict[str, list[str]] = {"server": [], "agent": []}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        command, sep, name = line.partition(":")
        command, name = command.strip(), name.strip()
        if not sep or command not in flags or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise ValueError(f"{path}:{number}: expected 'server: NAME' or 'agent: NAME', got {line!r}")
        flags[command].append(name)
    if not flags["server"] or not flags["agent"]:
        raise ValueError(f"{path}: no server or no agent flags")
    return flags


def standin_program(version: str = DEFAULT_VERSION, flags: dict[str, list[str]] | None = None,
                    flags_file: Path | None = None) -> str:
    """The stand-in's source with the version and flag names embedded."""
    if not VERSION_RE.match(version):
        raise ValueError(f"k3s version {version!r} is not like v1.33.5+k3s1")
    if flags is None:
        flags = load_flags(flags_file or default_flags_file())
    source = STANDIN_SOURCE.read_text()
    if source.count(EMBED_LINE) != 1:
        raise RuntimeError(f"{STANDIN_SOURCE}: expected exactly one line {EMBED_LINE.strip()!r}")
    embedded = {
        "version": version,
        "commit": hashlib.sha1(version.encode()).hexdigest()[:8],
        "go": GO_VERSION,
        "flags": {k: sorted(set(v)) for k, v in flags.items()},
    }
    program = source.replace(EMBED_LINE, f"EMBEDDED = {embedded!r}\n")
    # The stand-in Kubernetes API (kubeapi.py), its TLS (k3s_pki.py) and HTTP/2 (h2serve.py)
    # travel inside the one file, as k3s is one binary.
    for line, module in ((KUBEAPI_LINE, KUBEAPI_SOURCE), (PKI_LINE, PKI_SOURCE), (H2_LINE, H2_SOURCE)):
        if program.count(line) != 1:
            raise RuntimeError(f"{STANDIN_SOURCE}: expected exactly one line {line.strip()!r}")
        program = program.replace(line, f"{line.split(' = ')[0]} = {module.read_text()!r}\n")
    return program


def _zstd_raw_frame(payload: bytes) -> bytes:
    """A valid zstd frame holding payload uncompressed (raw blocks): any zstd reader
    accepts it, and no compressor is needed here."""
    out = bytearray(b"\x28\xb5\x2f\xfd")  # magic
    out.append(0x20 | 0xC0)  # single segment, 8-byte frame content size, no checksum
    out += struct.pack("<Q", len(payload))
    blocks = [payload[i:i + 131072] for i in range(0, len(payload), 131072)] or [b""]
    for index, block in enumerate(blocks):
        last = 1 if index == len(blocks) - 1 else 0
        header = (len(block) << 3) | (0 << 1) | last  # block type 0 = raw
        out += header.to_bytes(3, "little") + block
    return bytes(out)


def images_placeholder(version: str) -> bytes:
    """k3s-airgap-images-amd64.tar.zst: a tar with an image list, in a zstd frame."""
    listing = ("# k3s stand-in airgap images placeholder for %s\n" % version
               + "\n".join(PLACEHOLDER_IMAGES) + "\n").encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("k3s-images.txt")
        info.size, info.mode, info.mtime = len(listing), 0o644, 0
        tar.addfile(info, io.BytesIO(listing))
    return _zstd_raw_frame(buffer.getvalue())


def build_airgap(dest: Path, version: str = DEFAULT_VERSION, flags_file: Path | None = None,
                 arch: str = "amd64") -> Path:
    """Write the air-gap folder (see the module docstring) and return dest."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    program = standin_program(version, flags_file=Path(flags_file) if flags_file else None)
    files = {
        "k3s": (program.encode(), 0o755),
        f"k3s-airgap-images-{arch}.tar.zst": (images_placeholder(version), 0o644),
    }
    for name, (data, mode) in files.items():
        path = dest / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(path)
    sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, (data, _) in files.items())
    (dest / f"sha256sum-{arch}.txt").write_text(sums)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--flags-file", type=Path)
    args = parser.parse_args(argv)
    why = upstream_missing() if args.flags_file is None else None
    if why:
        print(f"airgap: {why}", file=sys.stderr)
        return 2
    build_airgap(args.dest, args.version, args.flags_file)
    print(f"k3s stand-in {args.version} air-gap folder: {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
