"""Pinned SSH host keys: one known_hosts file per cluster, kept in its state folder.

First contact records the key (a fresh rented VM has no key anyone could know in advance);
after that a different key is refused until the user says the machine was replaced.

The file is only ever replaced whole (a private temp file in the same folder, then
os.replace), by commands holding the cluster lock: a reader never sees half a file, and a
crash mid-write leaves the old one.
"""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from bootstrap import statedir

_WRITING = threading.Lock()  # read-modify-write of one file by parallel connects in one process


def known_hosts_entry(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def write_atomically(known_hosts: Path, text: str) -> None:
    statedir.write_atomically(known_hosts, text.encode(), 0o600)  # the folder fsynced too


def _lines(known_hosts: Path) -> list[str]:
    return [line for line in known_hosts.read_text().splitlines() if line.strip()] if known_hosts.exists() else []


def merge(known_hosts: Path, text: str) -> None:
    """Add the lines of `text` that the file lacks (each once)."""
    with _WRITING:
        old = _lines(known_hosts)
        new = list(dict.fromkeys(old + [line for line in text.splitlines() if line.strip()]))
        if new != old or not known_hosts.exists():
            write_atomically(known_hosts, "".join(f"{line}\n" for line in new))


def pin(known_hosts: Path, hostname: str, key: paramiko.PKey) -> None:
    merge(known_hosts, HostKeyEntry([hostname], key).to_line())


def _names(line: str, entry: str) -> bool:
    parsed = HostKeyEntry.from_line(line)
    if parsed is None:
        return False
    return any(name == entry or (name.startswith("|1|") and paramiko.HostKeys.hash_host(entry, name) == name)
               for name in parsed.hostnames)


def forget(known_hosts: Path, address: str, port: int) -> bool:
    """Drop the pinned key of one endpoint; returns whether there was one."""
    entry = known_hosts_entry(address, port)
    with _WRITING:
        lines = _lines(known_hosts)
        kept = [line for line in lines if not _names(line, entry)]
        if kept == lines:
            return False
        write_atomically(known_hosts, "".join(f"{line}\n" for line in kept))
    return True


class PinFirstContact(paramiko.MissingHostKeyPolicy):
    """First contact pins the key (as `up` does); a changed key is refused by paramiko itself."""

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        pin(self.known_hosts, hostname, key)
