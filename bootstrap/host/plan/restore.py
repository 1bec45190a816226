"""The shell lines of an etcd restore, as k3s's restore procedure has them. Pure.

k3s-io/docs docs/cli/etcd-snapshot.md ("Snapshot Restore Steps", and the same steps in
docs/upgrades/roll-back.md): stop k3s on every server; on the first one run
`k3s server --cluster-reset --cluster-reset-restore-path=PATH`; start it; on every other
server delete `/var/lib/rancher/k3s/server/db` and start k3s, so it joins the restored
cluster (with its old etcd data it would keep the cluster the reset left behind and
never rejoin).

With `k3s.snapshots.s3` the config carries `etcd-s3: true`, and then k3s looks the restore
path up in the bucket: k3s-io/k3s pkg/etcd/etcd.go, `Reset` ("Retrieving etcd snapshot %s
from S3", then `s3client.Download(ctx, e.config.ClusterResetRestorePath, dir)`). The docs
say: "To restore from a local snapshot file, where an etcd-s3 backup configuration is
present, add the argument `--etcd-s3=false`". The tool restores the local copy it keeps.
"""

from __future__ import annotations

import shlex

from bootstrap.host.parts.k3s_service import ETCD_DB_DIR, SNAPSHOT_DIR, unit_name
from bootstrap.inventory.model import Role

SERVER_UNIT = unit_name(Role.SERVER)


def remote_snapshot_path(name: str) -> str:
    """Where a snapshot lies on a server: k3s's own snapshot folder."""
    return f"{SNAPSHOT_DIR}/{name}"


def reset_command(remote_path: str, s3_configured: bool) -> str:
    """`k3s server --cluster-reset` from a snapshot file on this server."""
    command = f"k3s server --cluster-reset --cluster-reset-restore-path={shlex.quote(remote_path)}"
    return command + (" --etcd-s3=false" if s3_configured else "")


def stop_server_line() -> str:
    return f"systemctl stop {SERVER_UNIT} 2>/dev/null || true"


def clear_peer_lines() -> list[str]:
    """On every other server, before it starts again: k3s stopped, its etcd data gone."""
    return [stop_server_line(), f"rm -rf {ETCD_DB_DIR}"]
