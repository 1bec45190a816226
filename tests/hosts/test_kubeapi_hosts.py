"""The stand-in Kubernetes API on two test hosts under systemd, reached through an SSH
local port forward as the tool reaches it (its fast tests: tests/standin_tests/test_kubeapi.py)."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from standins import airgap
from standin_tests.test_kubeapi import TOKEN, TS4, VERSION, Cluster, free_port, wait


UNIT = """\
[Unit]
Description=Lightweight Kubernetes (k3s stand-in)
After=network-online.target

[Service]
Type=notify
KillMode=process
Restart=always
RestartSec=5s
ExecStart=/usr/local/bin/k3s {command}
"""


@pytest.mark.hosts
def test_api_through_an_ssh_tunnel_on_two_test_hosts(lab, tmp_path):
    if airgap.upstream_missing():
        pytest.skip(airgap.upstream_missing())
    folder = airgap.build_airgap(tmp_path / "airgap", VERSION)
    files = {"/usr/local/bin/k3s": (folder / "k3s", 0o755),
             "/etc/systemd/system/k3s.service": (UNIT.format(command="server"), 0o644),
             "/etc/systemd/system/k3s-agent.service": (UNIT.format(command="agent"), 0o644)}
    t0 = time.monotonic()
    server, gpu = lab.start(["ka-server", "ka-gpu"], gpu=["ka-gpu"], extra_files=files)
    server.ssh("mkdir -p /etc/rancher/k3s && cat > /etc/rancher/k3s/config.yaml", user="root",
               input=yaml.safe_dump({"token": TOKEN, "cluster-init": True}))
    server.ssh("systemctl daemon-reload && systemctl start k3s", user="root", timeout=60)
    gpu.ssh("mkdir -p /etc/rancher/k3s && cat > /etc/rancher/k3s/config.yaml", user="root", input=yaml.safe_dump(
        {"server": f"https://{server.address}:6443", "token": TOKEN}))
    gpu.ssh("systemctl daemon-reload && systemctl start k3s-agent", user="root", timeout=60)
    kubeconfig = yaml.safe_load(server.ssh("cat /etc/rancher/k3s/k3s.yaml", user="root").stdout)
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"

    # the tool's path: an SSH local forward to the server's 127.0.0.1:6443, same kubeconfig otherwise
    port = free_port()
    tunnel = subprocess.Popen(server.ssh_command("root")[:-1] + ["-N", "-o", "ExitOnForwardFailure=yes", "-L",
                                                                 f"127.0.0.1:{port}:127.0.0.1:6443",
                                                                 server.ssh_command("root")[-1]],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"  # 127.0.0.1 is a SAN
        local = tmp_path / "kubeconfig"
        local.write_text(yaml.safe_dump(kubeconfig))
        local.chmod(0o600)
        c = Cluster(None, tmp_path)
        c.port, c.kubeconfig = port, local
        wait("the tunnel", lambda: c._ping(), 20)
        c.connect(local)
        c.wait_ready("ka-server", "ka-gpu", timeout=30)
        node = c.node("ka-gpu")
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"  # from the nvidia-smi stand-in
        assert {(a.type, a.address) for a in node.status.addresses} >= {("InternalIP", gpu.address)}
        c.core.create_namespace({"metadata": {"name": "gpu-operator"}})
        c.core.create_namespaced_config_map("gpu-operator", {"metadata": {"name": "bootstrap-device-plugin-config"},
                                                             "data": {"ts-4": TS4}})
        c.core.patch_node("ka-gpu", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-4"}}})
        wait("4 GPU slices", lambda: c.node("ka-gpu").status.allocatable.get("nvidia.com/gpu") == "4")
        # the agent's heartbeats keep it Ready; stopping its k3s turns it Unknown (20 s grace)
        gpu.ssh("systemctl stop k3s-agent", user="root")
        t1 = time.monotonic()
        wait("ka-gpu Unknown", lambda: c.ready("ka-gpu") == "Unknown", 40, 0.5)
        assert 15 < time.monotonic() - t1 < 35
        print(f"\nhosts and API up, then NotReady detection: {time.monotonic() - t0:.1f}s")
    finally:
        tunnel.terminate()
        tunnel.wait(10)
