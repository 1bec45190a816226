"""The pyinfra commands that carry out a host plan. They only decide commands; the plan
(bootstrap.hostplan) already compared desired state with the facts gathered up front, and
bootstrap.hosts.executor runs them, step by step, all hosts of a step in parallel. A host
with nothing to do in a step gets no commands (no round trip).
"""

from __future__ import annotations

import contextlib
import io
import secrets
import shlex

import paramiko
from pyinfra import logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand

from bootstrap.hostparts import k3s_binary
from bootstrap.hostparts.k3s_service import CONTAINERD_CONFIG, SNAPSHOT_DIR, unit_name
from bootstrap.hostplan.host_plan import HostPlan
from bootstrap.inventory.model import Role

SERVICE_TIMEOUT_S = 300


def placement_commands(plan: HostPlan, keep_previous_binary: bool = False) -> list:
    """Files go to a private (0700) staging dir as the login user, then one root script
    installs them with their modes and runs the preparation lines: few round trips, and a
    secret never sits in a world-readable temp file or on a command line. The staging dir
    (config.yaml holds the join token) goes on every exit: the root script's trap, or the
    upload step itself when an upload fails (then no root script runs).
    `keep_previous_binary`: copy the running k3s binary aside first (an upgrade's way back)."""
    if not plan.uploads and not plan.prepare:
        return []
    commands: list = []
    lines = ["set -e"]
    if plan.uploads:
        stage = f"/tmp/bootstrap-stage-{secrets.token_hex(8)}"
        lines.append(f"trap 'rm -rf {stage}' EXIT")
        sources = [str(spec.local) if spec.local else io.BytesIO(spec.content) for spec in plan.uploads]
        commands.append(FunctionCommand(upload_or_clean_up, (stage, sources), {}))
    if keep_previous_binary:
        lines.append(k3s_binary.keep_previous())
    for index, spec in enumerate(plan.uploads):
        lines.append(f"install -D -m {spec.mode:04o} -o root -g root {stage}/{index} {shlex.quote(spec.path)}")
    lines += plan.prepare
    commands.append(StringCommand("\n".join(lines)))
    return commands


def upload_or_clean_up(state, host, stage: str, sources: list) -> bool:
    """Make the private (0700) staging dir and upload `sources` as the login user to
    stage/0, stage/1, ... in ONE SFTP session (pyinfra opens one per file, and a mkdir
    command besides: each costs round trips); when one fails, remove the staging dir before
    reporting it (the root script that would remove it never runs)."""
    try:
        ok = _upload_in_one_session(host, stage, sources)
    except (OSError, EOFError, paramiko.SSHException):
        ok = False
    if not ok:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            host.run_shell_command(StringCommand(f"rm -rf {stage}"), _sudo=False)
        host.log(f"uploading to {stage} failed; the staging dir was removed", log_func=logger.error)
    return ok


def _upload_in_one_session(host, stage: str, sources: list) -> bool:
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:  # not an SSH connection (pyinfra's @local): its own way, file by file
        made = host.run_shell_command(StringCommand(f"umask 077 && mkdir -m 700 {stage}"), _sudo=False)
        return bool(made[0] if isinstance(made, tuple) else made) and all(
            host.put_file(source, f"{stage}/{index}", _sudo=False) for index, source in enumerate(sources))
    sftp = paramiko.SFTPClient.from_transport(transport)
    try:
        # sftp-server creates it with this mode, less its umask: never wider than 0700, and
        # mkdir fails on an existing path (no one can have planted it).
        sftp.mkdir(stage, 0o700)
        for index, source in enumerate(sources):
            with (open(source, "rb") if isinstance(source, str) else contextlib.nullcontext(source)) as data:
                data.seek(0)
                sftp.putfo(data, f"{stage}/{index}", confirm=False)
    finally:
        sftp.close()
    return True


