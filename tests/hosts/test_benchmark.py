"""The benchmark harness at N=3 on a direct link: a no-op `up` stays within its budget of
remote commands per host (the harness itself exits 1 when it does not)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.hosts

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


def test_noop_up_stays_within_the_command_budget(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(BENCH), "--agents", "3", "--rtt", "0", "--budget", "25",
                             "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["noop_up"]["max_commands_per_host"] <= 25
    assert row["noop_up"]["max_commands_per_host"] < row["fresh_up"]["max_commands_per_host"]
