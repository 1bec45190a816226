"""The commands a plan turns into: secrets stay off command lines, downloads are verified,
teardown undoes only what the manifest says the tool did."""

import hashlib

import pytest

from bootstrap.artifacts import airgap_artifacts, online_artifacts
from bootstrap.deploys.converge import placement_commands, wait_for_service
from bootstrap.errors import UsageError
from bootstrap.hostparts.base import text_file
from bootstrap.hostparts.k3s_binary import download as download_k3s
from bootstrap.hostparts.k3s_service import CONFIG
from bootstrap.hostparts.kernel import SYSCTL_FILE
from bootstrap.hostparts.manifest import MANIFEST
from bootstrap.hostparts.packages import apt_lists_prefix
from bootstrap.hostplan.host_plan import HostPlan
from bootstrap.inventory.loader import parse_inventory
from bootstrap.teardown import teardown_script

INV = parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n")


def test_uploads_are_staged_privately_and_installed_with_modes():
    plan = HostPlan(node=INV.nodes[0], unit="k3s",
                    uploads=[text_file(CONFIG, "token: SECRET\n", 0o600, secret=True)],
                    prepare=["systemctl daemon-reload"])
    commands = placement_commands(plan)
    upload, script = commands  # the staging dir is made in the upload's SFTP session
    stage, sources = upload.args
    assert stage.startswith("/tmp/bootstrap-stage-") and len(sources) == 1
    text = str(script)
    assert f"install -D -m 0600 -o root -g root {stage}/0 {CONFIG}" in text
    assert "rm -rf /tmp/bootstrap-stage-" in text and text.startswith("set -e")
    assert "SECRET" not in "".join(str(c) for c in commands)
    assert placement_commands(HostPlan(node=INV.nodes[0], unit="k3s")) == []


def test_the_staging_dir_goes_on_every_exit_of_the_root_script():
    plan = HostPlan(node=INV.nodes[0], unit="k3s", uploads=[text_file(CONFIG, "token: SECRET\n", 0o600, secret=True)],
                    prepare=["false"])
    script = str(placement_commands(plan)[-1])
    stage = script.split("trap 'rm -rf ", 1)[1].split("'", 1)[0]
    assert stage.startswith("/tmp/bootstrap-stage-")
    # the trap is set before anything can fail, so `set -e` leaves nothing behind
    assert script.index("trap") < script.index("install -D") < script.index("false")


def test_service_wait_fails_fast_on_a_crash():
    text = str(wait_for_service("k3s-agent", "restart", timeout=30))
    assert "u=k3s-agent" in text and "systemctl restart --no-block $u" in text and "auto-restart" in text
    assert "grep -iv token" in text  # log lines shown on failure never carry a token


def test_online_download_is_checksum_verified():
    lines = download_k3s(online_artifacts("v1.33.5+k3s1", "arm64"))
    text = "\n".join(lines)
    assert "releases/download/v1.33.5%2Bk3s1/k3s-arm64" in text
    assert "sha256sum-arm64.txt" in text and "sha256sum -c" in text
    assert text.index("sha256sum -c") < text.index("install -m 0755")


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
    assert "apt-mark unhold nvidia-container-toolkit libnvidia-compute-580" in keep
    assert "rm -f /var/lib/apt/lists/10.200.0.1:8000_._*" in keep
    assert "nvidia-driver-580-server-open" in keep.split("printf")[1]  # still recorded as ours
    purge = teardown_script(manifest, purge_drivers=True)
    assert "apt-get purge -y -q nvidia-container-toolkit nvidia-driver-580-server-open" in purge
    assert "rm -rf /var/lib/bootstrap" in purge
    bare = teardown_script({}, purge_drivers=False)
    assert "apt-get" not in bare and "swapon" not in bare
    assert "for d in /etc/rancher/k3s /etc/rancher/node" in bare and "$t-save | grep -viE" in bare


def test_apt_list_names():
    assert apt_lists_prefix("deb [trusted=yes] http://10.200.0.1:8000/ ./") == "10.200.0.1:8000_."
    assert apt_lists_prefix("deb [signed-by=/k.asc] https://nvidia.github.io/libnvidia-container/stable/deb/amd64 /") \
        == "nvidia.github.io_libnvidia-container_stable_deb_amd64"
