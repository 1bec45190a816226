"""Upstream reference data (chart values, CRDs, k3s flags) read from ../shared/upstream."""

import os
from pathlib import Path

import pytest

UPSTREAM = Path(os.environ.get("BOOTSTRAP_UPSTREAM_DIR")
                or Path(__file__).resolve().parents[2] / "shared" / "upstream")


def upstream(relative: str) -> Path:
    path = UPSTREAM / relative
    if not path.exists():
        pytest.skip(f"upstream reference data not present: {path}")
    return path


def k3s_flags(role: str) -> set[str]:
    lines = upstream("k3s/flags-docs-0243496.txt").read_text().splitlines()
    return {line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{role}:")}
