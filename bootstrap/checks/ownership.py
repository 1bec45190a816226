"""Whose host is this? The tool changes or removes only what it set up for this cluster.

Every host the tool sets up records the cluster's id in its manifest
(/var/lib/bootstrap/manifest.json). Pure: facts in, verdicts out.

- ours: the manifest names this cluster's id, or it is a manifest from before ids existed
  (adopted: the tool wrote it, and the state folder that reached it is this cluster's);
- empty: no manifest and no k3s at all: nothing of anyone's to remove;
- foreign: another cluster's manifest, or a k3s the tool did not install;
- unknown: the host returned a manifest the tool would not have written (a null or malformed
  cluster id, wrong types, not JSON): never read as this cluster's. The reason says why;
  callers make it that host's failure and go on with the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.manifest import ID_KEY, MANIFEST, NAME_KEY, read
from bootstrap.remote_data import RemoteDataError


@dataclass(frozen=True)
class Ownership:
    verdict: str  # "ours" | "empty" | "foreign" | "unknown"
    reason: str = ""


def ownership(facts: HostFacts, cluster_id: str) -> Ownership:
    if facts.manifest_error:
        return Ownership("unknown", f"its {facts.manifest_error}")
    try:
        manifest = read({} if facts.manifest is None else facts.manifest)
    except RemoteDataError as exc:
        return Ownership("unknown", f"its {exc}")
    if manifest:
        recorded = manifest.get(ID_KEY)
        if recorded is None or recorded == cluster_id:
            return Ownership("ours")
        name = manifest.get(NAME_KEY)
        return Ownership("foreign", f"it belongs to another cluster set up by bootstrap"
                                    f"{f' ({name!r}' if name else ' ('}id {recorded})")
    if facts.k3s is not None:
        return Ownership("foreign", f"k3s is installed on it, but not by bootstrap (no {MANIFEST})")
    return Ownership("empty")
