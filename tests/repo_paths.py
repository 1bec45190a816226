"""Where the repository and the tests' folders are, for tests at any depth under tests/."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
TESTS = ROOT / "tests"
