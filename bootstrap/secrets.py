"""Resolve secrets named by reference (`*_env`, `*_file`); values never reach output or logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bootstrap.errors import UsageError
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


_warned: set[str] = set()


def warn_if_readable_by_others(path: Path, what: str) -> None:
    """A secret file other users can read is a leaked secret on a shared machine."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077 and str(path) not in _warned:
        _warned.add(str(path))
        print(f"warning: {what}: {path} can be read by other users (mode {mode:04o}); "
              f"run: chmod 600 {path}", file=sys.stderr)
