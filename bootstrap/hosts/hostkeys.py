"""Pinned SSH host keys: one known_hosts file per cluster, kept in its state folder.

First contact records the key (a fresh rented VM has no key anyone could know in advance);
after that a different key is refused until the user says the machine was replaced.
"""

from __future__ import annotations

from pathlib import Path

import paramiko


def known_hosts_entry(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def forget(known_hosts: Path, address: str, port: int) -> bool:
    """Drop the pinned key of one endpoint; returns whether there was one."""
    if not known_hosts.exists():
        return False
    keys = paramiko.HostKeys(str(known_hosts))
    entry = known_hosts_entry(address, port)
    if entry not in keys:
        return False
    del keys[entry]
    keys.save(str(known_hosts))
    known_hosts.chmod(0o600)
    return True


def dedupe(known_hosts: Path) -> None:
    """pyinfra appends concurrently on first contact and can repeat lines; keep each once."""
    if not known_hosts.exists():
        return
    lines = known_hosts.read_text().splitlines()
    unique = list(dict.fromkeys(line for line in lines if line.strip()))
    if unique != lines:
        known_hosts.write_text("\n".join(unique) + "\n")
    known_hosts.chmod(0o600)