def wait_for_service(unit: str, action: str, timeout: int = SERVICE_TIMEOUT_S) -> StringCommand:
    """(Re)start without blocking, then wait: active (in a new run, for a restart) is
    success; a crash (systemd's auto-restart, or a second new run) or the time-out fails
    with the unit's last log lines. A unit caught in a crash loop from before is stopped
    and its failed state cleared first, so its history does not count against this start."""
    script = f"""
u={unit}
show() {{ systemctl show -p "$1" --value $u 2>/dev/null; }}
old=$(show InvocationID)
state=$(show ActiveState)
was_active=no; [ "$state" = active ] && was_active=yes
if [ "$state" != active ] && [ "$state" != inactive ]; then systemctl stop $u 2>/dev/null || true; fi
systemctl reset-failed $u 2>/dev/null || true
systemctl {action} --no-block $u
first=""
i=0
while [ $i -lt {timeout} ]; do
  state=$(show ActiveState); sub=$(show SubState); id=$(show InvocationID)
  if [ -n "$id" ] && [ "$id" != "$old" ] && [ -z "$first" ]; then first=$id; fi
  if [ "$state" = active ]; then
    if [ -n "$first" ] && [ "$id" = "$first" ]; then exit 0; fi
    if [ {action} = start ] && [ $was_active = yes ]; then exit 0; fi
  fi
  if [ "$state" = failed ] || [ "$sub" = auto-restart ]; then break; fi
  if [ -n "$first" ] && [ -n "$id" ] && [ "$id" != "$first" ]; then break; fi
  sleep 1; i=$((i+1))
done
echo "$u did not become active ($state after ${{i}}s); its last log lines:" >&2
journalctl -u $u -n 8 --no-pager -o cat 2>/dev/null | grep -iv token | tail -n 5 >&2
exit 1
"""
    return StringCommand(script.strip())


def prepull_command(images: list[str]) -> StringCommand:
    """Pull through the CRI, so registries.yaml (mirrors, credentials, the embedded mirror)
    applies as it does for pods."""
    refs = " ".join(shlex.quote(i) for i in images)
    return StringCommand(f"for i in {refs}; do out=$(k3s crictl pull \"$i\" 2>&1) || "
                         f"{{ echo \"pulling $i failed: $(echo \"$out\" | tail -n 1)\" >&2; exit 1; }}; done")


def verify_nvidia_runtime_command() -> StringCommand:
    config = CONTAINERD_CONFIG
    return StringCommand(
        f"for i in $(seq 1 30); do grep -qE \"runtimes\\.[\\\"']?nvidia[\\\"']?\\]\" {config} 2>/dev/null && exit 0; sleep 1; done; "
        f"echo 'k3s did not detect the nvidia runtime in {config}; is nvidia-container-runtime on PATH?' >&2; exit 1")


def refuse(message: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit 1", _sudo=False)


def restore_commands(snapshot, s3_configured: bool = False) -> list:
    """Put a local snapshot on the new server and reset the datastore from it. The token in
    config.yaml (the old cluster's) decrypts it; k3s refuses a wrong one."""
    from bootstrap.hostplan import restore

    stage = f"/tmp/bootstrap-stage-{secrets.token_hex(8)}"
    # The name is one of the state folder's own (bootstrap.snapshots pattern); quoted anyway.
    remote = restore.remote_snapshot_path(snapshot.name)
    return [
        StringCommand(f"umask 077 && mkdir -m 700 {stage}", _sudo=False),
        FileUploadCommand(str(snapshot), f"{stage}/snapshot", _sudo=False),
        StringCommand("\n".join([
            "set -e",
            f"install -D -m 0600 -o root -g root {stage}/snapshot {shlex.quote(remote)}",
            f"rm -rf {stage}",
            restore.stop_server_line(),
            f"out=$({restore.reset_command(remote, s3_configured)} 2>&1) || "
            "{ echo \"$out\" | grep -iv token | tail -n 5 >&2; exit 1; }",
            "echo \"$out\" | grep -iv token | tail -n 2",
        ])),
    ]


def clear_peer_commands() -> list:
    """Another server of a restored cluster: stopped, its old etcd data removed."""
    from bootstrap.hostplan import restore

    return [StringCommand("\n".join(restore.clear_peer_lines()))]
