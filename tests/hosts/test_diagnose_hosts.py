"""`bootstrap diagnose` against booted test hosts: a cluster built with registry and S3
credentials, then a bundle whose every member is scanned for the join token, the agent
token, the registry and S3 credentials and the kubeconfig's keys (none may be there); then
the API down and a host gone: the host half is still written, and both are named."""

import base64
import re
import tarfile

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts

REGISTRY_PASSWORD = "lab-Registry-Pa55-4e1f"
S3_ACCESS = "AKIALABDIAGNOSE0001"
S3_SECRET = "lab-S3-Secret-77aa01"


def bundle_members(stdout: str) -> dict[str, bytes]:
    (path,) = re.findall(r"bundle \(secrets redacted; read it before you share it\): (\S+)", stdout)
    with tarfile.open(path) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def secrets_of(state) -> dict[str, str]:
    found = {"join token": (state / "token").read_text().strip(), "registry password": REGISTRY_PASSWORD,
             "S3 access key": S3_ACCESS, "S3 secret key": S3_SECRET}
    if (state / "agent-token").exists():
        found["agent token"] = (state / "agent-token").read_text().strip()
    config = yaml.safe_load((state / "kubeconfig").read_text())
    for user in config["users"]:
        for key in ("client-key-data", "client-certificate-data"):
            found[f"kubeconfig {key}"] = user["user"][key]
            pem = base64.b64decode(user["user"][key]).decode()
            body = [line for line in pem.splitlines() if line and not line.startswith("-----")]
            found[f"kubeconfig {key} (decoded)"] = max(body, key=len)
    return found


def test_the_bundle_holds_both_halves_and_no_secret_then_works_with_the_api_and_a_host_down(
        lab, tmp_path, airgap, monkeypatch):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    hosts = lab.start(["dg-cp", "dg-gpu"], gpu=["dg-gpu"])
    cp, gpu = hosts
    env = {"DIAG_REG_PW": REGISTRY_PASSWORD, "DIAG_S3_AK": S3_ACCESS, "DIAG_S3_SK": S3_SECRET}
    deb = build_toolkit_deb(tmp_path / "debs")
    with AptRepo([deb]) as repo:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
            "k3s": {"airgap": str(airgap), "snapshots": {"s3": {
                "bucket": "k3s-snapshots", "endpoint": "10.200.0.1:9", "access_key_env": "DIAG_S3_AK",
                "secret_key_env": "DIAG_S3_SK"}}},
            "registries": {"auth": {"registry.example.com": {"username": "bot", "password_env": "DIAG_REG_PW"}}},
            "gpu": {"driver": "preinstalled", "cuda": "12.4", "container_toolkit": {"apt_source": repo.source_line}}})
        up = run_bootstrap("up", inventory, "--no-validate", env=env, timeout=600)
        # The stand-in takes the S3 settings in config.yaml (that is what the bundle must hide) but
        # refuses S3 snapshots themselves, so `up`'s closing snapshot fails after everything else.
        assert up.returncode == 0 or "S3 snapshots are not supported by the k3s stand-in" in up.stderr, \
            up.stdout + up.stderr
        assert "release(s) applied" in up.stdout, up.stdout
    state = tmp_path / "state"
    secrets = secrets_of(state)
    # The hosts do hold them: a bundle without redaction would carry them.
    assert REGISTRY_PASSWORD in gpu.ssh("sudo cat /etc/rancher/k3s/registries.yaml").stdout
    assert S3_SECRET in cp.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout

    result = run_bootstrap("diagnose", inventory, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    members = bundle_members(result.stdout)
    names = list(members)
    assert names[0] == "diagnose/summary.txt"
    assert "hosts: 2 of 2 answered" in result.stdout and "API: answered" in result.stdout
    for host in ("dg-cp", "dg-gpu"):
        for section in ("k3s-unit.txt", "k3s-journal.txt", "config.yaml", "facts.json", "network.txt"):
            assert f"diagnose/hosts/{host}/{section}" in members
    assert b"token: <redacted" in members["diagnose/hosts/dg-gpu/config.yaml"]
    assert b"password: <redacted" in members["diagnose/hosts/dg-gpu/registries.yaml"]
    assert b"ActiveState=active" in members["diagnose/hosts/dg-cp/k3s-unit.txt"]
    assert b"NVIDIA H200" in members["diagnose/hosts/dg-gpu/nvidia-smi-q.txt"]
    assert b"dg-gpu" in members["diagnose/cluster/nodes.json"]
    assert "diagnose/cluster/helm-releases.json" in members, result.stdout
    assert "diagnose/inventory.yaml" in members
    assert any(n.startswith("diagnose/logs/") for n in names)
    for name, data in members.items():
        for what, value in secrets.items():
            assert value.encode() not in data, f"{what} in {name}"
    for what, value in secrets.items():
        assert value not in result.stdout + result.stderr, what

    # The API down (k3s stopped on the only server) and the agent's machine gone.
    cp.ssh("sudo systemctl stop k3s")
    gpu.kill()
    down = run_bootstrap("diagnose", inventory, env=env, timeout=600)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "hosts: 1 of 2 answered" in down.stdout and "host dg-gpu: did not answer" in down.stdout
    assert "API: no answer" in down.stdout
    assert "dg-cp: k3s.service is inactive/dead" in down.stdout
    later = bundle_members(down.stdout)
    assert "diagnose/hosts/dg-cp/k3s-journal.txt" in later and not any("/dg-gpu/" in n for n in later)
    assert not any(n.startswith("diagnose/cluster/") for n in later)
    for name, data in later.items():
        for what, value in secrets.items():
            assert value.encode() not in data, f"{what} in {name}"
