"""Upstream reference data (chart values, CRDs, examples, k3s's documented flags).

Read from the first of:
  $BOOTSTRAP_UPSTREAM_DIR           when set
  ../shared/upstream                next to the repository (CI has it)
  .upstream/                        in the repository, filled by scripts/fetch-upstream (internet needed)

Without any of them, each test that needs the data skips with one line saying where to get it, and
the rest of the suite runs. BOOTSTRAP_REQUIRE_UPSTREAM=1 (CI) turns that into a stop: tests/conftest.py
ends the session at once with the same line, and a file missing from the folder fails its test."""

import os
from pathlib import Path

import pytest

from standins.airgap import FLAGS_NAME

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "upstream"
FETCHED = ROOT / ".upstream"
REQUIRE = "BOOTSTRAP_REQUIRE_UPSTREAM"
# The files the tests read, with their sha256, kept in the repository; scripts/fetch-upstream checks them.
MANIFEST = ROOT / "tests" / "upstream.sha256"


def upstream_dir() -> Path:
    env = os.environ.get("BOOTSTRAP_UPSTREAM_DIR")
    if env:
        return Path(env)
    return SHARED if SHARED.is_dir() else FETCHED


UPSTREAM = upstream_dir()


def required() -> bool:
    return os.environ.get(REQUIRE) == "1"


def why_missing() -> str | None:
    """The one line for absent upstream data, or None when it is there."""
    if (UPSTREAM / FLAGS_NAME).is_file() or any(UPSTREAM.glob("*/*")):
        return None
    return (f"upstream reference data not found at {UPSTREAM}: run scripts/fetch-upstream (internet needed) "
            f"or set BOOTSTRAP_UPSTREAM_DIR")


def upstream(relative: str) -> Path:
    path = UPSTREAM / relative
    if not path.exists():
        message = why_missing() or f"upstream reference data not present: {path}"
        if required():
            pytest.fail(f"{message} ({REQUIRE}=1)", pytrace=False)
        pytest.skip(message)
    return path


def k3s_flags(role: str) -> set[str]:
    lines = upstream(FLAGS_NAME).read_text().splitlines()
    return {line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{role}:")}
