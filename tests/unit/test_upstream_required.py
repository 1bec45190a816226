"""Missing upstream reference data (../shared/upstream, or $BOOTSTRAP_UPSTREAM_DIR) stops the
run with one message instead of skipping dozens of tests; BOOTSTRAP_ALLOW_MISSING_UPSTREAM=1
is the explicit opt-out that skips them."""

import os
import subprocess
import sys
from pathlib import Path

import upstream

ROOT = Path(__file__).resolve().parents[2]
VOLCANO = "tests/unit/test_checks.py::test_volcano_jobs_validate_against_the_upstream_crd"


def pytest_run(*args, **env):
    merged = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_")}
    merged.update(env)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                            capture_output=True, text=True, cwd=ROOT, env=merged, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_a_missing_upstream_folder_stops_the_session_with_one_message(tmp_path):
    nowhere = tmp_path / "nowhere"
    code, out = pytest_run("tests/unit/test_progress.py", BOOTSTRAP_UPSTREAM_DIR=str(nowhere))
    assert code == 4, out  # pytest's usage error: nothing ran
    (line,) = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert str(nowhere) in line and "BOOTSTRAP_UPSTREAM_DIR" in line and upstream.ALLOW_MISSING in line
    assert "passed" not in out and "skipped" not in out


def test_a_file_missing_from_the_upstream_folder_fails_the_test_that_reads_it(tmp_path):
    folder = tmp_path / "upstream"
    (folder / upstream.FLAGS_NAME).parent.mkdir(parents=True)
    (folder / upstream.FLAGS_NAME).write_bytes((upstream.UPSTREAM / upstream.FLAGS_NAME).read_bytes())
    code, out = pytest_run(VOLCANO, BOOTSTRAP_UPSTREAM_DIR=str(folder))
    assert code == 1, out
    assert "1 failed" in out and "skipped" not in out
    assert f"upstream reference data not present: {folder}/volcano/1.15.1/crd/bases/" in out


def test_the_opt_out_skips_what_needs_upstream_and_says_so(tmp_path):
    nowhere = tmp_path / "nowhere"
    code, out = pytest_run(VOLCANO, BOOTSTRAP_UPSTREAM_DIR=str(nowhere), **{upstream.ALLOW_MISSING: "1"})
    assert code == 0, out
    assert "1 skipped" in out and f"upstream reference data not present: {nowhere}/volcano" in out
