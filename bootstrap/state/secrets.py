"""Resolve secrets named by reference (`*_env`, `*_file`); values never reach output or logs."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from bootstrap.console_text import write_text
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.inventory.model import SecretRef


def resolve(ref: SecretRef | None, what: str) -> str | None:
    if ref is None:
        return None
    if ref.env:
        value = os.environ.get(ref.env)
        if value is None:
            raise UsageError(f"{what}: environment variable {ref.env} is not set",
                             f"export {ref.env}=... before running, or use a *_file reference")
        return value
    path = Path(ref.file).expanduser()
    try:
        value = path.read_text().rstrip("\n")
        warn_if_readable_by_others(path, what)
        return value
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror}") from None


def ssh_password(inventory, node) -> str | None:
    """`node`'s SSH password, for logging in to `node` only; None when it names none (keys).
    One whose value is another node's too is refused: the inventory check compares what the
    references name, this compares what they hold (two variables set to one password)."""
    own = resolve(inventory.ssh_for(node).password, f"ssh password for {node.name}")
    if own is None:
        return None
    for other in inventory.nodes:
        ref = inventory.ssh_for(other).password
        if other.name != node.name and ref is not None and resolve(ref, f"ssh password for {other.name}") == own:
            raise UsageError(f"{node.name} and {other.name} have the same SSH password: each is offered it when "
                             "it logs in, so a host that gets it can log in to the other; nothing was sent",
                             "give each node its own password (nodes[].ssh.password_env or password_file), "
                             "or use SSH keys (ssh.key), the default")
    return own


_warned: set[str] = set()


def warn_if_readable_by_others(path: Path, what: str) -> None:
    """A secret file other users can read is a leaked secret on a shared machine."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077 and str(path) not in _warned:
        _warned.add(str(path))
        write_text(sys.stderr, f"warning: {what}: {path} can be read by other users (mode {mode:04o}); "
                               f"run: chmod 600 {path}")


def with_secret_values(inventory):
    """The inventory with the secrets that end up in host files read (I/O, once, before
    planning): S3 credentials (config.yaml) and registry credentials (registries.yaml)."""
    def filled(ref: SecretRef | None, what: str) -> SecretRef | None:
        return None if ref is None else replace(ref, value=resolve(ref, what))

    k3s = inventory.k3s
    s3 = k3s.snapshots.s3
    if s3 is not None:
        s3 = replace(s3, access_key=filled(s3.access_key, "k3s.snapshots.s3.access_key"),
                     secret_key=filled(s3.secret_key, "k3s.snapshots.s3.secret_key"))
        k3s = replace(k3s, snapshots=replace(k3s.snapshots, s3=s3))
    auth = {host: replace(a, password=filled(a.password, f"registries.auth.{host}.password"),
                          token=filled(a.token, f"registries.auth.{host}.token"))
            for host, a in inventory.registries.auth.items()}
    return replace(inventory, k3s=k3s, registries=replace(inventory.registries, auth=auth))


def secret_value(ref: SecretRef | None, what: str) -> str | None:
    """A secret the flow already read (pure: no environment, no files)."""
    if ref is None:
        return None
    if ref.value is None:
        raise BootstrapError(f"{what} was not read before planning (bootstrap.state.secrets.with_secret_values)")
    return ref.value
