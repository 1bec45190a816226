"""The archive's byte channel (bootstrap.remote.remote_output.run_with_input) over a real shell:
stdout and stderr read apart while stdin is written, so a script that prints a lot before it
reads never stalls, and only the tail of a flood is kept."""

from __future__ import annotations

import io

import pytest

from bootstrap.remote import archive, remote_output
from fakes import LocalShellClient, PyinfraHost


def test_a_script_that_floods_stderr_before_reading_its_stdin_does_not_stall():
    command = "head -c 3000000 /dev/zero | tr '\\0' x >&2; echo; wc -c; echo the end >&2; exit 3"
    status, out, err = remote_output.run_with_input(LocalShellClient(), command,
                                                    lambda stream: stream.write(b"y" * 2_000_000))
    assert status == 3 and out.split() == [b"2000000"]
    assert len(err) == remote_output.TAIL_BYTES and err.endswith(b"xthe end\n")


def test_a_failed_script_says_its_last_line_and_its_output_is_decoded_leniently():
    script = "\n".join(archive.receiving_lines() + ["echo 'bad \xff byte' >&2", "exit 1"])
    host = PyinfraHost(LocalShellClient())
    with pytest.raises(archive.RemoteCommandFailed) as failed:
        archive.run_with_archive(None, host, script, [io.BytesIO(b"x")])
    assert failed.value.line == "bad \xff byte" and failed.value.status == 1


def test_no_connection_is_a_failure_not_a_run_here():
    """The old @local fallback ran a host's script on the operator's machine when pyinfra's
    connection had no paramiko client; now that is the host's failure."""
    with pytest.raises(archive.RemoteCommandFailed, match="no open SSH connection"):
        archive.run_with_archive(None, PyinfraHost(None), "true", [])
