"""One remote command that receives a host's files as a tar stream on its stdin.

A host's change used to be a staging dir, one SFTP session for its uploads and a root
script: each SFTP session costs its channel, subsystem and version round trips, and each
file its open, write and close. Here the root script itself reads the files: it makes a
private (0700, root's) staging dir, extracts the archive it is sent into it, places each
file (a temp name in its folder, synced, renamed: bootstrap.hostparts.placing) and runs
the preparation lines, in one SSH channel. The files
(config.yaml holds the join token) travel only inside the SSH connection and never sit in
a login user's directory; the script's trap removes the staging dir on every exit.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
import time

import paramiko

from bootstrap.hostparts import placing

STAGE_PREFIX = "/tmp/bootstrap-stage-"
RECORD = 64 * 1024  # tar's blocking on the wire: paramiko sends at most 32 KiB a packet anyway


class RemoteCommandFailed(Exception):
    """The command ran and failed: its output says why (the executor reports its last line)."""

    def __init__(self, stdout_lines: list[str], stderr_lines: list[str], status: int | None):
        self.stdout_lines, self.stderr_lines, self.status = stdout_lines, stderr_lines, status
        super().__init__(self.line)

    @property
    def line(self) -> str:
        lines = [l.strip() for l in self.stderr_lines if l.strip()] or [l.strip() for l in self.stdout_lines if l.strip()]
        return lines[-1] if lines else f"exit status {self.status}, no output"


def staged(index: int) -> str:
    """Where the script finds the archive's `index`th file."""
    return f'"$stage"/{index}'


def receiving_lines() -> list[str]:
    """The script's first lines: `place` and the trap that removes the staging dir on every
    exit (bootstrap.hostparts.placing), the staging dir, the extraction. mktemp -d makes it
    0700 under a random name; root extracts with the archive's modes (0600) and as its own
    files (--no-same-owner: the archive names uid 0 anyway)."""
    return [
        *placing.script_head(),
        f"stage=$(mktemp -d {STAGE_PREFIX}XXXXXXXXXX)",
        'tar -x -f - -C "$stage" --no-same-owner',
    ]


def write_archive(stream, sources: list) -> None:
    """`sources` (local paths or BytesIO) as entries "0", "1", ... of a tar stream."""
    now = int(time.time())
    with tarfile.open(fileobj=stream, mode="w|", bufsize=RECORD, format=tarfile.GNU_FORMAT) as tar:
        for index, source in enumerate(sources):
            info = tarfile.TarInfo(str(index))
            info.mode, info.uid, info.gid, info.mtime = 0o600, 0, 0, now
            if isinstance(source, (str, os.PathLike)):
                info.size = os.path.getsize(source)
                with open(source, "rb") as data:
                    tar.addfile(info, data)
            else:
                data = source.getvalue()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def run_with_archive(state, host, script: str, sources: list) -> bool:
    """Run `script` (as root when the host uses sudo) with `sources` as a tar stream on its
    stdin, in one SSH channel; raises RemoteCommandFailed with its output when it fails."""
    from pyinfra.api import StringCommand
    from pyinfra.connectors.util import make_unix_command_for_host

    command = make_unix_command_for_host(state, host, StringCommand(script),
                                         _sudo=bool(host.data.get("_sudo", False))).get_raw_value()
    client = getattr(host.connector, "client", None)
    if client is None or client.get_transport() is None:
        return _run_here(command, sources)  # pyinfra's @local connector: this machine
    return _run_over_ssh(client, host, command, sources)


def _run_over_ssh(client, host, command: str, sources: list) -> bool:
    from pyinfra.connectors.util import read_output_buffers

    stdin, stdout, stderr = client.exec_command(command)
    try:
        write_archive(stdin, sources)
        stdin.flush()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command ended early (tar failed, disk full): its output says why
    finally:
        try:
            stdin.channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass
    output = read_output_buffers(stdout, stderr, timeout=None, print_output=False, print_prefix=host.print_prefix)
    status = stdout.channel.recv_exit_status()
    if status != 0:
        raise RemoteCommandFailed(output.stdout_lines, output.stderr_lines, status)
    return True


def _run_here(command: str, sources: list) -> bool:
    with tempfile.TemporaryFile() as archive:  # unlinked at once: only this process reads it
        write_archive(archive, sources)
        archive.seek(0)
        done = subprocess.run(["sh", "-c", command], stdin=archive, capture_output=True, text=True)
    if done.returncode != 0:
        raise RemoteCommandFailed(done.stdout.splitlines(), done.stderr.splitlines(), done.returncode)
    return True
