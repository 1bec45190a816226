"""`bootstrap facts` over real SSH against booted test hosts."""

import json

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts


def facts_json(inventory):
    result = run_bootstrap("facts", inventory, "--json")
    return result, json.loads(result.stdout) if result.stdout.strip() else {}


def test_three_hosts_report_facts_and_one_is_an_h200(lab, tmp_path):
    hosts = lab.start(["ft-cp", "ft-gpu", "ft-cpu"], gpu=["ft-gpu"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    result, data = facts_json(inventory)
    assert result.returncode == 0, result.stderr
    assert set(data["hosts"]) == {"ft-cp", "ft-gpu", "ft-cpu"} and data["failed"] == {}
    for name, facts in data["hosts"].items():
        assert facts["hostname"] == name  # each host its own machine
        assert facts["os_id"] == "debian" and facts["os_version_id"] == "12"
        assert facts["has_systemd"] is True and facts["sudo_ok"] is True
        assert facts["cpus"] >= 1 and facts["memory_mib"] > 0
    gpu = data["hosts"]["ft-gpu"]
    assert gpu["has_gpu"] and len(gpu["gpus"]) == 1
    assert gpu["gpus"][0]["name"] == "NVIDIA H200" and gpu["gpus"][0]["memory_mib"] == 143771
    assert gpu["driver_version"] == "580.159.04" and gpu["cuda_version"] == "13.0"
    assert gpu["gpus"][0]["mig_current"] is False
    assert {p["name"]: p["instances_total"] for p in gpu["mig_profiles"]}["1g.18gb"] == 7
    assert data["hosts"]["ft-cpu"]["has_gpu"] is False and data["hosts"]["ft-cpu"]["gpu_error"] is None

    table = run_bootstrap("facts", inventory)
    assert table.returncode == 0
    assert "1 x NVIDIA H200 (143771 MiB); driver 580.159.04, CUDA 13.0" in table.stdout
    assert "1g.18gb x7" in table.stdout and "7g.141gb x1" in table.stdout
    # Host keys were pinned on first contact, in the cluster's state folder, owner-only.
    known_hosts = tmp_path / "state" / "known_hosts"
    assert len(known_hosts.read_text().splitlines()) >= 3
    assert oct(known_hosts.stat().st_mode & 0o777) == "0o600"


def test_host_with_sshd_stopped_fails_alone(lab, tmp_path):
    hosts = lab.start(["ft-ok1", "ft-down", "ft-ok2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    lab["ft-down"].stop_sshd()
    result, data = facts_json(inventory)
    assert result.returncode == 1
    assert set(data["hosts"]) == {"ft-ok1", "ft-ok2"}
    assert list(data["failed"]) == ["ft-down"]
    failed_lines = [l for l in result.stderr.splitlines() if l.startswith("FAILED")]
    assert len(failed_lines) == 1 and "ft-down" in failed_lines[0]
    assert f"{lab['ft-down'].address}:22" in failed_lines[0]
    assert "Traceback" not in result.stderr


def test_changed_host_key_is_refused_until_forgotten(lab, tmp_path):
    hosts = lab.start(["ft-key1", "ft-key2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    first, _ = facts_json(inventory)
    assert first.returncode == 0, first.stderr
    lab["ft-key2"].regenerate_host_key()  # the machine was "replaced"

    refused, data = facts_json(inventory)
    assert refused.returncode == 1
    assert set(data["hosts"]) == {"ft-key1"}
    assert "host key" in refused.stderr and "changed" in refused.stderr
    assert f"bootstrap forget-host {inventory} ft-key2" in refused.stderr

    forget = run_bootstrap("forget-host", inventory, "ft-key2")
    assert forget.returncode == 0 and "forgot" in forget.stdout
    again, data = facts_json(inventory)
    assert again.returncode == 0, again.stderr
    assert set(data["hosts"]) == {"ft-key1", "ft-key2"}


def test_broken_driver_is_a_clean_gpu_error(lab, tmp_path):
    hosts = lab.start(["ft-broken"], gpu=["ft-broken"],
                      extra_files={"/etc/bootstrap-standin/nvsmi-broken": b""})
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    result, data = facts_json(inventory)
    assert result.returncode == 0, result.stderr
    facts = data["hosts"]["ft-broken"]
    assert facts["gpus"] == [] and "couldn't communicate with the NVIDIA driver" in facts["gpu_error"]


def test_sudo_that_wants_a_password_is_one_clear_line(lab, tmp_path):
    hosts = lab.start(["ft-sudo", "ft-fine"])
    lab["ft-sudo"].ssh("echo 'ubuntu ALL=(ALL) ALL' > /etc/sudoers.d/90-bootstrap-lab", user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", hosts)
    result, data = facts_json(inventory)
    assert result.returncode == 0, result.stderr  # facts need no root
    assert data["hosts"]["ft-sudo"]["sudo_ok"] is False and data["hosts"]["ft-fine"]["sudo_ok"] is True
    up = run_bootstrap("up", inventory)
    assert up.returncode == 1 and "no host was changed" in up.stderr
    sudo_lines = [l for l in up.stdout.splitlines() if "sudo" in l and l.startswith("FAIL")]
    assert len(sudo_lines) == 1 and "ft-sudo" in sudo_lines[0] and "password" in sudo_lines[0]
