"""The k3s stand-in's flannel, WireGuard and external-IP behaviour, as real k3s and flannel
have it, for the tool's public network mode (nodes at different providers that reach each
other over public addresses): servers with `flannel-backend: wireguard-native` and
`flannel-external-ip: true`, every node with `node-external-ip: <public>` and `node-ip: <an
address on its own link>`. Each behaviour cites upstream beside its code in
tests/standins/k3s_standin.py and tests/standins/kubeapi.py.

The stand-in runs sandboxed (K3S_STANDIN_ROOT): the WireGuard module counts as present
when the sandbox root has what the tool's facts probe looks for (/sys/module/wireguard,
a modules.builtin line, or a wireguard.ko* under /lib/modules/<release>).
"""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sandbox import FAST, TOKEN, Cluster, Proc, cluster, free_port, k3s, wait  # noqa: F401  (fixtures: k3s, cluster)
from repo_paths import TESTS

SOURCE = TESTS / "standins" / "k3s_standin.py"
RELEASE = os.uname().release
MODULE = f"lib/modules/{RELEASE}/kernel/drivers/net/wireguard/wireguard.ko"
FLANNEL = "flannel.alpha.coreos.com/"
SERVER_EXT, AGENT_EXT = "203.0.113.10", "203.0.113.21"  # on no link: the public side of a 1:1 NAT
PUBLIC = {"flannel-backend": "wireguard-native", "flannel-external-ip": True,
          "node-ip": "127.0.0.1", "node-external-ip": SERVER_EXT}
MISSING_MODULE = ("flannel exited: failed to register flannel network: could not create wireguard interface: "
                  "operation not supported")
NO_EXTERNAL_IP = ("Server has flannel-external-ip flag set but this node does not set node-external-ip. Flannel "
                  "will use internal address when connecting to this node.")


def messages(log: str, level: str) -> list[str]:
    """The msg= texts of the stand-in's log lines at `level` (logrus quotes them like Go's %q)."""
    return [json.loads(m.group(1)) for m in re.finditer(r'level=%s msg=(".*")$' % level, log, re.M)]


def with_module(root: Path, relative: str = MODULE) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF wireguard module stand-in")
    return root


def agent(c: Cluster, name: str, config: dict, module: bool = True) -> Proc:
    """An agent with its own config keys (node-ip, node-external-ip, ...)."""
    root = c.base / name
    if module:
        with_module(root)
    path = root / "etc/rancher/k3s/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{c.port}", "token": TOKEN, **config}))
    p = Proc(c.k3s, ["agent", "--node-name", name], root)
    c.procs.append(p)
    return p


def public_server(c: Cluster, config: dict | None = None, module: bool = True, name: str = "cp-1"):
    root = c.base / name
    if module:
        with_module(root)
    return c.server(yaml.safe_dump(PUBLIC if config is None else config), root=root, name=name)


def exits(p: Proc, timeout: float = 20) -> int:
    return p.proc.wait(timeout)


def annotations(c: Cluster, name: str) -> dict:
    return c.node(name).metadata.annotations or {}


def addresses(c: Cluster, name: str) -> list[tuple[str, str]]:
    return [(a.type, a.address) for a in c.node(name).status.addresses]


def lease(c: Cluster, name: str, timeout: float = 15) -> dict:
    return wait(f"{name}'s flannel lease", lambda: (lambda a: a if FLANNEL + "backend-type" in a else None)(
        annotations(c, name)), timeout)


def run_once(k3s: Path, root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("K3S_", "NOTIFY_SOCKET"))}
    env.update(FAST, K3S_STANDIN_ROOT=str(root))
    return subprocess.run([sys.executable, str(k3s), *args], capture_output=True, text=True, timeout=timeout, env=env)


def write_config(root: Path, config: dict) -> None:
    path = root / "etc/rancher/k3s/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"token": TOKEN, **config}))


# --------------------------------------------------------------------------- the public mode


