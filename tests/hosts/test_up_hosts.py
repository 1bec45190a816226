"""`bootstrap up` and `down`, host side, over real SSH against booted test hosts.

k3s is the stand-in from tests/standins, supplied through `k3s.airgap` as an air-gapped
user supplies the real binary.
"""

import json
import re
import threading
import time

import pytest
from clirun import run_bootstrap, run_bootstrap_on_terminal
from labinv import write_inventory

pytestmark = pytest.mark.hosts


def up(inventory, *extra):
    # Host side only: the cluster side has its own tests (test_cluster_hosts.py).
    return run_bootstrap("up", inventory, "--hosts-only", *extra)


def standin_nodes(server):
    return {n["name"]: n for n in json.loads(server.ssh(
        "curl -s --cacert /var/lib/rancher/k3s/server/tls/server-ca.crt https://localhost:6443/v1-standin/nodes",
        user="root").stdout)["nodes"]}


def test_one_server_two_agents_up_is_idempotent_and_keeps_the_token_secret(lab, tmp_path, airgap):
    hosts = lab.start(["up-cp", "up-a1", "up-a2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = up(inventory)
    assert first.returncode == 0, first.stdout + first.stderr
    cp, a1, a2 = hosts
    assert cp.ssh("systemctl is-active k3s").stdout.strip() == "active"
    for agent in (a1, a2):
        assert agent.ssh("systemctl is-active k3s-agent").stdout.strip() == "active"
        config = agent.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
        assert f"server: https://{cp.address}:6443" in config
        assert agent.ssh("sudo stat -c %a /etc/rancher/k3s/config.yaml").stdout.strip() == "600"
    assert set(standin_nodes(cp)) == {"up-cp", "up-a1", "up-a2"}  # joined with the right token

    state = tmp_path / "state"
    token = (state / "token").read_text().strip()
    assert oct((state / "token").stat().st_mode & 0o777) == "0o600"
    assert oct((state / "kubeconfig").stat().st_mode & 0o777) == "0o600"
    assert f"https://{cp.address}:6443" in (state / "kubeconfig").read_text()
    second = up(inventory)
    assert second.returncode == 0, second.stderr
    assert "hosts: no change, 3 hosts already converged" in second.stdout
    # The token is in no output and no run log.
    outputs = first.stdout + first.stderr + second.stdout + second.stderr
    logs = "".join(p.read_text() for p in (state / "logs").glob("*.log"))
    assert token not in outputs and token not in logs
    assert token in cp.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
    for host in hosts:  # nor in any host's journal
        assert token not in host.ssh("sudo journalctl --no-pager -q", check=False).stdout


def test_drift_is_repaired_and_only_that_host_restarts(lab, tmp_path, airgap):
    hosts = lab.start(["dr-cp", "dr-a1", "dr-a2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    assert up(inventory).returncode == 0
    cp, a1, a2 = hosts
    pid = lambda h, unit: h.ssh(f"systemctl show -p MainPID --value {unit}").stdout.strip()
    before = {h.name: pid(h, "k3s" if h is cp else "k3s-agent") for h in hosts}
    a1.ssh("echo 'node-label: [drift=1]' | sudo tee -a /etc/rancher/k3s/config.yaml >/dev/null")
    a2.ssh("sudo systemctl stop k3s-agent")
    plan = run_bootstrap("plan", inventory)
    assert plan.returncode == 0
    assert "dr-cp: no change" in plan.stdout
    assert re.search(r"dr-a1:\n  - update /etc/rancher/k3s/config.yaml\n  - restart k3s-agent", plan.stdout)
    assert "start k3s-agent" in plan.stdout.split("dr-a2:")[1]
    # On a terminal: one row per host, redrawn in place, each finished step with its time.
    again = run_bootstrap_on_terminal("up", inventory, "--hosts-only")
    assert again.returncode == 0, again.stderr
    assert "\033[2F" in again.stdout  # the rows of the two hosts with work were redrawn in place
    final_rows = re.sub(r"\033\[[0-9;]*[A-Za-z]", "", again.stdout.split("\033[2F")[-1]).splitlines()
    assert re.match(r"dr-a1 +✓ prepare host \d+\.\ds  ✓ join agents \d+\.\ds", final_rows[0]), final_rows
    assert re.match(r"dr-a2 +✓ join agents \d+\.\ds$", final_rows[1]), final_rows
    assert not any(row.startswith("dr-cp ") for row in final_rows)  # nothing to do: no row
    assert "dr-cp: no change" in again.stdout and "dr-a1: changed" in again.stdout
    assert "drift" not in a1.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
    assert a2.ssh("systemctl is-active k3s-agent").stdout.strip() == "active"
    assert pid(cp, "k3s") == before["dr-cp"]  # the untouched server was not restarted
    assert pid(a1, "k3s-agent") != before["dr-a1"]


def test_three_servers_first_inits_etcd_others_join(lab, tmp_path, airgap):
    hosts = lab.start(["ha-cp1", "ha-cp2", "ha-cp3", "ha-a1"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, servers=3, extra={"k3s": {"airgap": str(airgap)}})
    result = up(inventory)
    assert result.returncode == 0, result.stdout + result.stderr
    cp1, cp2, cp3, agent = hosts
    configs = {h.name: h.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout for h in hosts}
    assert "cluster-init: true" in configs["ha-cp1"] and "server:" not in configs["ha-cp1"]
    for name in ("ha-cp2", "ha-cp3", "ha-a1"):
        assert f"server: https://{cp1.address}:6443" in configs[name] and "cluster-init" not in configs[name]
    nodes = standin_nodes(cp1)
    assert {n for n, v in nodes.items() if v["etcd"]} == {"ha-cp1", "ha-cp2", "ha-cp3"}
    # The servers joined one at a time, in inventory order, before the agent.
    order = [line.split()[-2] for line in result.stdout.splitlines() if line.startswith("✓") and "server" in line]
    assert order == ["ha-cp1", "ha-cp2", "ha-cp3"]


def test_preflight_refusals_change_no_host(lab, tmp_path, airgap):
    hosts = lab.start(["pf-cp", "pf-gpu"], gpu=["pf-gpu"])
    # Two inventories, two clusters: each its own state folder.
    (tmp_path / "mig").mkdir()
    (tmp_path / "cuda").mkdir()
    mig = write_inventory(tmp_path / "mig" / "inv.yaml", hosts, cluster="mig", extra={
        "k3s": {"airgap": str(airgap)}, "gpu": {"sharing": {"mig": {"layout": "all-1g.10gb"}}}})
    cuda = write_inventory(tmp_path / "cuda" / "inv.yaml", hosts, cluster="cuda",
                           extra={"k3s": {"airgap": str(airgap)}, "gpu": {"cuda": "13.1"}})
    for inventory, words in ((mig, "no 1g.10gb profile"), (cuda, "590.44.01")):
        result = up(inventory)
        assert result.returncode == 1
        assert words in result.stdout and "no host was changed" in result.stderr
    for host in hosts:
        assert host.created_files() == set(), host.created_files()


def test_agent_killed_mid_up_fails_alone_and_rerun_converges(lab, tmp_path, airgap):
    hosts = lab.start(["kl-cp", "kl-a1", "kl-a2"])
    cp, a1, victim = hosts
    # Make the victim's join slow, so that it is killed while `up` runs on it.
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    victim.ssh("sudo mkdir -p /etc/systemd/system/k3s-agent.service.d && printf '[Service]\\n"
               "ExecStartPre=/bin/sleep 20\\n' | sudo tee /etc/systemd/system/k3s-agent.service.d/slow.conf")

    def kill_when_joining():
        for _ in range(600):
            if victim.ssh("systemctl is-active k3s-agent", check=False).stdout.strip() == "activating":
                victim.kill()
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_joining)
    killer.start()
    result = up(inventory)
    killer.join()
    assert result.returncode == 1
    failed = [l for l in result.stderr.splitlines() if l.startswith("FAILED")]
    assert len(failed) == 1 and "kl-a2" in failed[0], result.stderr
    assert set(standin_nodes(cp)) == {"kl-cp", "kl-a1"}
    victim.restart()
    victim.ssh("sudo rm -rf /etc/systemd/system/k3s-agent.service.d && sudo systemctl daemon-reload")
    assert re.search(r"^✗ kl-a2 .*\d\.\ds: .+", result.stdout, re.M), result.stdout  # the reason, at once
    again = up(inventory, "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    events = [json.loads(line) for line in again.stdout.splitlines()]  # every stdout line is an event
    assert events[-1] == {"event": "exit", "code": 0, "time": events[-1]["time"]}
    (hosts_event,) = [e for e in events if e["event"] == "hosts"]
    # The healthy hosts are untouched (the victim may already have rejoined on boot: its unit is enabled).
    assert {"kl-cp", "kl-a1"} <= set(hosts_event["no_change"]), hosts_event
    assert set(standin_nodes(cp)) == {"kl-cp", "kl-a1", "kl-a2"}


# What a booted host writes by itself, and what apt/dpkg keep after a purge.
ALLOWED_AFTER_DOWN = re.compile(r"^(etc/ld\.so\.cache|var/lib/dpkg(/|$)|var/cache/(apt|debconf)(/|$)|"
                                r"var/log/(apt|dpkg\.log|alternatives\.log)|var/lib/apt(/|$)|etc/systemd/system$|"
                                r"var/lib$|etc$|var$|var/log$|var/cache$|etc/rancher$|usr/local/bin$|usr/local$|usr$)")


def pod_processes(host) -> list[str]:
    """The stand-in shim's pod (pause, workload, the workload's worker): not k3s's processes."""
    listing = host.ssh("ps -e -o pid= -o args=", check=False).stdout.splitlines()
    return [line.split(None, 1)[1] for line in listing if " standin-pod-" in f" {line.strip()}"]


def k3s_mounts(host) -> list[str]:
    mounts = host.ssh("cat /proc/self/mounts", check=False).stdout.splitlines()
    return [m.split()[1] for m in mounts if m.split()[1].startswith(("/var/lib/kubelet/", "/run/k3s/"))]


def test_up_then_down_leaves_nothing_behind(lab, tmp_path, airgap):
    hosts = lab.start(["dn-cp", "dn-a1"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    assert up(inventory).returncode == 0
    for host in hosts:  # a pod runs under each node's containerd shim, its emptyDir mounted
        assert len(pod_processes(host)) == 3, pod_processes(host)
        assert any("/volumes/kubernetes.io~empty-dir/" in m for m in k3s_mounts(host)), k3s_mounts(host)
    refused = run_bootstrap("down", inventory)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    down = run_bootstrap("down", inventory, "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    for host in hosts:
        # the pods went with their shim's process tree, before their mounts and folders
        assert pod_processes(host) == [] and k3s_mounts(host) == [], (pod_processes(host), k3s_mounts(host))
        left = {f for f in host.created_files() if not ALLOWED_AFTER_DOWN.match(f)}
        assert left == set(), f"{host.name} still holds {sorted(left)}"
        assert host.ssh("ip -o link show", check=False).stdout.count("flannel") == 0
        assert "FLANNEL" not in host.ssh("sudo iptables-save -t nat", check=False).stdout
        assert host.ssh("systemctl is-active k3s k3s-agent", check=False).stdout.split() == ["inactive", "inactive"]
    assert not (tmp_path / "state" / "token").exists()


def test_gpu_node_gets_the_container_toolkit_and_k3s_detects_the_nvidia_runtime(lab, tmp_path, airgap):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    hosts = lab.start(["gp-cp", "gp-gpu"], gpu=["gp-gpu"])
    cp, gpu = hosts
    deb = build_toolkit_deb(tmp_path / "debs")
    with AptRepo([deb]) as repo:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
            "k3s": {"airgap": str(airgap)},
            "gpu": {"driver": "preinstalled", "cuda": "12.4", "container_toolkit": {"apt_source": repo.source_line}}})
        result = up(inventory)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 x NVIDIA H200" in result.stdout and "driver 580.159.04, CUDA 13.0" in result.stdout
        assert repo.fetched(deb.name)
        assert gpu.ssh("dpkg -l nvidia-container-toolkit | tail -1").stdout.startswith("hi")  # held, installed
        assert "nvidia-container-toolkit" in gpu.ssh("apt-mark showhold").stdout
        config = gpu.ssh("sudo cat /var/lib/rancher/k3s/agent/etc/containerd/config.toml").stdout
        assert "'nvidia'" in config or '"nvidia"' in config
        assert "nvidia" not in cp.ssh("sudo cat /var/lib/rancher/k3s/agent/etc/containerd/config.toml").stdout
        again = up(inventory)
        assert again.returncode == 0 and "hosts: no change, 2 hosts already converged" in again.stdout, again.stdout
        down = run_bootstrap("down", inventory, "--yes")
        assert down.returncode == 0, down.stdout + down.stderr
    assert gpu.ssh("dpkg -l nvidia-container-toolkit 2>/dev/null | grep -c '^.i'", check=False).stdout.strip() in ("", "0")
    for host in hosts:
        left = {f for f in host.created_files() if not ALLOWED_AFTER_DOWN.match(f)}
        assert left == set(), f"{host.name} still holds {sorted(left)}"


def test_kubeconfig_merge_and_api_tunnel(lab, tmp_path, airgap):
    import urllib.request

    import yaml

    from bootstrap.remote.tunnel import Tunnel
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    (cp,) = lab.start(["kc-cp"])
    inventory = write_inventory(tmp_path / "inv.yaml", [cp], cluster="kc", extra={"k3s": {"airgap": str(airgap)}})
    assert up(inventory).returncode == 0
    target = tmp_path / "kube" / "config"
    target.parent.mkdir()
    target.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "other",
                                      "clusters": [{"name": "other", "cluster": {"server": "https://x:6443"}}],
                                      "contexts": [{"name": "other", "context": {"cluster": "other", "user": "o"}}],
                                      "users": [{"name": "o", "user": {}}]}))
    merged = run_bootstrap("kubeconfig", inventory, "--merge", env={"KUBECONFIG": str(target)})
    assert merged.returncode == 0, merged.stderr
    config = yaml.safe_load(target.read_text())
    assert {c["name"] for c in config["contexts"]} == {"other", "bootstrap-kc"}
    assert config["current-context"] == "other"  # the user's choice is kept
    ours = next(c for c in config["clusters"] if c["name"] == "bootstrap-kc")
    assert ours["cluster"]["server"].endswith(f"://{cp.address}:6443")
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    again = run_bootstrap("kubeconfig", inventory, "--merge", env={"KUBECONFIG": str(target)})
    assert again.returncode == 0 and len(yaml.safe_load(target.read_text())["contexts"]) == 2  # replaced, not added
    # The API port reached through SSH only: the tunnel's local end answers like the server.
    inv = load_inventory(inventory)
    # TLS through it verifies against the cluster CA as 127.0.0.1 (a SAN of k3s's certificate).
    import base64
    import ssl

    ca = base64.b64decode(ours["cluster"]["certificate-authority-data"]).decode()
    with Tunnel(inv, inv.servers[0], StateDir(inv)) as port:
        assert urllib.request.urlopen(f"https://127.0.0.1:{port}/ping", timeout=10,
                                      context=ssl.create_default_context(cadata=ca)).read() == b"pong"
