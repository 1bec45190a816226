"""The probe as a pyinfra fact: `get_facts(state, HostFactsFact)` -> {host: HostFacts}."""

from __future__ import annotations

from pyinfra.api import FactBase

from .host_facts import HostFacts
from .probe import parse_host_facts, probe_script


class HostFactsFact(FactBase[HostFacts | None]):
    """Everything the tool needs to know about a host, in one round trip.

    pyinfra runs `command()` as `sh -c '<script>'` (under `sudo -H -n` when _sudo is set)
    and calls `process()` only for exit 0 with some stdout; the probe always exits 0 and
    prints its section delimiters, so a host that answers always yields a HostFacts.
    Returns None (the default) only if the command itself could not run.
    """

    # The script is POSIX sh; do not let a host-data _shell_executable swap it out.
    shell_executable = "sh"

    def command(self, paths: tuple[str, ...] = (), health: bool = True) -> str:
        return probe_script(paths, health)

    def process(self, output: list[str]) -> HostFacts:
        import time

        return parse_host_facts(output, received_at=time.time())