def test_public_mode_nodes_advertise_their_public_address_to_flannel(cluster):
    """flannel-io/flannel kube.go AcquireLease with k3s's public-ip-overwrite: every node's
    flannel address (public-ip) is its node-external-ip; the cloud provider gives it an
    ExternalIP; the WireGuard key pair is flannel's, in /run/flannel/wgkey."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    server = public_server(cluster)
    worker = agent(cluster, "gpu-1", {"node-ip": "127.0.0.1", "node-external-ip": AGENT_EXT})
    cluster.wait_ready("cp-1", "gpu-1")
    for name, external, proc in (("cp-1", SERVER_EXT, server), ("gpu-1", AGENT_EXT, worker)):
        ann = lease(cluster, name)
        assert ann[FLANNEL + "backend-type"] == "wireguard"
        assert ann[FLANNEL + "public-ip"] == external == ann[FLANNEL + "public-ip-overwrite"]
        assert ann[FLANNEL + "kube-subnet-manager"] == "true"
        assert (ann["k3s.io/internal-ip"], ann["k3s.io/external-ip"]) == ("127.0.0.1", external)
        assert addresses(cluster, name) == [("InternalIP", "127.0.0.1"), ("ExternalIP", external), ("Hostname", name)]
        data = json.loads(ann[FLANNEL + "backend-data"])
        assert set(data) == {"PublicKey", "Port"} and data["Port"] == 51820
        keyfile = cluster.base / name / "run/flannel/wgkey"
        assert stat.S_IMODE(keyfile.stat().st_mode) == 0o400
        private = X25519PrivateKey.from_private_bytes(base64.b64decode(keyfile.read_text()))
        assert base64.b64encode(private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode() \
            == data["PublicKey"]
        subnet = (cluster.base / name / "run/flannel/subnet.env").read_text()
        assert "FLANNEL_MTU=1420\n" in subnet  # the link's 1500 minus WireGuard's 80
        log = proc.log()
        assert "Starting flannel with backend wireguard-native" in log
        assert messages(log, "warning") == [] and messages(log, "error") == [], log


def test_the_wireguard_key_survives_a_restart(cluster):
    public_server(cluster)
    first = json.loads(lease(cluster, "cp-1")[FLANNEL + "backend-data"])["PublicKey"]
    cluster.stop()
    cluster.procs.clear()
    public_server(cluster)
    cluster.wait_ready("cp-1")
    assert json.loads(lease(cluster, "cp-1")[FLANNEL + "backend-data"])["PublicKey"] == first


def test_the_serving_certificate_names_the_advertise_address(cluster, tmp_path):
    """k3s-io/k3s pkg/cli/server/server.go: advertise-address, else node-external-ip, is a
    SAN, so agents verify the server at its public address."""
    from cryptography import x509

    def sans(port):
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                ssl._create_unverified_context().wrap_socket(raw) as conn:
            cert = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
        return {str(ip) for ip in cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)}

    public_server(cluster)
    assert {SERVER_EXT, "127.0.0.1"} <= sans(cluster.port)
    cluster.stop()
    other = Cluster(cluster.k3s, tmp_path / "advertise")
    try:
        public_server(other, dict(PUBLIC, **{"advertise-address": "192.0.2.5"}))
        found = sans(other.port)
        assert "192.0.2.5" in found and SERVER_EXT not in found  # advertise-address wins
    finally:
        other.stop()


# --------------------------------------------------------------------------- WireGuard module


def test_wireguard_native_without_the_module_fails_after_start_like_flannel(cluster, k3s, tmp_path):
    """No link of type wireguard without the kernel module: flannel's netlink LinkAdd gets
    EOPNOTSUPP; k3s logs it and exits 1 once up (systemd restarts it, for ever)."""
    root = tmp_path / "bare"
    write_config(root, {"cluster-init": True, **PUBLIC})
    p = Proc(k3s, ["server", "--https-listen-port", str(free_port()), "--bind-address", "127.0.0.1",
                   "--node-name", "cp-1"], root)
    try:
        assert exits(p) == 1
    finally:
        p.stop()
    log = p.log()
    assert messages(log, "error") == [MISSING_MODULE], log
    assert log.index("k3s is up and running") < log.index(MISSING_MODULE)  # after READY=1
    assert (root / "run/flannel/wgkey").exists()  # flannel made its key before the device
    assert not (root / "run/flannel/subnet.env").exists()  # never registered its network


def test_an_agent_without_the_module_exits_and_its_node_never_gets_ready(cluster):
    public_server(cluster)
    lost = agent(cluster, "gpu-2", {"node-ip": "127.0.0.1", "node-external-ip": AGENT_EXT}, module=False)
    assert exits(lost) == 1
    assert messages(lost.log(), "error") == [MISSING_MODULE], lost.log()
    node = wait("gpu-2's Node", lambda: cluster.node("gpu-2"))
    assert FLANNEL + "backend-type" not in (node.metadata.annotations or {})  # no lease: flannel never ran
    # what k3s itself set before flannel ran is there
    assert annotations(cluster, "gpu-2")[FLANNEL + "public-ip-overwrite"] == AGENT_EXT
    assert cluster.ready("gpu-2") != "True"
    wait("gpu-2 Unknown", lambda: cluster.ready("gpu-2") == "Unknown", 15)


@pytest.mark.parametrize("relative", [
    "sys/module/wireguard/",
    f"lib/modules/{RELEASE}/modules.builtin",
    f"lib/modules/{RELEASE}/kernel/drivers/net/wireguard/wireguard.ko",
    f"lib/modules/{RELEASE}/updates/dkms/wireguard.ko.zst",
    f"lib/modules/{RELEASE}/extra/wireguard.ko.xz",
    f"lib/modules/{RELEASE}/extra/wireguard.ko.gz",
])
def test_the_module_counts_as_present_on_the_facts_probe_signals(tmp_path, relative):
    standin = load_source(tmp_path)
    assert standin.wireguard_module() is None
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    if relative.endswith("/"):
        target.mkdir(exist_ok=True)
    elif relative.endswith("modules.builtin"):
        target.write_text("kernel/net/ipv4/tcp_cubic.ko\nkernel/drivers/net/wireguard/wireguard.ko\n")
    else:
        target.write_bytes(b"module")
    assert standin.wireguard_module() in ("loaded", "builtin", "module")


@pytest.mark.parametrize("relative, content", [
    (f"lib/modules/{RELEASE}/modules.builtin", "kernel/drivers/net/wireguard/wireguard.ko.disabled\n"),
    (f"lib/modules/{RELEASE}/kernel/wireguard.ko.bak", "x"),
    ("lib/modules/0.0.0-another-kernel/kernel/drivers/net/wireguard/wireguard.ko", "x"),
    ("sys/module/wireguard", "not a directory"),
])
def test_what_is_not_a_wireguard_module(tmp_path, relative, content):
    standin = load_source(tmp_path)
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    assert standin.wireguard_module() is None


def load_source(root: Path):
    loader = importlib.machinery.SourceFileLoader("k3s_standin_flannel_%d" % id(root), str(SOURCE))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    module.SANDBOX = str(root)
    return module


def test_the_stand_in_derives_wireguard_public_keys_as_wireguard_does():
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PrivateFormat, PublicFormat, NoEncryption

    standin = load_source(Path("/nonexistent"))
    for _ in range(5):
        key = X25519PrivateKey.generate()
        raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        assert standin._x25519_base(raw) == key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("backend", ["ipsec", "wireguard", "wireguard-native=auto", "vxlan-ipv6"])
def test_removed_and_unknown_backends_are_fatal(k3s, tmp_path, backend):
    """k3s-io/k3s pkg/agent/flannel/setup.go createFlannelConf: "Cannot configure unknown
    flannel backend" (ipsec removed in v1.27/v1.28, wireguard in v1.26, backend=options in v1.28)."""
    write_config(tmp_path, {"flannel-backend": backend})
    proc = run_once(k3s, tmp_path, "server", "--https-listen-port", str(free_port()), "--bind-address", "127.0.0.1")
    assert proc.returncode == 1
    assert messages(proc.stderr, "fatal") == [f"Cannot configure unknown flannel backend '{backend}'"], proc.stderr
    assert not (tmp_path / "var/lib/rancher/k3s/server/token").exists()  # it never came up


