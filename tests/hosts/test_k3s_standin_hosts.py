"""The k3s stand-in installed on two test hosts by hand and run under systemd with a
Type=notify unit like the installer's (its fast tests: tests/standin_tests/test_k3s_standin.py)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from standins import airgap
from standin_tests.test_k3s_standin import K10, PASSWORD, VERSION


UNIT = """\
[Unit]
Description=Lightweight Kubernetes (k3s stand-in, test unit like the installer's)
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
EnvironmentFile=-/etc/systemd/system/%N.service.env
KillMode=process
Delegate=yes
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStart=/usr/local/bin/k3s {command}

[Install]
WantedBy=multi-user.target
"""


def listeners(host, port: int) -> str:
    return host.ssh(f"ss -Hltnp 'sport = :{port}'", user="root").stdout


@pytest.mark.hosts
def test_standin_under_systemd_on_two_hosts(lab, tmp_path):
    if airgap.upstream_missing():
        pytest.skip(airgap.upstream_missing())
    folder = airgap.build_airgap(tmp_path / "airgap", VERSION)
    files = {
        "/usr/local/bin/k3s": (folder / "k3s", 0o755),
        "/var/lib/rancher/k3s/agent/images/k3s-airgap-images-amd64.tar.zst": (folder / "k3s-airgap-images-amd64.tar.zst", 0o644),
        "/etc/systemd/system/k3s.service": (UNIT.format(command="server"), 0o644),
        "/etc/systemd/system/k3s-agent.service": (UNIT.format(command="agent"), 0o644),
    }
    t0 = time.monotonic()
    server, agent = lab.start(["ks-server", "ks-agent"], extra_files=files)
    boot = time.monotonic() - t0

    # --- server
    server.ssh("mkdir -p /etc/rancher/k3s && cat > /etc/rancher/k3s/config.yaml", user="root", input=yaml.safe_dump(
        {"token": PASSWORD, "cluster-init": True, "node-label": ["role=cp"], "disable": ["traefik"]},
        default_flow_style=False))
    server.ssh("systemctl daemon-reload && systemctl start k3s", user="root", timeout=60)
    assert server.ssh("systemctl is-active k3s", user="root").stdout.strip() == "active"
    mode, token = server.ssh("stat -c %a /var/lib/rancher/k3s/server/token && cat /var/lib/rancher/k3s/server/token",
                             user="root").stdout.split()
    assert mode == "600" and K10.match(token) and K10.match(token).group(2) == PASSWORD
    kubeconfig = server.ssh("stat -c %a /etc/rancher/k3s/k3s.yaml && cat /etc/rancher/k3s/k3s.yaml", user="root").stdout
    assert kubeconfig.startswith("600\n") and "server: https://127.0.0.1:6443" in kubeconfig
    assert "certificate-authority-data:" in kubeconfig and "client-certificate-data:" in kubeconfig
    assert '"k3s-server"' in listeners(server, 6443) and '"k3s-server"' in listeners(server, 10250)
    # reachable from the other host over the lab network, over TLS that verifies with the
    # cluster CA as the server's address (a SAN of its certificate, as in k3s's)
    ca = server.ssh("cat /var/lib/rancher/k3s/server/tls/server-ca.crt", user="root").stdout
    agent.ssh("cat > /tmp/server-ca.crt", input=ca)
    curl = "curl -sS --max-time 5 --cacert /tmp/server-ca.crt"
    assert agent.ssh(f"{curl} https://{server.address}:6443/ping").stdout == "pong"

    # --- agent with the full token
    agent.ssh("mkdir -p /etc/rancher/k3s && cat > /etc/rancher/k3s/config.yaml", user="root", input=yaml.safe_dump(
        {"server": f"https://{server.address}:6443", "token": token, "node-label": ["nvidia.com/gpu.present=true"]},
        default_flow_style=False))
    agent.ssh("systemctl daemon-reload && systemctl start k3s-agent", user="root", timeout=60)
    assert agent.ssh("systemctl is-active k3s-agent", user="root").stdout.strip() == "active"
    nodes = json.loads(agent.ssh(f"{curl} https://{server.address}:6443/v1-standin/nodes").stdout)
    by_name = {n["name"]: n for n in nodes["nodes"]}
    assert by_name["ks-agent"]["role"] == "agent" and by_name["ks-agent"]["address"] == agent.address
    assert by_name["ks-agent"]["labels"] == ["nvidia.com/gpu.present=true"]
    assert by_name["ks-server"]["role"] == "server"
    assert '"k3s-agent"' in listeners(agent, 10250)
    agent_log = agent.ssh("journalctl -u k3s-agent --no-pager -o cat", user="root").stdout
    assert agent.ssh("test -f /var/lib/rancher/k3s/agent/etc/containerd/config.toml", user="root", check=False).returncode == 0
    if "Could not create network link" not in agent_log:  # best effort where the kernel lacks vxlan/dummy
        assert agent.ssh("ip -o link show flannel.1 && ip -o link show cni0", user="root", check=False).returncode == 0
    assert "Imported images from /var/lib/rancher/k3s/agent/images/k3s-airgap-images-amd64.tar.zst" in agent_log
    # like real k3s under KillMode=process, the shim outlives `systemctl stop`
    agent.ssh("systemctl stop k3s-agent", user="root")
    assert agent.ssh("pgrep -f 'k3s/data/[^/]*/bin/containerd-shim'", user="root", check=False).returncode == 0

    # --- an agent with a wrong token does not start
    agent.ssh("mkdir -p /etc/rancher/k3s/config.yaml.d && echo 'token: not-the-token' "
              "> /etc/rancher/k3s/config.yaml.d/99-wrong.yaml", user="root")
    failed = agent.ssh("systemctl start k3s-agent", user="root", check=False, timeout=60)
    time.sleep(1)
    state = agent.ssh("systemctl is-active k3s-agent", user="root", check=False).stdout.strip()
    assert failed.returncode != 0 and state != "active", (failed.returncode, state)
    agent_log = agent.ssh("journalctl -u k3s-agent --no-pager -o cat", user="root").stdout
    assert "401 Unauthorized" in agent_log

    # --- a config key that is not a k3s flag is refused, by name
    server.ssh("systemctl stop k3s && mkdir -p /etc/rancher/k3s/config.yaml.d && "
               "echo 'not-a-flag: 1' > /etc/rancher/k3s/config.yaml.d/90-bad.yaml", user="root")
    failed = server.ssh("systemctl start k3s", user="root", check=False, timeout=60)
    assert failed.returncode != 0
    server_log = server.ssh("journalctl -u k3s --no-pager -o cat", user="root").stdout
    assert "flag provided but not defined: -not-a-flag (in /etc/rancher/k3s/config.yaml.d/90-bad.yaml)" in server_log
    assert PASSWORD not in server_log + agent_log
    print(f"\nboot {boot:.1f}s, total {time.monotonic() - t0:.1f}s")
