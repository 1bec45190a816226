"""The lab as the README starts it: `python tests/testhosts.py up` brings up the hosts and
everything inventories/lab.yaml names (the k3s air-gap folder, the NVIDIA toolkit's apt
repository), so the shipped inventory works as it is; `down` ends what `up` started."""

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from clirun import run_bootstrap

import testhosts

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "inventories" / "lab.yaml"


def lab_cli(*args, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "tests" / "testhosts.py"), *args], capture_output=True,
                          text=True, timeout=timeout)


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def cli_lab():
    why = testhosts.requirements_missing()
    if why:
        pytest.skip(why)
    try:
        yield
    finally:
        lab_cli("down")


def test_testhosts_up_serves_what_the_lab_inventory_names(cli_lab, tmp_path):
    up = lab_cli("up")
    assert up.returncode == 0, up.stdout + up.stderr
    lab = yaml.safe_load(LAB_INVENTORY.read_text())
    assert lab["gpu"]["container_toolkit"]["apt_source"] == testhosts.LAB_APT_SOURCE
    with urllib.request.urlopen(f"http://10.200.0.1:{testhosts.LAB_APT_PORT}/Packages", timeout=5) as reply:
        assert b"Package: nvidia-container-toolkit" in reply.read()
    again = lab_cli("up")  # idempotent: the hosts and the repository stay
    assert again.returncode == 0, again.stderr
    pid = testhosts._apt_server_pid()
    assert pid is not None

    # The shipped inventory, unedited: the GPU hosts get the toolkit from the lab's repository.
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    hosts = run_bootstrap("up", LAB_INVENTORY, "--hosts-only", env=env, timeout=600)
    assert hosts.returncode == 0, hosts.stdout + hosts.stderr
    for address in ("10.200.0.12", "10.200.0.13"):
        toolkit = subprocess.run(["ssh", "-i", str(testhosts.key_path()), "-o", "StrictHostKeyChecking=no",
                                  "-o", "UserKnownHostsFile=/dev/null", f"{testhosts.SSH_USER}@{address}",
                                  "dpkg-query -W -f '${Status}' nvidia-container-toolkit"],
                                 capture_output=True, text=True, timeout=30)
        assert toolkit.stdout == "hold ok installed", toolkit.stdout + toolkit.stderr  # installed, and held

    down = lab_cli("down")
    assert down.returncode == 0, down.stderr
    assert not running(pid), "the repository process outlived `down`"
    assert testhosts._apt_server_pid() is None