@pytest.mark.parametrize("key, value", [("flannel-backend", "wireguard-native"), ("flannel-external-ip", True)])
def test_agents_do_not_take_the_server_flannel_flags(k3s, tmp_path, key, value):
    """Server flags: `k3s agent`'s flag list has neither (k3s-io/docs docs/cli/agent.md)."""
    path = tmp_path / "etc/rancher/k3s/config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"server": "https://127.0.0.1:6443", "token": TOKEN, key: value}))
    proc = run_once(k3s, tmp_path, "agent")
    assert proc.returncode == 1
    assert messages(proc.stderr, "fatal") == [f"flag provided but not defined: -{key} (in {path})"], proc.stderr


@pytest.mark.parametrize("joiner, mismatched", [
    ({"flannel-backend": "wireguard-native"}, "flannel-external-ip"),
    ({"flannel-external-ip": True}, "flannel-backend"),
    ({}, "flannel-backend, flannel-external-ip"),
])
def test_a_joining_server_must_have_the_same_flannel_settings(cluster, k3s, tmp_path, joiner, mismatched):
    """Both are critical configuration (k3s-io/docs docs/cli/server.md, commit 0243496)."""
    public_server(cluster)
    cluster.wait_ready("cp-1")
    root = with_module(tmp_path / "cp-2")
    write_config(root, {"server": f"https://127.0.0.1:{cluster.port}", "node-ip": "127.0.0.1", **joiner})
    proc = run_once(k3s, root, "server", "--https-listen-port", str(free_port()), "--bind-address", "127.0.0.1",
                    "--node-name", "cp-2")
    assert proc.returncode == 1
    assert f"critical configuration value mismatch between servers: {mismatched}" in proc.stderr, proc.stderr


