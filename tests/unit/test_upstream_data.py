"""Upstream reference data is optional for a user: without ../shared/upstream or a fetched
.upstream/, the tests that need it skip with one line and the rest run; CI requires it
(BOOTSTRAP_REQUIRE_UPSTREAM=1). The k3s stand-in needs none of it: it uses the product's own
flag list. scripts/fetch-upstream fills .upstream/ and keeps only files whose sha256 is listed."""

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import upstream
from repo_paths import ROOT

VOLCANO = "tests/unit/cluster/test_checks.py::test_volcano_jobs_validate_against_the_upstream_crd"
NEEDS_DATA = [VOLCANO, "tests/unit/cluster/components/test_components.py",
              "tests/unit/inventory/test_inventory_hostile.py::test_the_shipped_flag_list_matches_upstream"]
NEEDS_NOTHING = "tests/unit/test_progress.py"


def pytest_run(*args, **env):
    merged = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_")}
    merged.update(env)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                            capture_output=True, text=True, cwd=ROOT, env=merged, timeout=300)
    return result.returncode, result.stdout + result.stderr


def load_fetcher():
    loader = importlib.machinery.SourceFileLoader("fetch_upstream", str(ROOT / "scripts" / "fetch-upstream"))
    spec = importlib.util.spec_from_loader("fetch_upstream", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_without_upstream_data_the_tests_that_need_it_skip_and_the_rest_pass(tmp_path):
    nowhere = tmp_path / "nowhere"
    code, out = pytest_run(*NEEDS_DATA, NEEDS_NOTHING, BOOTSTRAP_UPSTREAM_DIR=str(nowhere))
    assert code == 0, out[-3000:]
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and " skipped" in summary and "failed" not in summary, summary
    reasons = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert reasons and all(f"not found at {nowhere}: run scripts/fetch-upstream" in line for line in reasons)


def test_ci_requires_the_data_and_stops_at_once_with_one_line(tmp_path):
    nowhere = tmp_path / "nowhere"
    code, out = pytest_run(NEEDS_NOTHING, BOOTSTRAP_UPSTREAM_DIR=str(nowhere), **{upstream.REQUIRE: "1"})
    assert code == 4, out  # pytest's usage error: nothing ran
    (line,) = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert str(nowhere) in line and "scripts/fetch-upstream" in line
    assert "passed" not in out and "skipped" not in out


@pytest.mark.skipif(upstream.why_missing() is not None, reason=upstream.why_missing() or "")
def test_ci_fails_a_test_whose_file_is_missing_from_the_folder(tmp_path):
    folder = tmp_path / "upstream"
    (folder / upstream.FLAGS_NAME).parent.mkdir(parents=True)
    (folder / upstream.FLAGS_NAME).write_bytes((upstream.UPSTREAM / upstream.FLAGS_NAME).read_bytes())
    code, out = pytest_run(VOLCANO, BOOTSTRAP_UPSTREAM_DIR=str(folder), **{upstream.REQUIRE: "1"})
    assert code == 1, out
    assert "1 failed" in out and f"upstream reference data not present: {folder}/volcano/1.15.1/crd/bases/" in out


def test_the_k3s_standin_builds_from_the_shipped_flag_list_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_")}
    env["BOOTSTRAP_UPSTREAM_DIR"] = str(tmp_path / "nowhere")
    result = subprocess.run([sys.executable, "tests/standins/airgap.py", str(tmp_path / "airgap")],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "airgap" / "k3s").is_file()


@pytest.mark.skipif(upstream.why_missing() is not None, reason=upstream.why_missing() or "")
def test_the_sha256_list_matches_the_upstream_data_and_covers_what_the_tests_read():
    fetcher = load_fetcher()
    assert fetcher.check(upstream.UPSTREAM) == []
    listed = {name for _, name, _ in fetcher.entries()}
    used = {"volcano/1.15.1/crd/bases/batch.volcano.sh_jobs.yaml", "gpu-operator/v26.7.0/values.yaml",
            "k8s-device-plugin/0.20.0/readme-examples/mps.yaml", upstream.FLAGS_NAME}
    assert used <= listed


def test_fetch_keeps_only_files_with_the_listed_sha256(tmp_path, monkeypatch):
    fetcher = load_fetcher()
    readme = "".join(f"line {n}\n" for n in range(1, 20)).encode()
    good = b"kind: Values\n"
    cut = b"line 3\nline 4\n"
    manifest = tmp_path / "upstream.sha256"
    manifest.write_text(
        "# comment\n"
        f"{hashlib.sha256(good).hexdigest()}  chart/values.yaml  o/r@{'a' * 40}:charts/values.yaml\n"
        f"{hashlib.sha256(cut).hexdigest()}  chart/example.yaml  o/r@{'a' * 40}:README.md#L3-L4\n"
        f"{'0' * 64}  chart/tampered.yaml  o/r@{'a' * 40}:charts/values.yaml\n"
        f"{'1' * 64}  k3s/flags.txt  -\n")
    served = {"charts/values.yaml": good, "README.md": readme}
    monkeypatch.setattr(fetcher, "MANIFEST", manifest)
    monkeypatch.setattr(fetcher, "download", lambda url: served[url.split(f"{'a' * 40}/", 1)[1]])
    failures = fetcher.fill(tmp_path / "data")
    assert (tmp_path / "data" / "chart" / "values.yaml").read_bytes() == good
    assert (tmp_path / "data" / "chart" / "example.yaml").read_bytes() == cut
    assert not (tmp_path / "data" / "chart" / "tampered.yaml").exists()
    assert failures == ["chart/tampered.yaml: sha256 differs from tests/upstream.sha256, not kept"]
    assert fetcher.check(tmp_path / "data") == ["chart/tampered.yaml: missing"]


def test_the_fetch_list_refuses_paths_that_leave_the_folder(tmp_path):
    fetcher = load_fetcher()
    manifest = tmp_path / "upstream.sha256"
    manifest.write_text(f"{'0' * 64}  ../../etc/passwd  o/r@{'a' * 40}:x\n")
    with pytest.raises(ValueError):
        fetcher.entries(manifest)
