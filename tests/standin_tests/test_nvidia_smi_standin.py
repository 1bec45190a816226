"""The nvidia-smi stand-in replays the H200 recordings, and the host probe run against it
sees the same H200 that the real recordings describe."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.host.facts.probe import NVSMI_QUERY_ARGS, PROBE_SCRIPT, parse_host_facts, split_sections

TESTS = Path(__file__).resolve().parents[1]
STANDIN = TESTS / "standins" / "nvidia-smi"
FIXTURES = TESTS / "fixtures" / "gpu-vm-h200"
SH = shutil.which("dash") or "/bin/sh"
BROKEN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def nvsmi_recordings() -> list[tuple[list[str], str, int]]:
    """(argv after nvidia-smi, expected stdout, rc) for every nvidia-smi fixture."""
    result = []
    for path in sorted(FIXTURES.iterdir()):
        lines = path.read_text().split("\n")
        if lines[-1] == "":
            lines.pop()
        argv = shlex.split(lines[0][2:])
        if argv[0] == "nvidia-smi":
            body = lines[1:-1]
            result.append((argv[1:], "".join(line + "\n" for line in body), int(lines[-1][5:])))
    return result


def standin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_NVSMI")}
    return subprocess.run([str(STANDIN), *args], capture_output=True, text=True, env={**base, **(env or {})})


def test_recordings_cover_the_probe():
    argvs = [argv for argv, _, _ in nvsmi_recordings()]
    for needed in ([], shlex.split(NVSMI_QUERY_ARGS), ["mig", "-lgip"], ["mig", "-lgipp"]):
        assert needed in argvs


@pytest.mark.parametrize("argv,stdout,rc", nvsmi_recordings(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_replays_each_recording(argv, stdout, rc):
    proc = standin(*argv)
    assert (proc.stdout, proc.returncode, proc.stderr) == (stdout, rc, "")


def test_unknown_arguments():
    proc = standin("--query-gpu=bogus", "--format=csv")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "stand-in has no recording for" in proc.stderr and "--query-gpu=bogus" in proc.stderr


def test_broken_driver_switch():
    proc = standin("--query-gpu=index", env={"BOOTSTRAP_NVSMI_BROKEN": "1"})
    assert (proc.stdout.strip(), proc.returncode) == (BROKEN, 9)
    assert standin(env={"BOOTSTRAP_NVSMI_BROKEN": "0"}).returncode == 0


def test_fixture_directory_from_environment(tmp_path):
    (tmp_path / "no-devices.txt").write_text("$ nvidia-smi\nNo devices were found\n# rc=6\n")
    (tmp_path / "other-tool.txt").write_text("$ uname -a\nLinux\n# rc=0\n")
    proc = standin(env={"BOOTSTRAP_NVSMI_FIXTURES": str(tmp_path)})
    assert (proc.stdout, proc.returncode) == ("No devices were found\n", 6)
    assert standin("-L", env={"BOOTSTRAP_NVSMI_FIXTURES": str(tmp_path)}).returncode == 2


def test_runs_on_the_stdlib_only():
    """Test hosts have Debian's bare python3: no site-packages, no project imports."""
    proc = subprocess.run([sys.executable, "-I", "-S", str(STANDIN), "-L"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("GPU 0: NVIDIA H200")


# --- the probe against the stand-in ---------------------------------------------------------


def probe_with_standin(tmp_path: Path, **env: str):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(STANDIN)  # the stand-in finds its fixtures through the link
    base = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_NVSMI")}
    full_env = {**base, **env, "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = subprocess.run([SH, "-c", PROBE_SCRIPT], capture_output=True, text=True, env=full_env, timeout=120)
    assert proc.returncode == 0
    return split_sections(proc.stdout), parse_host_facts(proc.stdout)


def test_probe_sees_the_h200(tmp_path):
    sections, facts = probe_with_standin(tmp_path)
    for name in ("nvidia-smi", "nvidia-smi-query", "nvidia-smi-mig-lgip", "nvidia-smi-mig-lgipp"):
        assert sections[name].rc == 0, (name, sections[name].lines)
    assert facts.gpu_error is None
    (gpu,) = facts.gpus
    assert (gpu.name, gpu.memory_mib, gpu.compute_capability) == ("NVIDIA H200", 143771, "9.0")
    assert (facts.driver_version, facts.cuda_version) == ("580.159.04", "13.0")
    assert gpu.mig_current is False and gpu.mig_pending is False
    assert len(facts.mig_profiles) == 7 and facts.mig_profiles[-1].placements == [(0, 8)]


def test_probe_with_broken_driver(tmp_path):
    sections, facts = probe_with_standin(tmp_path, BOOTSTRAP_NVSMI_BROKEN="1")
    assert sections["nvidia-smi"].rc == 9
    assert "nvidia-smi-query" not in sections  # no point asking a driver that is not there
    assert facts.gpus == [] and facts.gpu_error == BROKEN