def test_a_node_external_ip_must_be_an_address(k3s, tmp_path):
    write_config(tmp_path, {"node-external-ip": "public.example"})
    proc = run_once(k3s, tmp_path, "server", "--https-listen-port", str(free_port()), "--bind-address", "127.0.0.1")
    assert proc.returncode == 1
    assert messages(proc.stderr, "fatal") == [
        "failed to retrieve agent configuration: invalid node-external-ip: invalid ip format 'public.example'"]


# --------------------------------------------------------------------------- warnings


def test_a_node_without_an_external_ip_is_warned_and_peers_use_its_internal_address(cluster):
    public_server(cluster)
    worker = agent(cluster, "gpu-3", {"node-ip": "127.0.0.1"})
    cluster.wait_ready("gpu-3")
    assert messages(worker.log(), "warning") == [NO_EXTERNAL_IP]
    ann = lease(cluster, "gpu-3")
    assert ann[FLANNEL + "public-ip"] == "127.0.0.1" and FLANNEL + "public-ip-overwrite" not in ann
    assert "k3s.io/external-ip" not in ann and ("ExternalIP", AGENT_EXT) not in addresses(cluster, "gpu-3")


def test_external_addresses_with_an_unencrypted_backend_are_warned(cluster):
    server = public_server(cluster, dict(PUBLIC, **{"flannel-backend": "vxlan"}))
    cluster.wait_ready("cp-1")
    assert messages(server.log(), "warning") == [
        "Flannel is using external addresses with an insecure backend: vxlan. Please consider using an encrypting "
        "flannel backend."]
    ann = lease(cluster, "cp-1")
    assert ann[FLANNEL + "backend-type"] == "vxlan" and ann[FLANNEL + "public-ip"] == SERVER_EXT
    data = json.loads(ann[FLANNEL + "backend-data"])
    assert data["VNI"] == 1 and re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", data["VtepMAC"])
    assert "FLANNEL_MTU=1450\n" in (cluster.root / "run/flannel/subnet.env").read_text()


def test_without_flannel_external_ip_flannel_keeps_the_internal_address(cluster):
    """node-external-ip alone: an ExternalIP, but flannel's peers use the node IP."""
    public_server(cluster, {"node-ip": "127.0.0.1", "node-external-ip": SERVER_EXT, "flannel-backend": "host-gw"})
    cluster.wait_ready("cp-1")
    ann = lease(cluster, "cp-1")
    assert (ann[FLANNEL + "backend-type"], ann[FLANNEL + "backend-data"]) == ("host-gw", "null")
    assert ann[FLANNEL + "public-ip"] == "127.0.0.1" and FLANNEL + "public-ip-overwrite" not in ann
    assert ("ExternalIP", SERVER_EXT) in addresses(cluster, "cp-1")
    assert messages(cluster.procs[0].log(), "warning") == []


def test_flannel_backend_none_runs_no_flannel(cluster):
    public_server(cluster, {"flannel-backend": "none", "flannel-external-ip": True, "node-external-ip": SERVER_EXT})
    cluster.wait_ready("cp-1")
    assert FLANNEL + "backend-type" not in annotations(cluster, "cp-1")
    assert not (cluster.root / "run/flannel").exists()
    assert not (cluster.root / "var/lib/rancher/k3s/agent/etc/cni/net.d/10-flannel.conflist").exists()
    assert messages(cluster.procs[0].log(), "warning") == []  # the flannel checks are skipped with it


# --------------------------------------------------------------------------- restarts


def test_an_external_ip_taken_out_of_the_config_stays_on_the_node_as_in_k3s(cluster):
    """k3s merges its address annotations into the Node's (labels.Merge), so a dropped
    node-external-ip keeps its k3s.io/external-ip, its ExternalIP and flannel's overwrite."""
    public_server(cluster)
    worker = agent(cluster, "gpu-4", {"node-ip": "127.0.0.1", "node-external-ip": AGENT_EXT})
    cluster.wait_ready("gpu-4")
    worker.stop()
    cluster.procs.remove(worker)
    again = agent(cluster, "gpu-4", {"node-ip": "127.0.0.1"})
    wait("gpu-4 registered again", lambda: NO_EXTERNAL_IP in again.log())
    cluster.wait_ready("gpu-4")
    ann = annotations(cluster, "gpu-4")
    assert ann["k3s.io/external-ip"] == AGENT_EXT == ann[FLANNEL + "public-ip"]
    assert ("ExternalIP", AGENT_EXT) in addresses(cluster, "gpu-4")
