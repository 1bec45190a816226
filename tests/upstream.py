"""Upstream reference data (chart values, CRDs, k3s flags) read from ../shared/upstream.

Missing data is an error, not a skip: tests/conftest.py stops the session when the folder
is absent, and a file missing from it fails the test that reads it. Only with
BOOTSTRAP_ALLOW_MISSING_UPSTREAM=1 do those tests skip instead (say so when you report a run)."""

import os
from pathlib import Path

import pytest

from standins.airgap import FLAGS_NAME, upstream_dir

UPSTREAM = upstream_dir()  # $BOOTSTRAP_UPSTREAM_DIR, else ../shared/upstream next to the repository
ALLOW_MISSING = "BOOTSTRAP_ALLOW_MISSING_UPSTREAM"


def missing_allowed() -> bool:
    return os.environ.get(ALLOW_MISSING) == "1"


def why_missing() -> str | None:
    """The one message for absent upstream data, or None when it is there."""
    if (UPSTREAM / FLAGS_NAME).is_file():
        return None
    return (f"upstream reference data not found at {UPSTREAM} (no {FLAGS_NAME}): set BOOTSTRAP_UPSTREAM_DIR "
            f"to the folder that holds it (default: ../shared/upstream next to the repository), or set "
            f"{ALLOW_MISSING}=1 to skip the tests that need it")


def upstream(relative: str) -> Path:
    path = UPSTREAM / relative
    if not path.exists():
        message = f"upstream reference data not present: {path}"
        if missing_allowed():
            pytest.skip(message)
        pytest.fail(f"{message} (set BOOTSTRAP_UPSTREAM_DIR, or {ALLOW_MISSING}=1 to skip)", pytrace=False)
    return path


def k3s_flags(role: str) -> set[str]:
    lines = upstream(FLAGS_NAME).read_text().splitlines()
    return {line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{role}:")}
