"""The commands a plan turns into: secrets stay off command lines, downloads are verified,
teardown undoes only what the manifest says the tool did."""

import hashlib

import pytest

from bootstrap.host.release import airgap_artifacts, online_artifacts
from bootstrap.deploys.converge import placed_and_started, placement_commands, wait_for_service
from bootstrap.errors import UsageError
from bootstrap.host.parts.base import text_file
from bootstrap.host.parts.k3s_binary import download as download_k3s
from bootstrap.host.parts.k3s_service import CONFIG
from bootstrap.host.parts.kernel import SYSCTL_FILE
from bootstrap.host.parts.manifest import MANIFEST
from bootstrap.host.parts import packages
from bootstrap.host.parts.packages import apt_lists_prefix
from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.inventory.loader import parse_inventory
from bootstrap.host.teardown import teardown_script

INV = parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n")


def test_a_hosts_files_and_root_script_are_one_command():
    plan = HostPlan(node=INV.nodes[0], unit="k3s",
                    uploads=[text_file(CONFIG, "token: SECRET\n", 0o600, secret=True)],
                    prepare=["systemctl daemon-reload"])
    commands = placement_commands(plan)
    (command,) = commands  # files on the root script's stdin: one channel, no SFTP session
    script, sources = command.args
    assert len(sources) == 1 and sources[0].getvalue() == b"token: SECRET\n"
    assert f"place \"$stage\"/0 0600 {CONFIG}" in script  # bootstrap.host.parts.placing: temp, sync, rename
    assert script.startswith("set -e") and "SECRET" not in script
    assert placement_commands(HostPlan(node=INV.nodes[0], unit="k3s")) == []
    # without files: the preparation lines alone (a download places with `place` too), as a plain command
    (plain,) = placement_commands(HostPlan(node=INV.nodes[0], unit="k3s", prepare=["true"]))
    assert str(plain).startswith("set -e\n") and str(plain).endswith("\n}\ntrue") and "place() {" in str(plain)


def test_a_joiners_config_and_its_start_are_one_command():
    """A join's config.yaml (it names the CA, so it waits for the first server) and the start
    that needs it: one channel instead of two commands, one round trip less per join."""
    plan = HostPlan(node=INV.nodes[0], unit="k3s-agent", service="start", pull_after_start=["echo pulls"],
                    uploads=[text_file(CONFIG, "token: SECRET\n", 0o600, secret=True)])
    (command,) = placed_and_started(plan, "start")
    script, sources = command.args
    assert sources[0].getvalue() == b"token: SECRET\n" and "SECRET" not in script
    # placed first, under `set -e`; the wait runs as it does alone (its own exits decide)
    assert script.index(f"place \"$stage\"/0 0600 {CONFIG}") < script.index("set +e") \
        < script.index("systemctl start --no-block $u")
    assert script.endswith(str(wait_for_service("k3s-agent", "start", plan.start_timeout, then=["echo pulls"])))
    # nothing to place: the start alone
    (alone,) = placed_and_started(HostPlan(node=INV.nodes[0], unit="k3s", service="restart"), "restart")
    assert str(alone) == str(wait_for_service("k3s", "restart"))


def test_the_staging_dir_goes_on_every_exit_of_the_root_script():
    plan = HostPlan(node=INV.nodes[0], unit="k3s", uploads=[text_file(CONFIG, "token: SECRET\n", 0o600, secret=True)],
                    prepare=["false"])
    script = placement_commands(plan)[-1].args[0]
    assert "stage=$(mktemp -d /tmp/bootstrap-stage-XXXXXXXXXX)" in script
    # the trap is set before anything can fail, so `set -e` leaves nothing behind
    assert script.index("trap 'rm -rf ${stage:+\"$stage\"}") < script.index("tar -x") < script.index("place \"$stage\"") \
        < script.index("false")


def test_the_archive_arrives_with_private_modes_and_the_stage_goes(tmp_path, monkeypatch):
    """The real script and archive through a real shell and GNU tar (tests/fakes.py's LocalShellClient):
    files land with their modes, the staging dir is private while it exists and is gone
    after success and after a failure."""
    from bootstrap.remote import archive

    monkeypatch.setattr(archive, "STAGE_PREFIX", str(tmp_path / "stage-"))
    target, binary = tmp_path / "etc" / "config.yaml", tmp_path / "k3s"
    binary.write_bytes(bytes(range(256)) * 4096)
    lines = archive.receiving_lines() + [
        'stat -c "%a" "$stage" > ' + str(tmp_path / "mode-of-stage"),
        f"install -D -m 0600 {archive.staged(0)} {target}",
        f"install -D -m 0755 {archive.staged(1)} {tmp_path / 'bin' / 'k3s'}"]
    import io

    from fakes import run_here

    assert run_here("\n".join(lines), [io.BytesIO(b"token: SECRET\n"), str(binary)])
    assert target.read_bytes() == b"token: SECRET\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert (tmp_path / "bin" / "k3s").read_bytes() == binary.read_bytes()
    assert (tmp_path / "mode-of-stage").read_text().strip() == "700"
    assert not list(tmp_path.glob("stage-*"))
    failing = "\n".join(archive.receiving_lines() + ['echo no room >&2', 'false'])
    with pytest.raises(archive.RemoteCommandFailed) as failed:
        run_here(failing, [io.BytesIO(b"x")])
    assert failed.value.line == "no room"
    assert not list(tmp_path.glob("stage-*"))


