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

import errno
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import UsageError
from bootstrap.inventory.model import Inventory
from bootstrap.state.snapshot_names import adopt_legacy

IDENTITY = "identity.json"
# What a state folder written before identities existed holds; such a folder is adopted.
LEGACY_ENTRIES = {"known_hosts", "token", "kubeconfig", "logs", "snapshots", "lock", "ssh_config",
                  "applied-inventory.sha256"}


# Every file is written to a temp name of its own in the target's folder, then renamed over
# it: `.<name>.<random>.tmp`. The random part means a name nobody can plant a symlink at in
# advance, and a leftover (Ctrl-C, a full disk) is never in the way of the next write.
# Also what older versions left: `<name>.tmp`, and known_hosts' mkstemp names.
TEMP_NAME = re.compile(r"\.[^/]+\.[0-9a-f]{16}\.tmp|[^/]+\.tmp|\.known_hosts\.(session\.)?[A-Za-z0-9_]{8}", re.ASCII)
# A secret the tool wrote is one line of printable ASCII without spaces (a join token).
SECRET_VALUE = re.compile(r"[\x21-\x7e]+", re.ASCII)
MAX_SECRET_BYTES = 4096
_TEMP_TRIES = 8


def write_atomically(target: Path, data: bytes, mode: int = 0o600) -> None:
    """`target` holds either its old content or all of `data`, never a part, whatever happens:
    written to a new file of a random name in its folder (O_EXCL | O_NOFOLLOW: a symlink or
    file already there is never opened), fsynced, renamed over it, the folder fsynced."""
    folder = target.parent
    for _ in range(_TEMP_TRIES):
        tmp = folder / f".{target.name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            break
        except FileExistsError:
            continue  # taken (or planted): another random name
    else:
        raise OSError(errno.EEXIST, f"no free temporary name in {folder}")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask narrowed os.open's mode
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(folder)


def create_exclusively(target: Path, data: bytes, mode: int = 0o600) -> bool:
    """Write `target` only when it does not exist yet (True), all at once: a complete temp
    file hard-linked to the name, which fails when the name exists. Two writers racing on
    an empty folder end with one file, and the loser reads the winner's."""
    folder = target.parent
    tmp = folder / f".{target.name}.{secrets.token_hex(8)}.tmp"
    write_atomically(tmp, data, mode)
    try:
        os.link(tmp, target, follow_symlinks=False)
        created = True
    except FileExistsError:
        created = False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_folder(folder)
    return created


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def folder_problem(folder: Path) -> str | None:
    """Why `folder` may not hold the cluster's secrets, or None: another local user who can
    write to it can swap the token or kubeconfig the next command reads, or plant a link."""
    try:
        info = os.stat(folder)
    except OSError as exc:
        return f"cannot use {folder}: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a folder"
    if info.st_uid != os.geteuid():
        return (f"{folder} belongs to user id {info.st_uid}, not to you (user id {os.geteuid()}); "
                f"fix: chown -R {os.geteuid()} {folder}")
    if stat.S_IMODE(info.st_mode) & 0o022:
        return (f"{folder} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}); "
                f"fix: chmod 700 {folder}")
    return None


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


_CLUSTER_ID = re.compile(r"[0-9a-f]{16}", re.ASCII)


