"""The k3s binary: uploaded from the air-gap folder, or downloaded and checked on the host.

Replacing it on a running node is what makes a plan an upgrade (Action.REPLACE_BINARY),
and an upgrade keeps the binary it replaces as the way back.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import placing
from bootstrap.host.parts.base import Action, Draft, FileSpec

if TYPE_CHECKING:
    from bootstrap.host.release import K3sArtifacts

PATH = "/usr/local/bin/k3s"
PREVIOUS = "/var/lib/bootstrap/k3s.previous"  # under the manifest's folder: `down` removes it with that
PATHS = (PATH,)


def release_name(arch: str) -> str:
    """The binary's name in a k3s release (and in an air-gap folder)."""
    return "k3s" if arch == "amd64" else f"k3s-{arch}"


def file(artifacts: K3sArtifacts) -> FileSpec | None:
    """The air-gap binary as a file to place; None when the host downloads it."""
    if artifacts.binary is None:
        return None
    return FileSpec(PATH, 0o755, artifacts.binary.sha256, local=artifacts.binary.path, restarts_k3s=True)


def download(artifacts: K3sArtifacts) -> list[str]:
    name = release_name(artifacts.arch)
    return [
        placing.SCRATCH,
        f"curl -fsSL -o \"$scratch/{name}\" {shlex.quote(artifacts.download_url)}",
        f"curl -fsSL -o \"$scratch/sums\" {shlex.quote(artifacts.checksums_url)}",
        f"(cd \"$scratch\" && grep -E ' \\*?{name}$' sums | sha256sum -c --quiet -)",
        placing.place(f'"$scratch"/{name}', 0o755, PATH),
    ]


def plan(draft: Draft, to_download: K3sArtifacts | None, facts: HostFacts) -> None:
    """After the files are placed: an uploaded binary, or a download of another release."""
    if any(u.path == PATH for u in draft.plan.uploads):
        draft.plan.actions.add(Action.REPLACE_BINARY)
    if to_download is None:
        return
    installed = facts.k3s.version if facts.k3s else None
    if installed != to_download.version:
        draft.add(Action.REPLACE_BINARY, download(to_download),
                  f"download k3s {to_download.version} ({installed or 'not installed'})")
        draft.restart = True


def keep_previous() -> str:
    """The root script's first line in an upgrade: the running binary becomes the way back."""
    return f"if [ -f {PATH} ]; then {placing.place(PATH, 0o755, PREVIOUS)}; fi"


def roll_back(unit: str) -> str:
    """What a person runs on a node to go back to the binary an upgrade replaced."""
    return f"sudo install -m 0755 {PREVIOUS} {PATH} && sudo systemctl restart {unit}"
