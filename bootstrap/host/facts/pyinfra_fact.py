"""The probe as a pyinfra fact: `get_facts(state, HostFactsFact)` -> {host: HostFacts}."""

from __future__ import annotations

import time

from pyinfra.api import FactBase

from .host_facts import HostFacts
from .probe import MAX_OUTPUT_BYTES, parse_host_facts, probe_script


class HostFactsFact(FactBase[HostFacts | None]):
    """Everything the tool needs to know about a host, in one round trip.

    pyinfra runs `command()` as `sh -c '<script>'` (under `sudo -H -n` when _sudo is set)
    and calls `process()` only for exit 0 with some stdout; the probe always exits 0 and
    prints its section delimiters, so a host that answers always yields a HostFacts.
    Returns None (the default) only if the command itself could not run.
    """

    # The script is POSIX sh; do not let a host-data _shell_executable swap it out.
    shell_executable = "sh"
    # HostSession.gather reads the output as bytes (bootstrap.remote.remote_output), capped and
    # with a deadline, rather than as pyinfra's strictly decoded text: the host is not trusted
    # to print UTF-8, or to stop. The deadline covers nvidia-smi's own 60 s bounds, seven times.
    untrusted_output = True
    max_output_bytes = MAX_OUTPUT_BYTES
    timeout_s = 600

    def command(self, paths: tuple[str, ...] = (), health: bool = True) -> str:
        return probe_script(paths, health)

    def process(self, output: list[str]) -> HostFacts:
        return parse_host_facts(output, received_at=time.time())

    def process_bytes(self, output: bytes) -> HostFacts:
        return parse_host_facts(output, received_at=time.time())