def test_service_wait_fails_fast_on_a_crash():
    text = str(wait_for_service("k3s-agent", "restart", timeout=30))
    assert "u=k3s-agent" in text and "systemctl restart --no-block $u" in text and "auto-restart" in text
    assert "grep -iv token" in text  # log lines shown on failure never carry a token


def test_online_download_is_checksum_verified():
    lines = download_k3s(online_artifacts("v1.33.5+k3s1", "arm64"))
    text = "\n".join(lines)
    assert "releases/download/v1.33.5%2Bk3s1/k3s-arm64" in text
    assert "sha256sum-arm64.txt" in text and "sha256sum -c" in text
    assert text.index("sha256sum -c") < text.index("place \"$scratch\"/k3s-arm64 0755 /usr/local/bin/k3s")


def test_airgap_folder_is_checked_against_its_checksums(tmp_path):
    (tmp_path / "k3s").write_bytes(b"binary")
    good = hashlib.sha256(b"binary").hexdigest()
    (tmp_path / "sha256sum-amd64.txt").write_text(f"{good}  k3s\n")
    inv = parse_inventory(f"cluster: t\nk3s: {{airgap: {tmp_path}}}\nnodes: [{{name: a, address: 10.0.0.1, role: server}}]\n")
    assert airgap_artifacts(inv, "amd64").binary.sha256 == good
    (tmp_path / "sha256sum-amd64.txt").write_text(f"{'0' * 64}  k3s\n")
    with pytest.raises(UsageError, match="does not match"):
        airgap_artifacts(inv, "amd64")
    with pytest.raises(UsageError, match="no k3s-arm64"):
        airgap_artifacts(inv, "arm64")


def test_teardown_undoes_what_the_manifest_records():
    manifest = {"files": [CONFIG, SYSCTL_FILE, MANIFEST], "sysctl_before": {"net.ipv4.ip_forward": "0"},
                "swap_disabled": True, "packages_installed": ["nvidia-container-toolkit", "nvidia-driver-580-server-open"],
                "packages_held": ["nvidia-container-toolkit", "nvidia-driver-580-server-open", "libnvidia-compute-580"]}
    keep = teardown_script(manifest, purge_drivers=False, toolkit_source="deb [trusted=yes] http://10.200.0.1:8000/ ./")
    assert "sysctl -q -w net.ipv4.ip_forward=0" in keep
    assert "swapon -a" in keep and "bootstrap-swapoff" in keep
    assert "apt-get purge -y -q nvidia-container-toolkit >" in keep  # the driver stays
    assert "apt-mark unhold nvidia-container-toolkit libnvidia-compute-580 >" in keep
    assert packages.HELD_ON_HOST not in keep  # the driver stays, and with it the holds its install placed
    assert "rm -f /var/lib/apt/lists/10.200.0.1:8000_._*" in keep
    assert "nvidia-driver-580-server-open" in keep.split("printf")[1]  # still recorded as ours
    purge = teardown_script(manifest, purge_drivers=True)
    assert "apt-get purge -y -q nvidia-container-toolkit nvidia-driver-580-server-open" in purge
    assert "rm -rf /var/lib/bootstrap" in purge
    # every hold is lifted before the purge: the recorded ones and those the installs recorded on the host
    assert purge.index("apt-mark unhold nvidia-container-toolkit nvidia-driver-580-server-open") < purge.index("apt-get purge")
    assert purge.index(packages.HELD_ON_HOST) < purge.index("apt-get purge")
    bare = teardown_script({}, purge_drivers=False)
    assert "apt-get" not in bare and "swapon" not in bare
    assert "for d in /etc/rancher/k3s /etc/rancher/node" in bare and "$t-save | grep -viE" in bare


def test_apt_list_names():
    assert apt_lists_prefix("deb [trusted=yes] http://10.200.0.1:8000/ ./") == "10.200.0.1:8000_."
    assert apt_lists_prefix("deb [signed-by=/k.asc] https://nvidia.github.io/libnvidia-container/stable/deb/amd64 /") \
        == "nvidia.github.io_libnvidia-container_stable_deb_amd64"
