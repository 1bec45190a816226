"""The per-cluster state folder: identity, pinned host keys, secrets, kubeconfig, logs.

Kept outside the repository by default (`$XDG_STATE_HOME/bootstrap/<cluster>`), so a
clone of the inventory repo never carries a join token.

A state folder belongs to exactly one cluster. `identity.json` holds the cluster's random
id (also recorded on every host the tool sets up and in every snapshot's name) and the
inventory file that created it. A second inventory with the same `cluster:` name (the
quick start copies `cluster: solo`) or the same `state_dir` is refused: sharing would
reuse the other cluster's join token, prune its snapshots and restore its etcd.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import UsageError
from bootstrap.inventory.model import Inventory

IDENTITY = "identity.json"
# What a state folder written before identities existed holds; such a folder is adopted.
LEGACY_ENTRIES = {"known_hosts", "token", "kubeconfig", "logs", "snapshots", "lock", "ssh_config",
                  "applied-inventory.sha256"}


def state_root() -> Path:
    explicit = os.environ.get("BOOTSTRAP_STATE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(xdg) / "bootstrap"


@dataclass(frozen=True)
class Identity:
    cluster: str
    id: str  # 16 hex digits: what hosts and snapshots carry
    inventory: str  # absolute path of the inventory file the folder belongs to
    servers: tuple[str, ...] = ()  # that inventory's server addresses: what makes it this cluster

    def to_json(self) -> str:
        return json.dumps({"cluster": self.cluster, "id": self.id, "inventory": self.inventory,
                           "servers": list(self.servers)}, indent=1) + "\n"


def new_cluster_id() -> str:
    return secrets.token_hex(8)


def server_addresses(inventory: Inventory) -> tuple[str, ...]:
    return tuple(sorted({s.address.lower() for s in inventory.servers}))


def check_identity(found: Identity, inventory: Inventory, folder: Path, inventory_path: str) -> str | None:
    """None when `found` is this inventory's cluster; else why the folder is not ours. Pure,
    apart from asking whether the other inventory file still exists (a moved file is adopted).
    Another file that names one of the cluster's servers is the same cluster (an edited copy
    to `plan` a change); one with other servers is another cluster."""
    if found.cluster != inventory.cluster:
        return (f"the state folder {folder} belongs to cluster {found.cluster!r} (inventory {found.inventory}), "
                f"not to {inventory.cluster!r}")
    if found.inventory == inventory_path or not Path(found.inventory).exists():
        return None
    if set(found.servers) & set(server_addresses(inventory)):
        return None
    return (f"the state folder {folder} belongs to the cluster of {found.inventory} (id {found.id}, servers "
            f"{', '.join(found.servers) or 'unknown'}); {inventory_path} has the same cluster name "
            f"{inventory.cluster!r} but other servers")


class StateDir:
    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        if inventory.state_dir:
            base = Path(inventory.source).parent if inventory.source else Path.cwd()
            self.path = (base / Path(inventory.state_dir).expanduser()).resolve()
        else:
            self.path = state_root() / inventory.cluster
        self._identity: Identity | None = None

    @property
    def inventory_path(self) -> str:
        return str(Path(self.inventory.source).resolve()) if self.inventory.source else "<inventory>"

    # -- ownership ------------------------------------------------------------------------
    def ensure(self) -> Path:
        """Create the folder (0700) with this cluster's identity, or check that the existing
        folder is this cluster's. A folder the tool did not create keeps its mode."""
        if self._identity is not None:
            return self.path
        marker = self.path / IDENTITY
        if not self.path.exists():
            self.path.mkdir(parents=True, mode=0o700)
            os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
            self._identity = self._write_identity(new_cluster_id())
            return self.path
        if not self.path.is_dir():
            raise self._refuse(f"state_dir {self.path} exists and is not a folder")
        if marker.exists():
            found = self._read_identity(marker)
            problem = check_identity(found, self.inventory, self.path, self.inventory_path)
            if problem:
                raise self._refuse(problem)
            owner = found.inventory == self.inventory_path or not Path(found.inventory).exists()
            if owner and (found.inventory, found.servers) != (self.inventory_path, server_addresses(self.inventory)):
                found = self._write_identity(found.id)  # moved or renamed, or its servers changed
            self._identity = found
            return self.path
        entries = {p.name for p in self.path.iterdir()}
        if entries and not entries <= LEGACY_ENTRIES:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            raise self._refuse(f"state_dir {self.path} is a folder with other files in it ({shown}), "
                               "not a bootstrap state folder")
        # An empty folder the user made for us, or a state folder from before identities.
        self._identity = self._write_identity(new_cluster_id())
        if entries:
            self._adopt_legacy_snapshots()
        return self.path

    @property
    def identity(self) -> Identity:
        self.ensure()
        return self._identity

    @property
    def cluster_id(self) -> str:
        return self.identity.id

    def renew_identity(self) -> None:
        """After a complete `down`: the next `up` builds a new cluster, whose hosts and
        snapshots must not be mistaken for the old one's."""
        self.ensure()
        self._identity = self._write_identity(new_cluster_id())

    def _write_identity(self, cluster_id: str) -> Identity:
        identity = Identity(self.inventory.cluster, cluster_id, self.inventory_path, server_addresses(self.inventory))
        self.write_file(IDENTITY, identity.to_json(), mode=0o600)
        return identity

    def _read_identity(self, marker: Path) -> Identity:
        try:
            data = json.loads(marker.read_text())
            return Identity(str(data["cluster"]), str(data["id"]), str(data["inventory"]),
                            tuple(str(a) for a in data.get("servers", [])))
        except (OSError, ValueError, KeyError, TypeError):
            raise self._refuse(f"{marker} is damaged") from None

    def _refuse(self, problem: str) -> UsageError:
        where = f"state_dir in {self.inventory.source}" if self.inventory.state_dir else "state_dir"
        return UsageError(problem + "; nothing was changed",
                          f"give this cluster its own folder: set {where} to a new folder, or change cluster: "
                          f"to a name of its own. If this inventory really is that cluster's (its servers were all "
                          f"replaced), edit \"inventory\" in {self.path / IDENTITY} to name this file")

    def _adopt_legacy_snapshots(self) -> None:
        """Snapshots from before identities are this cluster's: give them its id's prefix."""
        from bootstrap.snapshots import adopt_legacy

        adopt_legacy(self)

    # -- files ----------------------------------------------------------------------------
    @property
    def known_hosts(self) -> Path:
        return self.path / "known_hosts"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def write_secret(self, name: str, data: str | bytes) -> Path:
        """Write a file only the owner can read; created 0600 so it is never briefly world-readable."""
        self.ensure()
        return self.write_file(name, data, mode=0o600)

    def write_file(self, name: str, data: str | bytes, mode: int = 0o600) -> Path:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = target.with_name(target.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        return target
