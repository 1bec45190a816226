"""Resolve secrets named by reference (`*_env`, `*_file`); values never reach output or logs."""

from __future__ import annotations

import os
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
        return path.read_text().rstrip("\n")
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path}: {exc.strerror}") from None
