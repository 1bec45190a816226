"""etcd snapshots: taken on a server, copied with the token they need to the state folder.

A snapshot is useless without the token that encrypted its bootstrap data, so each local
copy has its token beside it (both 0600). Names carry the cluster's id
(`bootstrap-<id>-<time>`, then what k3s appends: `-<node>-<unix time>`), so the last N
of *this* cluster are kept and only this cluster's snapshots are ever restored.

Snapshots are ordered by the time in their names, the operator's clock when `take` named
it, never by a file's mtime: a clock that jumped back would make the copy just taken look
oldest, prune it and leave a stale one for a restore. The copy just taken is never pruned.
The time is UTC, marked with a `z` (`20261203-091500z`): local time repeats an hour when
daylight saving ends, and a snapshot taken in the second pass would sort before one taken
in the first. Names from before carry local time without the mark and are still read.
"""

from __future__ import annotations

import calendar
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.host.parts.k3s_service import SNAPSHOT_DIR
from bootstrap.remote import channels
from bootstrap.remote.sshlink import SSH_ERRORS
from bootstrap.inventory.model import Inventory, Node
from bootstrap.state.snapshot_names import K3S_SUFFIX as _K3S_SUFFIX, name_prefix
from bootstrap.state.folder import StateDir
from bootstrap.remote.tunnel import connect_ssh


def snapshot_pattern(cluster_id: str) -> re.Pattern:
    return re.compile(re.escape(name_prefix(cluster_id)) + r"[0-9]{8}-[0-9]{6}z?" + _K3S_SUFFIX, re.ASCII)


def is_ours(name: str, cluster_id: str) -> bool:
    return bool(snapshot_pattern(cluster_id).fullmatch(name))


def chosen_by_us(answered: str, asked: str) -> bool:
    """Whether the file name a server answered is the name `take` asked k3s for (`asked`:
    this cluster's prefix and the operator's UTC time) with only k3s's `-<node>-<unix time>`
    after it."""
    return bool(re.fullmatch(re.escape(asked) + _K3S_SUFFIX, answered, re.ASCII))


_NAME_TIME_FORMAT = "%Y%m%d-%H%M%S"
_NAMED_TIME = re.compile(r"bootstrap-[0-9a-f]+-([0-9]{8}-[0-9]{6})(z?)-.*-([0-9]+)(\.zip)?", re.ASCII)


def time_in_name(now: float | None = None) -> str:
    """The time `take` puts in a snapshot's name: UTC, marked `z` (k3s keeps names to
    lower-case letters, digits, '-' and '.': no upper-case ISO `Z`)."""
    return time.strftime(_NAME_TIME_FORMAT, time.gmtime(now)) + "z"


def named_time(name: str) -> tuple[float, int]:
    """(when `take` named it: UTC for a name marked `z`, the operator's local time for older
    names; the server's unix time k3s appended): the order of snapshots. (0, 0) for a name
    without a valid time."""
    match = _NAMED_TIME.fullmatch(name)
    if not match:
        return 0.0, 0
    try:
        parsed = time.strptime(match.group(1), _NAME_TIME_FORMAT)
        taken = float(calendar.timegm(parsed)) if match.group(2) else time.mktime(parsed)
    except (ValueError, OverflowError):
        taken = 0.0
    return taken, int(match.group(3)[:12])


@dataclass(frozen=True)
class LocalSnapshot:
    path: Path
    taken: float  # the time in its name: when `take` asked k3s for it

    @property
    def order(self) -> tuple:
        return (*named_time(self.name), self.name)

    @property
    def name(self) -> str:
        return self.path.name

    def age(self, now: float | None = None) -> str:
        seconds = max(0, int((now or time.time()) - self.taken))
        if seconds < 120:
            return f"{seconds} s"
        if seconds < 7200:
            return f"{seconds // 60} min"
        if seconds < 172800:
            return f"{seconds // 3600} h {seconds % 3600 // 60} min"
        return f"{seconds // 86400} days"


def local_dir(state: StateDir) -> Path:
    state.ensure()
    return state.subfolder("snapshots")


def local_snapshots(state: StateDir) -> list[LocalSnapshot]:
    """This cluster's snapshots in the state folder, oldest first by the time in their names."""
    cluster_id = state.cluster_id
    found = [LocalSnapshot(p, named_time(p.name)[0]) for p in local_dir(state).iterdir()
             if is_ours(p.name, cluster_id) and p.is_file()]
    return sorted(found, key=lambda s: s.order)


def newest(state: StateDir) -> LocalSnapshot | None:
    snaps = local_snapshots(state)
    return snaps[-1] if snaps else None


def find(state: StateDir, name: str) -> LocalSnapshot | None:
    return next((s for s in local_snapshots(state) if s.name == name), None)


