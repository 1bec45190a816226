"""The README's user path with the real clients: `bootstrap up` installs the components with
the real Helm (lab charts from archives, tests/labcharts.py), then `bootstrap kubeconfig
--merge` and the real kubectl and Helm work through the merged context, TLS verified
against the cluster CA (the API port direct, and through the tool's SSH tunnel as
127.0.0.1), as a user's would."""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess

import pytest
import yaml
from clirun import BOOTSTRAP, run_bootstrap
from labcharts import helm, lab_charts, user_manifest
from labinv import write_inventory

pytestmark = [pytest.mark.hosts,
              pytest.mark.skipif(shutil.which("kubectl") is None or shutil.which("helm") is None,
                                 reason="the real kubectl and helm must be on PATH (.ci/run installs them)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(argv, kubeconfig, home):
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(KUBECONFIG=str(kubeconfig), HOME=str(home))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_up_with_real_helm_then_kubeconfig_merge_kubectl_and_helm(lab, tmp_path, airgap):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    from bootstrap.remote.tunnel import Tunnel
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    hosts = lab.start(["kx-cp", "kx-g1"], gpu=["kx-g1"])
    repo = AptRepo([build_toolkit_deb(tmp_path / "debs")])
    try:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, cluster="kx", extra={
            "k3s": {"airgap": str(airgap)},
            "gpu": {"container_toolkit": {"apt_source": repo.source_line}},
            "charts": lab_charts(tmp_path / "charts"),
            "validate": {"timeout_s": 60}})
        first = run_bootstrap("up", inventory, env={"BOOTSTRAP_HELM": helm()}, timeout=900)
    finally:
        repo.close()
    assert first.returncode == 0, first.stdout + first.stderr

    home = tmp_path / "home"
    kube = home / ".kube" / "config"
    kube.parent.mkdir(parents=True)
    kube.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "mine",
                                    "clusters": [{"name": "mine", "cluster": {"server": "https://192.0.2.1:6443"}}],
                                    "contexts": [{"name": "mine", "context": {"cluster": "mine", "user": "me"}}],
                                    "users": [{"name": "me", "user": {"token": "x"}}]}))
    merged = run_bootstrap("kubeconfig", inventory, "--merge", env={"KUBECONFIG": str(kube)})
    assert merged.returncode == 0, merged.stderr
    config = yaml.safe_load(kube.read_text())
    ours = next(c["cluster"] for c in config["clusters"] if c["name"] == "bootstrap-kx")
    assert ours["server"] == f"https://{hosts[0].address}:6443" and "insecure-skip-tls-verify" not in ours
    assert config["current-context"] == "mine"

    # kubectl through the merged context: the API port direct, verified as the server's address
    nodes = client(["kubectl", "--context", "bootstrap-kx", "get", "nodes"], kube, home).splitlines()
    assert nodes[0].split()[:3] == ["NAME", "STATUS", "ROLES"]
    assert {line.split()[0]: line.split()[1] for line in nodes[1:]} == {"kx-cp": "Ready", "kx-g1": "Ready"}
    manifest = tmp_path / "app.yaml"
    manifest.write_text(user_manifest("default"))
    applied = client(["kubectl", "--context", "bootstrap-kx", "apply", "-f", str(manifest)], kube, home)
    assert "configmap/settings created" in applied and "pod/hello created" in applied
    pods = client(["kubectl", "--context", "bootstrap-kx", "get", "pods", "-A"], kube, home).splitlines()
    assert pods[0].split()[:3] == ["NAMESPACE", "NAME", "READY"]
    assert any(line.split()[:2] == ["default", "hello"] for line in pods[1:])

    # Helm sees what `up` installed with it, through the same context
    status = json.loads(client([helm(), "--kube-context", "bootstrap-kx", "status", "gpu-operator", "-n",
                                "gpu-operator", "-o", "json"], kube, home))
    assert status["info"]["status"] == "deployed"
    (listed,) = json.loads(client([helm(), "--kube-context", "bootstrap-kx", "list", "-n", "gpu-operator", "-o",
                                   "json"], kube, home))
    assert (listed["name"], listed["chart"], listed["status"]) == ("gpu-operator", "gpu-operator-v26.7.0", "deployed")
    applied = json.loads(client([helm(), "--kube-context", "bootstrap-kx", "get", "values", "gpu-operator", "-n",
                                 "gpu-operator", "-o", "json"], kube, home))
    assert applied and "CONTAINERD_SOCKET" not in json.dumps(applied)  # the host toolkit is used

    # Through the tool's SSH tunnel: 127.0.0.1 is in the serving certificate, TLS still verifies
    inv = load_inventory(inventory)
    with Tunnel(inv, inv.servers[0], StateDir(inv)) as port:
        tunneled = client(["kubectl", "--context", "bootstrap-kx", "--server", f"https://127.0.0.1:{port}",
                           "get", "nodes", "-o", "name"], kube, home)
        assert sorted(tunneled.split()) == ["node/kx-cp", "node/kx-g1"]
    # `bootstrap kubeconfig --tunnel`: the tunnel held open for kubectl until the user ends it
    tunnel_port = free_port()
    holder = subprocess.Popen([str(BOOTSTRAP), "kubeconfig", str(inventory), "--tunnel", "--port", str(tunnel_port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = [holder.stdout.readline() for _ in range(2)]  # the kubeconfig line, then the tunnel's
        assert said[1].startswith(f"tunnel open: 127.0.0.1:{tunnel_port} -> kx-cp:6443"), said
        tunneled_config = StateDir(inv).path / "kubeconfig-tunnel"
        assert oct(tunneled_config.stat().st_mode & 0o777) == "0o600"
        listed = client(["kubectl", "get", "nodes", "-o", "name"], tunneled_config, home)
        assert sorted(listed.split()) == ["node/kx-cp", "node/kx-g1"]
    finally:
        holder.send_signal(signal.SIGINT)
        out, err = holder.communicate(timeout=30)
    assert holder.returncode == 0 and "tunnel closed" in out, out + err
    # and a CA that is not the cluster's is refused: verification is on
    ca = base64.b64decode(ours["certificate-authority-data"])
    assert b"BEGIN CERTIFICATE" in ca
    config = yaml.safe_load(kube.read_text())
    for entry in config["clusters"]:
        if entry["name"] == "bootstrap-kx":
            entry["cluster"]["certificate-authority-data"] = base64.b64encode(_other_ca(tmp_path)).decode()
    kube.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    refused = subprocess.run(["kubectl", "--context", "bootstrap-kx", "get", "nodes"], capture_output=True,
                             text=True, timeout=60, env=dict(env, KUBECONFIG=str(kube), HOME=str(home)))
    assert refused.returncode != 0 and "certificate" in refused.stderr


def _other_ca(folder) -> bytes:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-subj", "/CN=not-the-cluster-ca", "-keyout", str(folder / "other.key"), "-out",
                    str(folder / "other-ca.pem"), "-days", "1"], check=True, capture_output=True)
    return (folder / "other-ca.pem").read_bytes()
