"""etcd snapshots: taken on a server, copied with the token they need to the state folder.

A snapshot is useless without the token that encrypted its bootstrap data, so each local
copy has its token beside it (both 0600). The last N are kept.
"""

from __future__ import annotations

import time
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.inventory.model import Inventory, Node
from bootstrap.statedir import StateDir

REMOTE_DIR = "/var/lib/rancher/k3s/server/db/snapshots"


def local_dir(state: StateDir) -> Path:
    path = state.path / "snapshots"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def newest(state: StateDir) -> Path | None:
    snaps = sorted((p for p in local_dir(state).iterdir() if p.is_file() and not p.name.endswith(".token")),
                   key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def prune(state: StateDir, keep: int) -> None:
    snaps = sorted((p for p in local_dir(state).iterdir() if p.is_file() and not p.name.endswith(".token")),
                   key=lambda p: p.stat().st_mtime)
    for old in snaps[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".token").unlink(missing_ok=True)


def take(inventory: Inventory, state: StateDir, server: Node | None = None) -> Path:
    """`k3s etcd-snapshot save` on a server, then copy the file here (never through a log)."""
    from bootstrap.cluster.tunnel import connect_ssh

    server = server or inventory.servers[0]
    sudo = "sudo -n " if inventory.ssh_for(server).use_sudo else ""
    name = f"bootstrap-{time.strftime('%Y%m%d-%H%M%S')}"
    client = connect_ssh(inventory, server, state)
    try:
        def run(command: str, what: str) -> bytes:
            _, stdout, stderr = client.exec_command(command, timeout=600)
            data = stdout.read()
            if stdout.channel.recv_exit_status() != 0:
                raise BootstrapError(f"{what} on {server.name} failed: {stderr.read().decode().strip()[-300:]}")
            return data

        run(f"{sudo}k3s etcd-snapshot save --name {name} >/dev/null 2>&1 || {sudo}k3s etcd-snapshot save --name {name}",
            "k3s etcd-snapshot save")
        remote = run(f"{sudo}sh -c 'ls -t {REMOTE_DIR}/{name}* | head -n 1'", "finding the snapshot").decode().strip()
        if not remote:
            raise BootstrapError(f"k3s saved no snapshot named {name} in {REMOTE_DIR} on {server.name}")
        data = run(f"{sudo}cat {remote}", "reading the snapshot")
    finally:
        client.close()
    target = local_dir(state) / Path(remote).name
    state.write_secret(f"snapshots/{target.name}", data)
    token = (state.path / "token").read_text()
    state.write_secret(f"snapshots/{target.name}.token", token)
    prune(state, inventory.k3s.snapshots.retention)
    return target
