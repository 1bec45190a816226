"""What the cluster-side step applies: Helm releases and plain Kubernetes objects."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from bootstrap.errors import BootstrapError


class ComponentError(BootstrapError):
    """The inventory asks for something the components cannot be configured to do."""


def canonical_json(value) -> str:
    # Sorted keys and no whitespace: equal values always give equal text (and digests).
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    chart: str
    repo: str
    version: str
    values: dict = field(default_factory=dict)
    archive: str | None = None  # a local chart archive: installed from it, not from `repo`
    # The chart upgrades its own CRDs in a pre-upgrade hook (the GPU Operator's
    # operator.upgradeCRD): Helm 3 checks the new objects against the CRDs still in the
    # cluster before the hook runs, so its upgrades skip that check (helm.upgrade_install_argv).
    upgrades_own_crds: bool = False

    def digest(self) -> str:
        """Changes exactly when `helm upgrade` would be asked for something different, so an
        unchanged release can be skipped (the repo URL and the archive's path are left out:
        moving a mirror or a folder is not a change to the cluster)."""
        text = "\n".join((self.version, self.chart, canonical_json(self.values)))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Patch:
    """A change to an object that something else owns (k3s's `local-path` StorageClass):
    `body` is a partial object for a merge patch or a server-side apply of only these fields."""

    body: dict

    @property
    def kind(self) -> str:
        return self.body["kind"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]
