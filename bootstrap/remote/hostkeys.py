"""Pinned SSH host keys: one known_hosts file per cluster, kept in its state folder.

First contact records the key (a fresh rented VM has no key anyone could know in advance);
after that a different key is refused until the user says the machine was replaced.
(paramiko's policy that pins a first contact is bootstrap.remote.sshlink.PinFirstContact.)

The file is only ever replaced whole (a private temp file in the same folder, then
os.replace), by commands holding the cluster lock: a reader never sees half a file, and a
crash mid-write leaves the old one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from pathlib import Path

from bootstrap.state import folder as statedir

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


def pin(known_hosts: Path, hostname: str, key) -> None:
    """Pin `key` (a paramiko PKey: its type name and base64 blob) for `hostname`."""
    merge(known_hosts, f"{hostname} {key.get_name()} {key.get_base64()}")


def _hashed_name_is(name: str, entry: str) -> bool:
    """OpenSSH's HashKnownHosts form, `|1|<salt>|<HMAC-SHA1 of the name keyed by the salt>`,
    both base64 (as paramiko.HostKeys.hash_host makes it)."""
    parts = name.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
    except (binascii.Error, ValueError):
        return False
    digest = base64.b64encode(hmac.new(salt, entry.encode(), hashlib.sha1).digest()).decode()
    return hmac.compare_digest(digest, parts[3])


def _names(line: str, entry: str) -> bool:
    """Whether a known_hosts line (`names keytype key`) names `entry`, plainly or hashed."""
    fields = line.split()
    if len(fields) < 3:
        return False
    return any(name == entry or _hashed_name_is(name, entry) for name in fields[0].split(","))


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