def identity_from(data) -> Identity | None:
    """The identity in parsed identity.json, or None when any field is missing or of the wrong
    type (a null id must never read as an id)."""
    if not isinstance(data, dict):
        return None
    fields = [data.get(k) for k in ("cluster", "id", "inventory")]
    servers = data.get("servers", [])
    if not all(isinstance(f, str) and f for f in fields) or not _CLUSTER_ID.fullmatch(fields[1]):
        return None
    if not isinstance(servers, list) or not all(isinstance(a, str) for a in servers):
        return None
    return Identity(fields[0], fields[1], fields[2], tuple(servers))


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
    def prepare(self) -> Path:
        """The folder, created 0700 when missing, else checked: it must be a bootstrap state
        folder (or empty) that only its owner, the user running the tool, can write to. What
        cluster_lock does before it takes the lock; creates no file."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir(mode=0o700)
            os.chmod(self.path, 0o700)  # mkdir's mode is masked by the umask
            return self.path
        except FileExistsError:
            pass  # made by an earlier run, the user, or a run started at the same moment
        except OSError as exc:
            raise self._unusable(f"cannot create the state folder {self.path}: {exc.strerror}") from None
        if not self.path.is_dir():
            raise self._refuse(f"state_dir {self.path} exists and is not a folder")
        try:
            listed = list(self.path.iterdir())
        except OSError as exc:
            raise self._unusable(folder_problem(self.path) or f"cannot read {self.path}: {exc.strerror}") from None
        entries = {p.name for p in listed if not TEMP_NAME.fullmatch(p.name)}
        # (listed once: a run started with this one may create identity.json meanwhile)
        if IDENTITY not in entries and entries and not entries <= LEGACY_ENTRIES:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            raise self._refuse(f"state_dir {self.path} is a folder with other files in it ({shown}), "
                               "not a bootstrap state folder")
        problem = folder_problem(self.path)  # after: /tmp is not a state folder, whatever its mode
        if problem:
            raise self._unusable(problem)
        for name in ("snapshots", "logs"):
            sub = self.path / name
            problem = folder_problem(sub) if sub.exists() or sub.is_symlink() else None
            if problem:
                raise self._unusable(problem)
        return self.path

    def ensure(self) -> Path:
        """The folder (see `prepare`) with this cluster's identity: read, or created when
        missing. Two commands started together on a new folder end with one id: cluster_lock
        calls this under the lock, and the identity file is created only where none exists
        (the loser of a race reads the winner's)."""
        if self._identity is not None:
            return self.path
        self.prepare()
        marker = self.path / IDENTITY
        if not marker.exists():
            legacy = any(p.name in LEGACY_ENTRIES for p in self.path.iterdir())
            # An empty folder (ours, or one the user made for us), or one from before identities.
            identity = self._identity_for(new_cluster_id())
            if create_exclusively(marker, identity.to_json().encode(), 0o600):
                self._identity = identity
                if legacy:
                    self._adopt_legacy_snapshots()
                return self.path
        found = self._read_identity(marker)
        problem = check_identity(found, self.inventory, self.path, self.inventory_path)
        if problem:
            raise self._refuse(problem)
        owner = found.inventory == self.inventory_path or not Path(found.inventory).exists()
        if owner and (found.inventory, found.servers) != (self.inventory_path, server_addresses(self.inventory)):
            found = self._write_identity(found.id)  # moved or renamed, or its servers changed
        self._identity = found
        return self.path

    def clean_leftovers(self) -> None:
        """Temp files of runs that crashed mid-write. Only under the lock: no other run is
        writing then."""
        for folder in (self.path, self.path / "snapshots"):
            for entry in folder.iterdir() if folder.is_dir() else ():
                if TEMP_NAME.fullmatch(entry.name) and not entry.is_dir():
                    entry.unlink(missing_ok=True)

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

    def _identity_for(self, cluster_id: str) -> Identity:
        return Identity(self.inventory.cluster, cluster_id, self.inventory_path, server_addresses(self.inventory))

    def _write_identity(self, cluster_id: str) -> Identity:
        identity = self._identity_for(cluster_id)
        self.write_file(IDENTITY, identity.to_json(), mode=0o600)
        return identity

    def _read_identity(self, marker: Path) -> Identity:
        try:
            with open(marker, "rb") as handle:
                data = json.loads(handle.read(65536) or b"null")
        except (OSError, ValueError, RecursionError):
            data = None
        identity = identity_from(data)
        if identity is None:
            raise UsageError(f"{marker} is empty or damaged: it must hold this cluster's id; nothing was changed",
                             "restore it from a backup of the state folder; if it is lost, remove it and the next "
                             "command gives the cluster a new id (then `bootstrap down --force` or `up` asks "
                             "before taking over hosts that carry the old one)")
        return identity

    def _unusable(self, problem: str) -> UsageError:
        return UsageError(problem + "; nothing was changed",
                          "the state folder holds the cluster's join token and kubeconfig: it must be a folder of "
                          "yours that only you can write to")

    def _refuse(self, problem: str) -> UsageError:
        where = f"state_dir in {self.inventory.source}" if self.inventory.state_dir else "state_dir"
        return UsageError(problem + "; nothing was changed",
                          f"give this cluster its own folder: set {where} to a new folder, or change cluster: "
                          f"to a name of its own. If this inventory really is that cluster's (its servers were all "
                          f"replaced), edit \"inventory\" in {self.path / IDENTITY} to name this file")

    def _adopt_legacy_snapshots(self) -> None:
        """Snapshots from before identities are this cluster's: give them its id's prefix."""
        adopt_legacy(self.path / "snapshots", self.cluster_id)

    # -- files ----------------------------------------------------------------------------
    @property
    def known_hosts(self) -> Path:
        return self.path / "known_hosts"

    @property
    def logs(self) -> Path:
        return self.subfolder("logs")

    def subfolder(self, name: str) -> Path:
        """A folder in the state folder: created 0700 when missing, else checked like it."""
        if not self.path.is_dir():
            self.prepare()
        path = self.path / name
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)
        except FileExistsError:
            problem = folder_problem(path)
            if problem:
                raise self._unusable(problem) from None
        return path

    def read_secret(self, name: str) -> str:
        """A secret the tool wrote (a join token), stripped. Missing, empty or anything but
        one line of printable ASCII is refused naming the file, so no caller ever uses an
        empty or half-written token."""
        path = self.path / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read(MAX_SECRET_BYTES + 1)
        except FileNotFoundError:
            raise UsageError(f"{path} is missing", "it is written by `bootstrap up`; restore it from a backup "
                             "of the state folder if the cluster exists") from None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        value = raw.decode("ascii", errors="replace").strip()
        if not value or len(raw) > MAX_SECRET_BYTES or not SECRET_VALUE.fullmatch(value):
            what = "empty" if not value else "not one line of printable ASCII"
            raise UsageError(f"{path} is {what}; it was not used",
                             "restore it from a backup of the state folder (a snapshot's .token beside it "
                             "holds the token it was taken with)")
        return value

    def write_secret(self, name: str, data: str | bytes) -> Path:
        """Write a file only the owner can read; created 0600 so it is never briefly world-readable."""
        self.ensure()
        return self.write_file(name, data, mode=0o600)

    def write_file(self, name: str, data: str | bytes, mode: int = 0o600) -> Path:
        """`name` (in the folder, or in one of its subfolders) replaced all at once."""
        target = self.path / name
        if target.parent != self.path:
            self.subfolder(str(target.parent.relative_to(self.path)))
        write_atomically(target, data.encode() if isinstance(data, str) else data, mode)
        return target
