"""One remote command that receives a host's files as a tar stream on its stdin.

A host's change used to be a staging dir, one SFTP session for its uploads and a root
script: each SFTP session costs its channel, subsystem and version round trips, and each
file its open, write and close. Here the root script itself reads the files: it makes a
private (0700, root's) staging dir, extracts the archive it is sent into it, places each
file (a temp name in its folder, synced, renamed: bootstrap.host.parts.placing) and runs
the preparation lines, in one SSH channel. The files
(config.yaml holds the join token) travel only inside the SSH connection and never sit in
a login user's directory; the script's trap removes the staging dir on every exit.

pyinfra's run-command API takes text on stdin only, so the stream goes over a byte channel of
the host's pyinfra connection (bootstrap.remote.pyinfra_link says why and where).
"""

from __future__ import annotations

import io
import os
import tarfile
import time

from bootstrap.host.parts import placing
from bootstrap.remote import pyinfra_link, remote_output

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
    exit (bootstrap.host.parts.placing), the staging dir, the extraction. mktemp -d makes it
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
    stdin, in one SSH channel; raises RemoteCommandFailed with its output when it fails.
    (A FunctionCommand's function: pyinfra calls it with its state and the host.)"""
    client = pyinfra_link.ssh_client(host)
    if client is None:
        raise RemoteCommandFailed([], ["no open SSH connection to send the files over"], None)
    status, stdout, stderr = remote_output.run_with_input(
        client, pyinfra_link.shell_command(host, script), lambda stream: write_archive(stream, sources))
    if status != 0:
        raise RemoteCommandFailed(_lines(stdout), _lines(stderr), status)
    return True


def _lines(output: bytes) -> list[str]:
    return output.decode("utf-8", "replace").splitlines()
