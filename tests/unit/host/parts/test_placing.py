"""Host files are never written in place: the real root scripts (converge's placement, the
manifest line of `down`) through a real dash and coreutils, on this machine (bootstrap.remote.archive
over tests/fakes.py's LocalShellClient). A full disk, a signal or a leftover from a killed
run leaves every target whole: its old content or its new, nothing between."""

import io
import os
import shlex
import signal
import subprocess
import time

import pytest

from bootstrap.deploys.converge import placement_commands
from bootstrap.host.parts import placing
from bootstrap.host.parts.base import FileSpec, text_file
from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.remote import archive
from bootstrap.inventory.loader import parse_inventory
from fakes import run_here

INV = parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n")
NODE = INV.nodes[0]


def _script_and_sources(uploads, prepare=()):
    (command,) = placement_commands(HostPlan(node=NODE, unit="k3s", uploads=list(uploads), prepare=list(prepare)))
    return command.args


def _run(script, sources):
    return run_here(script, sources)


@pytest.fixture
def stage_here(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "STAGE_PREFIX", str(tmp_path / "stage-"))
    return tmp_path


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: a full disk on demand (root only, as the host tests)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]).returncode:
        pytest.skip("needs root and tmpfs mounts (a small disk to fill)")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_every_host_file_goes_to_a_temp_in_its_folder_and_is_renamed():
    script, _ = _script_and_sources([text_file("/etc/rancher/k3s/config.yaml", "token: x\n", 0o600, secret=True),
                                     text_file("/etc/systemd/system/k3s.service", "[Unit]\n")])
    assert "install -D" not in script and "install -m" not in script
    assert "place \"$stage\"/0 0600 /etc/rancher/k3s/config.yaml" in script
    assert "place \"$stage\"/1 0644 /etc/systemd/system/k3s.service" in script
    assert 'mktemp -- "$d/.$n.bootstrap-tmp.XXXXXXXXXX"' in script and 'sync -- "$placing"' in script
    assert script.index("sync -- \"$placing\"") < script.index("mv -fT")


def test_files_land_whole_with_mode_and_owner_and_a_killed_runs_leftover_goes(stage_here):
    etc = stage_here / "etc" / "rancher"
    etc.mkdir(parents=True)
    leftover = etc / ".config.yaml.bootstrap-tmp.AbCdEfGhIj"
    leftover.write_text("half a config")  # a run killed (SIGKILL, power) between mktemp and mv
    binary = stage_here / "k3s-release"
    binary.write_bytes(bytes(range(256)) * 4096)
    script, sources = _script_and_sources([
        text_file(str(etc / "config.yaml"), "token: SECRET\n", 0o600, secret=True),
        FileSpec(str(stage_here / "bin" / "k3s"), 0o755, "-", local=binary)])
    assert _run(script, sources)
    config = etc / "config.yaml"
    assert config.read_text() == "token: SECRET\n" and oct(config.stat().st_mode & 0o777) == "0o600"
    assert (config.stat().st_uid, config.stat().st_gid) == (0, 0)
    assert (stage_here / "bin" / "k3s").read_bytes() == binary.read_bytes()
    assert oct((stage_here / "bin" / "k3s").stat().st_mode & 0o777) == "0o755"
    assert sorted(p.name for p in etc.iterdir()) == ["config.yaml"]  # the leftover is gone, no new one
    assert not list(stage_here.glob("stage-*"))


def test_a_full_disk_leaves_the_old_file_whole(stage_here, small_disk):
    """The old `install -D` truncated the target and wrote into it until the disk was full."""
    target = small_disk / "k3s"
    target.write_bytes(b"old binary\n")
    big = stage_here / "new-k3s"
    big.write_bytes(b"n" * (1024 * 1024))
    script, sources = _script_and_sources([FileSpec(str(target), 0o755, "-", local=big)])
    with pytest.raises(archive.RemoteCommandFailed):
        _run(script, sources)
    assert target.read_bytes() == b"old binary\n"
    assert sorted(p.name for p in small_disk.iterdir()) == ["k3s"]  # the trap took the temp
    assert not list(stage_here.glob("stage-*"))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_script_still_removes_the_stage(stage_here, sig):
    """dash runs an EXIT trap on `exit`, not on a signal's death: the SSH connection cut
    (SIGHUP through sudo) left the staging dir with config.yaml's token in /tmp."""
    script, sources = _script_and_sources([text_file(str(stage_here / "conf"), "token: SECRET\n", 0o600)],
                                          prepare=["sleep 30"])
    with io.BytesIO() as stream:
        archive.write_archive(stream, sources)
        data = stream.getvalue()
    shell = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, start_new_session=True)
    shell.stdin.write(data)
    shell.stdin.close()
    deadline = time.monotonic() + 10
    while not (stage_here / "conf").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(stage_here.glob("stage-*"))  # the script is in its `sleep`, the stage still there
    os.killpg(shell.pid, sig)  # the whole session, as a hangup or Ctrl-C reaches it
    assert shell.wait(10) != 0
    assert not list(stage_here.glob("stage-*"))


def test_downs_manifest_is_replaced_whole_and_leftovers_go(tmp_path):
    target = tmp_path / "lib" / "manifest.json"
    target.parent.mkdir()
    target.write_text("{}\n")
    (target.parent / ".manifest.json.bootstrap-tmp.XyZ").write_text("{")
    (tmp_path / ".k3s.bootstrap-tmp.Q").write_text("half")
    line = placing.write_text(shlex.quote('{"packages_installed": ["x"]}'), 0o644, str(target))
    line += "\n" + placing.leftovers([str(target), str(tmp_path / "k3s")])
    subprocess.run(["sh", "-ec", line], check=True)
    assert target.read_text() == '{"packages_installed": ["x"]}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["manifest.json"]
    assert not list(tmp_path.glob(".k3s.*"))