def prune(state: StateDir, keep: int, just_taken: str | None = None) -> None:
    """Keep the newest `keep` (by the time in their names), and `just_taken` whatever its
    name says: the copy a command just made is the one a restore needs."""
    if keep <= 0:
        return
    snaps = local_snapshots(state)
    others = [s for s in snaps if s.name != just_taken]
    room = keep - (len(snaps) - len(others))
    for old in others[:max(0, len(others) - room)]:
        old.path.unlink(missing_ok=True)
        old.path.with_name(old.name + ".token").unlink(missing_ok=True)


# An etcd snapshot is the database file: k3s's default quota is 2 GiB (etcd's
# --quota-backend-bytes); one past twice that is not a snapshot this machine should hold.
MAX_SNAPSHOT_BYTES = 4 << 30


def _run(client, command: str, timeout: float):
    """(stdout, stderr) of `command`, as paramiko's exec_command gives them, on the channel
    opened ahead on the session's connection (bootstrap.remote.channels: a round trip less)."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise EOFError("the SSH connection is closed")
    channel = channels.session_channel(transport, timeout)
    channel.settimeout(timeout)
    channels.start(channel, transport, command, timeout)
    return channel.makefile("rb"), channel.makefile_stderr("rb")


def _save_and_read(client, command: str, server: str) -> bytes:
    """Run the save-and-print command; its output (name line, then the file), capped. A
    connection lost on the way (the server gone mid-save) is said as such, not as a crash."""
    try:
        stdout, stderr = _run(client, command, 600)
        data = stdout.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise BootstrapError(f"the snapshot {server} sent is larger than {MAX_SNAPSHOT_BYTES >> 30} GiB; "
                                 "it was not kept")
        status = stdout.channel.recv_exit_status()
        reason = stderr.read(4096).decode(errors="replace").strip()[-300:] if status != 0 else ""
    except SSH_ERRORS as exc:
        raise BootstrapError(f"the SSH connection to {server} was lost while it saved the etcd snapshot "
                             f"({type(exc).__name__}); no snapshot was kept",
                             "once the server answers, run `bootstrap snapshot INVENTORY` (or the next `up`, "
                             "which takes one when the state folder has none)") from None
    if status == -1:  # paramiko: the channel closed without an exit status
        raise BootstrapError(f"the SSH connection to {server} ended before the etcd snapshot was saved; "
                             "no snapshot was kept",
                             "once the server answers, run `bootstrap snapshot INVENTORY` (or the next `up`)")
    if status != 0:
        raise BootstrapError(f"k3s etcd-snapshot save on {server} failed: {reason or f'exit status {status}'}")
    return data


def take(inventory: Inventory, state: StateDir, server: Node | None = None, ssh=None) -> Path:
    """`k3s etcd-snapshot save` on a server and the file copied here (never through a log),
    in ONE command: its output is the snapshot's name on a line, then the file. `ssh(name)`:
    an open SSH connection to reuse (the hosts' session's), or None for a new one."""
    server = server or inventory.servers[0]
    sudo = "sudo -n " if inventory.ssh_for(server).use_sudo else ""
    name = name_prefix(state.cluster_id) + time_in_name()
    borrowed = ssh(server.name) if ssh else None
    client = borrowed or connect_ssh(inventory, server, state)
    try:
        save = f"k3s etcd-snapshot save --name {shlex.quote(name)}"
        script = "\n".join([
            "set -e",
            f"{save} >/dev/null 2>&1 || {{ {save} >/dev/null; }}",  # a failure shows its output on stderr
            f"f=$(ls -t {SNAPSHOT_DIR} | grep -m 1 -F {shlex.quote(name)} || true)",
            f'[ -n "$f" ] || {{ echo "k3s saved no snapshot named {name} in {SNAPSHOT_DIR}" >&2; exit 1; }}',
            'echo "$f"',
            f'cat {SNAPSHOT_DIR}/"$f"',
        ])
        data = _save_and_read(client, f"{sudo}sh -c {shlex.quote(script)}", server.name)
    finally:
        if borrowed is None:
            client.close()
    first, _, data = data.partition(b"\n")
    remote = first.decode(errors="replace").strip()
    # Only the name asked for, with what k3s appends, becomes a local file name: snapshots
    # are ordered by the time in their names, so a server that answered a name of its own
    # (dated 9999-12-31) would stay newest() for good and be what a restore picks.
    if not chosen_by_us(remote, name):
        raise BootstrapError(f"{server.name} answered a snapshot name that is not the one asked for "
                             f"({name}-<node>-<unix time>): {remote[:120]!r}; no snapshot was kept")
    token = state.read_secret("token")  # before anything is written: a snapshot without it is useless
    target = state.write_secret(f"snapshots/{remote}", data)
    state.write_secret(f"snapshots/{remote}.token", token + "\n")
    prune(state, inventory.k3s.snapshots.retention, just_taken=remote)
    return target
