"""The k3s stand-in (tests/standins/k3s_standin.py, built by tests/standins/airgap.py)
honours the host-side contract of real k3s that the tool relies on.

Fast tests run the built stand-in on this machine in a sandbox (K3S_STANDIN_ROOT: all
of /etc/rancher, /var/lib/rancher, /run/... under a temp dir; no links, iptables or
shim; free ports on 127.0.0.1). tests/hosts/test_k3s_standin_hosts.py installs it on two
test hosts by hand and runs it under systemd with a Type=notify unit like the installer's.

Where the stand-in differs from real k3s (on purpose, or because it cannot do more):
- Its supervisor port (6443) speaks HTTPS with k3s's CAs and certificates
  (tests/standins/k3s_pki.py, made with openssl; k3s.yaml as k3s writes it), but the
  kubelet port (10250) plain HTTP; the Kubernetes API it serves is a stand-in
  (tests/standins/kubeapi.py, tested in tests/standin_tests/test_kubeapi.py). Its join
  protocol (/cacerts, /v1-standin/join) is its own; real agents use /v1-k3s/....
- `k3s server` refuses unknown config-file keys (real k3s >= 1.21.7 only logs
  "Unknown flag --x found in config.yaml, skipping"; K3S_STANDIN_LENIENT_CONFIG=1
  restores that). `k3s agent` and CLI flags fail as in real k3s
  ("flag provided but not defined: -x").
- An agent (or joining server) that cannot reach its server gives up after
  K3S_STANDIN_JOIN_TIMEOUT seconds (20); a wrong token is fatal at once. Real k3s
  keeps retrying both, so its unit stays "activating" instead of failing.
- A changed node password is refused as real k3s refuses it (an agent's: 403 until its
  Node and node-password secret are gone; a server's own node: a Warning event only), but
  the stand-in keeps the password's sha256 in the secret where k3s keeps an scrypt hash;
  see tests/standin_tests/test_standin_node_identity.py.
- Node lists are not replicated between servers after a join; no etcd runs (the
  data dir only has the files and the ports are held); snapshots are JSON files;
  nothing from server/manifests is applied; registries.yaml is not read.
- A node-ip on no link of the host is fatal before the node joins; real k3s registers the
  node first, then its network policy controller exits (with disable-network-policy the
  kubelet only fails every node status update). Either way the node never works.
- The version guard (no downgrade, no skipped minor) is the stand-in's own check of
  the documented upgrade rules, not an error real k3s prints.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import random
import re
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "standins"))
import airgap  # noqa: E402

SOURCE = TESTS / "standins" / "k3s_standin.py"
VERSION = "v1.33.5+k3s1"
PASSWORD = "lab-Secret-7f3a9c"  # never to appear in a log
K10 = re.compile(r"^K10([0-9a-f]{64})::server:(.+)$")

needs_upstream = pytest.mark.skipif(airgap.upstream_missing() is not None, reason=airgap.upstream_missing() or "")


# --------------------------------------------------------------------------- helpers


def load_module(path: Path, name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def airgap_dir(tmp_path_factory):
    if airgap.upstream_missing():
        pytest.skip(airgap.upstream_missing())
    return airgap.build_airgap(tmp_path_factory.mktemp("airgap"), VERSION)


@pytest.fixture(scope="module")
def k3s(airgap_dir):
    return airgap_dir / "k3s"


@pytest.fixture
def built(k3s, monkeypatch):
    """The built stand-in imported as a module (for its parser and option merging)."""
    for key in list(os.environ):
        if key.startswith("K3S_"):
            monkeypatch.delenv(key)
    return load_module(k3s, "k3s_built_%d" % id(monkeypatch))


@pytest.fixture(scope="module")
def source_module():
    return load_module(SOURCE, "k3s_standin_source")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interpreter(k3s: Path) -> list[str]:
    # The shebang is /usr/bin/python3 (Debian 12's, as on the test hosts); fall back to
    # this interpreter where that does not exist.
    return [str(k3s)] if Path("/usr/bin/python3").exists() else [sys.executable, str(k3s)]


def clean_env(root: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("K3S_", "NOTIFY_SOCKET"))}
    env["K3S_STANDIN_ROOT"] = str(root)
    env.update(extra or {})
    return env


def run(k3s: Path, *args: str, root: Path, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(interpreter(k3s) + list(args), capture_output=True, text=True, timeout=timeout,
                          env=clean_env(root, env))
    assert PASSWORD not in proc.stderr + proc.stdout, "the token leaked into the output"
    return proc


def messages(log: str, level: str = "fatal") -> list[str]:
    """The msg= texts of log lines at `level` (logrus quotes them like Go's %q)."""
    return [json.loads(m.group(1)) for m in re.finditer(r'level=%s msg=(".*")$' % level, log, re.M)]


def write_config(root: Path, text: str, name: str = "config.yaml") -> Path:
    path = root / "etc/rancher/k3s" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class Running:
    """A stand-in server or agent started in the background; READY=1 arrives on a
    NOTIFY_SOCKET of our own, as systemd would receive it."""

    def __init__(self, k3s: Path, args: list[str], root: Path, env: dict | None = None):
        self.sockdir = tempfile.mkdtemp(prefix="k3sn-", dir="/tmp")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(os.path.join(self.sockdir, "n"))
        self.logfile = open(os.path.join(self.sockdir, "log"), "w+")
        self.proc = subprocess.Popen(interpreter(k3s) + args, stdout=self.logfile, stderr=subprocess.STDOUT,
                                     env=clean_env(root, dict(env or {}, NOTIFY_SOCKET=os.path.join(self.sockdir, "n"))))

    def wait_ready(self, timeout: float = 20) -> "Running":
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                if b"READY=1" in self.sock.recv(4096):
                    return self
            except socket.timeout:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited ({self.proc.returncode}) before READY=1:\n{self.log()}")
        raise AssertionError(f"no READY=1 within {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        self.logfile.flush()
        with open(self.logfile.name) as fh:
            text = fh.read()
        assert PASSWORD not in text, "the token leaked into the log"
        return text

    def stop(self) -> str:
        if self.logfile.closed:
            return self.text
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.text = self.log()
        self.sock.close()
        self.logfile.close()
        shutil.rmtree(self.sockdir, ignore_errors=True)
        return self.text


@pytest.fixture
def procs():
    started: list[Running] = []
    yield started
    for p in started:
        p.stop()


def start(procs, k3s, args, root, env=None, ready=True) -> Running:
    p = Running(k3s, args, root, env)
    procs.append(p)
    return p.wait_ready() if ready else p


def get_json(port: int, path: str):
    """The stand-in's own test endpoints (TLS verification: test_server_serves_tls_like_k3s)."""
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=5,
                                context=ssl._create_unverified_context()) as resp:
        return json.loads(resp.read())


def server_args(port: int, name: str = "cp-1", *more: str) -> list[str]:
    return ["server", "--https-listen-port", str(port), "--bind-address", "127.0.0.1", "--node-name", name, *more]


def start_server(procs, k3s, root: Path, config: str | None = None, name: str = "cp-1", env=None, more=()):
    if config is not None:
        write_config(root, config)
    port = free_port()
    p = start(procs, k3s, server_args(port, name, *more), root, env)
    return p, port


# --------------------------------------------------------------------------- air-gap folder


@needs_upstream
def test_airgap_folder_looks_like_a_release(airgap_dir):
    names = sorted(p.name for p in airgap_dir.iterdir())
    assert names == ["k3s", "k3s-airgap-images-amd64.tar.zst", "sha256sum-amd64.txt"]
    assert os.access(airgap_dir / "k3s", os.X_OK)
    assert (airgap_dir / "k3s").read_text().startswith("#!/usr/bin/python3\n")
    lines = (airgap_dir / "sha256sum-amd64.txt").read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        digest, name = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups()
        assert hashlib.sha256((airgap_dir / name).read_bytes()).hexdigest() == digest
    images = (airgap_dir / "k3s-airgap-images-amd64.tar.zst").read_bytes()
    assert images[:4] == b"\x28\xb5\x2f\xfd" and len(images) < 64 * 1024
    if shutil.which("zstd"):
        listing = subprocess.run(["zstd", "-dc"], input=images, capture_output=True, check=True).stdout
        assert listing[257:262] == b"ustar" and b"mirrored-pause" in listing


@needs_upstream
def test_embedded_flags_are_the_upstream_list(built):
    upstream = airgap.load_flags(airgap.default_flags_file())
    assert built.EMBEDDED["flags"] == {k: sorted(set(v)) for k, v in upstream.items()}
    assert built.EMBEDDED["version"] == VERSION
    # servers take every agent flag too (the k3s docs say so)
    assert built.valid_flags("server") >= set(upstream["agent"]) | set(upstream["server"])
    assert "cluster-init" not in built.valid_flags("agent")


def test_source_refuses_to_run_unbuilt():
    proc = subprocess.run([sys.executable, str(SOURCE), "--version"], capture_output=True, text=True)
    assert proc.returncode == 2 and "airgap.py" in proc.stderr


def test_builder_rejects_bad_versions_and_flag_files(tmp_path):
    bad = tmp_path / "flags.txt"
    bad.write_text("server: token\nworker: nope\n")
    with pytest.raises(ValueError):
        airgap.load_flags(bad)
    with pytest.raises(ValueError):
        airgap.standin_program("1.33", flags={"server": ["token"], "agent": ["token"]})


@needs_upstream
@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_output(k3s, tmp_path, flag):
    proc = run(k3s, flag, root=tmp_path)
    assert proc.returncode == 0
    assert re.fullmatch(r"k3s version v1\.33\.5\+k3s1 \([0-9a-f]{8}\)\ngo version go1\.\d+\.\d+\n", proc.stdout)


# --------------------------------------------------------------------------- YAML subset


# What PyYAML safe_dump(..., default_flow_style=False) writes for the values the tool
# uses must read back the same.
ROUND_TRIP = [
    {"token": "abc123", "cluster-init": True, "https-listen-port": 6443},
    {"write-kubeconfig-mode": "0644", "node-ip": "10.200.0.11", "flannel-iface": "eth0"},
    {"node-label": ["nvidia.com/gpu.present=true", "zone=a"], "node-taint": ["gpu=true:NoSchedule"]},
    {"disable": ["traefik", "servicelb"], "tls-san": ["api.example.com", "203.0.113.10"]},
    {"kubelet-arg": ["max-pods=250", "eviction-hard=memory.available<5%"], "disable": []},
    {"server": "https://10.200.0.11:6443", "token": "K10" + "ab" * 32 + "::server:p@ss:w#rd"},
    {"node-name": "yes", "etcd-snapshot-schedule-cron": "0 */6 * * *", "vmodule": "1.10", "v": 2},
    {"node-label": ["quote'single", 'quote"double', "colon: space", "# not a comment", "", "tab\there"]},
    {"kube-apiserver-arg": ["a" * 30 + " " + "b" * 30 + " " + "c" * 40 + " long words folded by width"]},
    {"etcd-s3-folder": "line one\nline two\n\nafter blank", "node-external-dns": "ünïcødé.example"},
    {"data-dir": "/var/lib/rancher/k3s", "cluster-reset": False, "etcd-snapshot-retention": 10},
    {"token": "123456", "agent-token": "0x1F", "node-name": "null", "cluster-domain": "~"},
]


@pytest.mark.parametrize("data", ROUND_TRIP, ids=lambda d: ",".join(d)[:40])
def test_yaml_round_trips_pyyaml_safe_dump(source_module, data):
    text = yaml.safe_dump(data, default_flow_style=False)
    assert dict(source_module.parse_config_yaml(text, "t.yaml")) == data, text


def test_yaml_round_trips_many_pyyaml_strings(source_module):
    """Random strings (quotes, colons, hashes, dashes, spaces, breaks, non-ASCII, long
    enough to be wrapped) as values and list items, through PyYAML and back."""
    rng = random.Random(20251129)
    alphabet = "abcXYZ019 -_:#'\"!@&*?|>%,[]{}.=/\\\t\né中😀"
    checked = 0
    for _ in range(400):
        value = "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 3, 10, 40, 120])))
        emitted = yaml.safe_dump({"v": value}, default_flow_style=False)
        if not emitted.startswith(("v: '", 'v: "')) and source_module.resolve_plain(value) != value:
            continue  # plain for PyYAML but typed for yaml.v2: see the test below
        data = {"node-name": value, "node-label": [value, "x=" + value]}
        text = yaml.safe_dump(data, default_flow_style=False)
        assert dict(source_module.parse_config_yaml(text, "t.yaml")) == data, text
        checked += 1
    assert checked > 350


def test_yaml_v2_types_some_strings_pyyaml_leaves_plain(source_module):
    """k3s reads config with yaml.v2, which types a few plain strings that PyYAML
    (YAML 1.1 without y/n, 0o, exponent-only floats) writes unquoted. The stand-in
    reads them as k3s would, so a tool must quote such values itself."""
    for value, typed, as_flag in [("y", True, "true"), ("n", False, "false"), ("0o17", 15, "15"),
                                  ("1e5", 100000.0, "100000")]:
        text = yaml.safe_dump({"node-name": value})
        assert text == f"node-name: {value}\n"
        ((_, got),) = source_module.parse_config_yaml(text, "t.yaml")
        assert got == typed and source_module.go_string(got) == as_flag


def test_yaml_accepts_hand_written_forms(source_module):
    text = """\
---
# comment line
token: "quoted # not a comment"   # a comment
tls-san: [ api.example , "10.0.0.1", 'x' ]
disable:
  - traefik
  -   servicelb   # indented list
node-label:
- a=b
multi: this is
  one folded
  plain scalar
dq: "escapes \\t \\u00e9 \\x41 \\
  joined"
sq: 'it''s'
empty:
flow-empty: []
cluster-init: yes
short: y
octal: 0644
hex: 0x10
float: 1.10
"""
    got = dict(source_module.parse_config_yaml(text, "t.yaml"))
    assert got == {
        "token": "quoted # not a comment", "tls-san": ["api.example", "10.0.0.1", "x"],
        "disable": ["traefik", "servicelb"], "node-label": ["a=b"], "multi": "this is one folded plain scalar",
        "dq": "escapes \t \u00e9 A joined", "sq": "it's", "empty": None, "flow-empty": [], "cluster-init": True,
        "short": True, "octal": 420, "hex": 16, "float": 1.1,
    }
    # and these reach k3s as yaml.v2 + convert.ToString would pass them
    assert [source_module.go_string(got[k]) for k in ("octal", "float", "short", "empty")] == ["420", "1.1", "true", ""]


@pytest.mark.parametrize("text,why", [
    ("kubelet:\n  max-pods: 10\n", "nested mapping"),
    ("a: {b: 1}\n", "mapping"),
    ("a:\n- - x\n", "lists of lists"),
    ("a:\n- b: c\n", "mappings inside lists"),
    ("a: [x, [y]]\n", "nested"),
    ("a: &x 1\nb: *x\n", "anchors"),
    ("a: |\n  text\n", "block scalars"),
    ("a: b: c\n", "mapping values"),
    ("- a\n- b\n", "top level is a list"),
    ("a: 1\n---\nb: 2\n", "more than one YAML document"),
    ("a: 1\n\tb: 2\n", "tab"),
    ("  a: 1\n", "unexpected indentation"),
    ('a: "unterminated\n', "unterminated"),
    ("a: [x, y\n", "unterminated"),
    ("just a scalar\n", "expected ':'"),
])
def test_yaml_rejects_what_is_not_a_flat_flag_mapping(source_module, text, why):
    with pytest.raises(source_module.YamlError) as err:
        source_module.parse_config_yaml(text, "/etc/rancher/k3s/config.yaml")
    assert why in str(err.value) and "/etc/rancher/k3s/config.yaml:" in str(err.value)


def test_yaml_errors_do_not_echo_values(source_module):
    with pytest.raises(source_module.YamlError) as err:
        source_module.parse_config_yaml(f'token "{PASSWORD}"\n', "c.yaml")
    assert PASSWORD not in str(err.value)


# --------------------------------------------------------------------------- config merge and flags


@needs_upstream
def test_config_dropins_append_and_cli_precedence(built, tmp_path, monkeypatch):
    base = tmp_path / "config.yaml"
    base.write_text(yaml.safe_dump({"token": "from-base", "node-label": ["a=1"], "disable": ["traefik"],
                                    "write-kubeconfig-mode": "0600"}))
    dropins = tmp_path / "config.yaml.d"
    dropins.mkdir()
    (dropins / "20-b.yaml").write_text("node-label+:\n- b=2\nwrite-kubeconfig-mode: '0640'\n")
    (dropins / "10-a.yml").write_text("node-label+: [c=3]\ndisable: servicelb,metrics-server\n")
    (dropins / "30-ignored.txt").write_text("not-a-flag: 1\n")
    (dropins / "40-c.yaml").write_text("token: from-dropin\n")
    monkeypatch.setenv("K3S_CONFIG_FILE", str(base))
    opts = built.load_options("server", ["--node-label", "d=4", "--token=from-cli", "--cluster-init"])
    assert opts["node-label"] == ["a=1", "c=3", "b=2", "d=4"]
    assert opts["disable"] == ["servicelb", "metrics-server"]  # 10-a replaced the list; k3s splits commas
    assert opts["write-kubeconfig-mode"] == "0640"
    assert opts["token"] == "from-cli"
    assert opts["cluster-init"] is True


@needs_upstream
def test_environment_fills_unset_flags(built, tmp_path, monkeypatch):
    monkeypatch.setenv("K3S_CONFIG_FILE", str(tmp_path / "absent.yaml"))  # explicit but absent: error
    with pytest.raises(built.Fatal):
        built.load_options("agent", [])
    monkeypatch.setenv("K3S_CONFIG_FILE", str(tmp_path / "c.yaml"))
    (tmp_path / "c.yaml").write_text("server: https://from-file:6443\n")
    monkeypatch.setenv("K3S_URL", "https://from-env:6443")
    monkeypatch.setenv("K3S_TOKEN", "env-token")
    opts = built.load_options("agent", [])
    assert opts["server"] == "https://from-file:6443" and opts["token"] == "env-token"


@needs_upstream
@pytest.mark.parametrize("command,config,cli,message", [
    ("server", "not-a-flag: 1\n", [], "flag provided but not defined: -not-a-flag"),
    ("agent", "not-a-flag: 1\n", [], "flag provided but not defined: -not-a-flag"),
    ("agent", "cluster-init: true\n", [], "flag provided but not defined: -cluster-init"),
    ("server", "", ["--not-a-flag"], "flag provided but not defined: -not-a-flag"),
    ("server", "cluster-init: maybe\n", [], 'invalid boolean value "maybe" for -cluster-init'),
    ("server", "", ["--https-listen-port", "x"], 'invalid value "x" for flag -https-listen-port'),
    ("server", "", ["--token"], "flag needs an argument: -token"),
    ("server", "kubelet:\n  max-pods: 1\n", [], "nested mapping"),
])
def test_invalid_configuration_is_fatal_and_named(k3s, tmp_path, command, config, cli, message):
    path = write_config(tmp_path, f"token: {PASSWORD}\n" + config)
    proc = run(k3s, command, *cli, root=tmp_path)
    assert proc.returncode == 1, proc.stderr
    fatal_lines = messages(proc.stderr)
    assert len(fatal_lines) == 1 and message in fatal_lines[0], proc.stderr
    if config and "nested" not in message:
        assert str(path) in fatal_lines[0]  # names the file the key came from


@needs_upstream
def test_lenient_mode_skips_unknown_server_keys_like_real_k3s(k3s, tmp_path, procs):
    p, port = start_server(procs, k3s, tmp_path, f"token: {PASSWORD}\nnot-a-flag: 1\n",
                           env={"K3S_STANDIN_LENIENT_CONFIG": "1"})
    assert 'level=warning msg="Unknown flag --not-a-flag found in config.yaml, skipping"' in p.log()


# --------------------------------------------------------------------------- server


@needs_upstream
def test_server_writes_token_kubeconfig_and_serves(k3s, tmp_path, procs):
    p, port = start_server(procs, k3s, tmp_path, yaml.safe_dump(
        {"token": PASSWORD, "cluster-init": True, "node-label": ["role=cp"], "disable": ["traefik"]}))
    server = tmp_path / "var/lib/rancher/k3s/server"
    token = (server / "token").read_text().strip()
    digest, password = K10.match(token).groups()
    assert password == PASSWORD
    assert digest == hashlib.sha256((server / "tls/server-ca.crt").read_bytes()).hexdigest()
    for name in ("token", "node-token", "agent-token"):
        assert stat.S_IMODE((server / name).stat().st_mode) == 0o600
        assert (server / name).read_text().strip() == token
    kubeconfig_path = tmp_path / "etc/rancher/k3s/k3s.yaml"
    assert stat.S_IMODE(kubeconfig_path.stat().st_mode) == 0o600
    kubeconfig = yaml.safe_load(kubeconfig_path.read_text())
    (cluster,) = kubeconfig["clusters"]
    assert cluster["name"] == "default" and set(cluster["cluster"]) == {"server", "certificate-authority-data"}
    assert cluster["cluster"]["server"] == f"https://127.0.0.1:{port}"
    ca = base64.b64decode(cluster["cluster"]["certificate-authority-data"])
    assert ca == (server / "tls/server-ca.crt").read_bytes()
    assert kubeconfig["current-context"] == "default"
    assert kubeconfig["contexts"][0]["context"] == {"cluster": "default", "user": "default"}
    assert set(kubeconfig["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/ping", timeout=5,
                                context=ssl.create_default_context(cadata=ca.decode())) as resp:
        assert resp.read() == b"pong"
    assert get_json(port, "/v1-standin/info")["datastore"] == "etcd"
    assert (server / "db/etcd/member").is_dir()
    (node,) = get_json(port, "/v1-standin/nodes")["nodes"]
    assert (node["name"], node["role"], node["labels"], node["etcd"]) == ("cp-1", "server", ["role=cp"], True)
    manifests = sorted(p.name for p in (server / "manifests").iterdir())
    assert "traefik.yaml" not in manifests and "coredns.yaml" in manifests
    log = p.stop()
    assert 'level=info msg="Starting k3s v1.33.5+k3s1 (' in log.splitlines()[0]
    assert "Received SIGTERM" in log


@needs_upstream
def test_server_generates_and_keeps_a_token_and_refuses_another(k3s, tmp_path, procs):
    p, _ = start_server(procs, k3s, tmp_path, "write-kubeconfig-mode: '0644'\n")
    token_file = tmp_path / "var/lib/rancher/k3s/server/token"
    first = token_file.read_text()
    assert K10.match(first.strip())
    assert stat.S_IMODE((tmp_path / "etc/rancher/k3s/k3s.yaml").stat().st_mode) == 0o644
    p.stop()
    p, _ = start_server(procs, k3s, tmp_path)  # restart without a token: same token
    assert token_file.read_text() == first
    p.stop()
    write_config(tmp_path, f"token: {PASSWORD}\n")
    proc = run(k3s, *server_args(free_port()), root=tmp_path)
    assert proc.returncode == 1
    assert "bootstrap data already found and encrypted with different token" in proc.stderr


@needs_upstream
def test_an_agent_token_added_to_a_running_cluster_is_fatal_at_the_servers_next_start(k3s, tmp_path, procs):
    """k3s's datastore keeps the bootstrap copy of server/cred/passwd; a start with a new
    agent-token rewrites the disk copy only, and the next start refuses it (k3s-io/k3s
    pkg/cluster/bootstrap.go ReconcileBootstrapData; rancher/rke2#5785)."""
    config = f"token: {PASSWORD}\ncluster-init: true\n"
    p, _ = start_server(procs, k3s, tmp_path, config)
    p.stop()
    p, _ = start_server(procs, k3s, tmp_path)  # a plain restart: disk and datastore agree
    p.stop()
    p, _ = start_server(procs, k3s, tmp_path, config + "agent-token: agent-only-9b2\n")
    assert "bootstrap key already exists" in p.stop()
    proc = run(k3s, *server_args(free_port()), root=tmp_path)
    assert proc.returncode == 1
    assert "server/cred/passwd newer than datastore and could cause a cluster outage" in proc.stderr


@needs_upstream
def test_first_server_refuses_a_k10_token_for_another_ca(k3s, tmp_path):
    write_config(tmp_path, f"token: K10{'0' * 64}::server:{PASSWORD}\n")
    proc = run(k3s, *server_args(free_port()), root=tmp_path)
    assert proc.returncode == 1 and "token CA hash does not match the Cluster CA certificate hash" in proc.stderr


@needs_upstream
def test_port_in_use_is_fatal(k3s, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = run(k3s, *server_args(s.getsockname()[1]), root=tmp_path)
    assert proc.returncode == 1 and "failed to listen" in proc.stderr


@needs_upstream
@pytest.mark.parametrize("extra, message", [
    ((), "unable to initialize network policy controller: error getting node subnet: "
          "failed to find interface with specified node ip"),
    (("--disable-network-policy",), 'failed to validate nodeIP: node IP: "192.0.2.250" not found in the host\'s '
                                     "network interfaces"),
])
def test_node_ip_not_on_any_link_is_fatal(k3s, tmp_path, extra, message):
    """Behind a 1:1 NAT the public address is on no interface: real k3s exits (its network
    policy controller finds no link with the node IP) and systemd restarts it forever."""
    proc = run(k3s, *server_args(free_port(), "cp-1", "--node-ip", "192.0.2.250", *extra), root=tmp_path)
    assert proc.returncode == 1 and any(message in m for m in messages(proc.stderr)), proc.stderr
    assert not (tmp_path / "var/lib/rancher/k3s/server/token").exists()  # it never came up


@needs_upstream
def test_node_ip_on_a_link_starts(k3s, tmp_path, procs):
    p, port = start_server(procs, k3s, tmp_path, more=("--node-ip", "127.0.0.1"))
    assert get_json(port, "/v1-standin/nodes")["nodes"][0]["address"] == "127.0.0.1"


def test_link_addresses_lists_every_address_of_every_link(source_module):
    """The netlink dump finds what `ip -o addr` lists (both families, every link)."""
    import ipaddress

    found = source_module.link_addresses()
    listed = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    expected = {ipaddress.ip_address(m) for m in re.findall(r"\binet6? ([0-9a-f.:]+)", listed)}
    assert ipaddress.ip_address("127.0.0.1") in found and expected and found == expected


# --------------------------------------------------------------------------- agents and joins


@pytest.fixture
def cluster(k3s, tmp_path, procs):
    """A running first server (etcd) in tmp_path/s1; returns (port, token, root)."""
    root = tmp_path / "s1"
    config = {"token": PASSWORD, "cluster-init": True, "agent-token": "agent-only-9b2"}
    _, port = start_server(procs, k3s, root, yaml.safe_dump(config))
    token = (root / "var/lib/rancher/k3s/server/token").read_text().strip()
    return port, token, root


def agent_config(port: int, token: str, **more) -> str:
    return yaml.safe_dump({"server": f"https://127.0.0.1:{port}", "token": token, **more})


@needs_upstream
@pytest.mark.parametrize("token_kind", ["full", "short"])
def test_agent_joins_with_full_or_short_agent_token(k3s, tmp_path, procs, cluster, token_kind):
    port, token, _ = cluster
    digest = K10.match(token).group(1)
    token = {"full": f"K10{digest}::node:agent-only-9b2", "short": "agent-only-9b2"}[token_kind]
    root = tmp_path / "a1"
    kubelet = free_port()
    write_config(root, agent_config(port, token, **{"node-label": ["gpu=true"], "node-taint": ["gpu=true:NoSchedule"]}))
    a = start(procs, k3s, ["agent", "--node-name", "gpu-1", "--kubelet-arg", f"port={kubelet}",
                           "--bind-address", "127.0.0.1"], root, {"K3S_TOKEN": "ignored-as-config-wins"})
    nodes = {n["name"]: n for n in get_json(port, "/v1-standin/nodes")["nodes"]}
    assert nodes["gpu-1"]["role"] == "agent"
    assert nodes["gpu-1"]["labels"] == ["gpu=true"] and nodes["gpu-1"]["taints"] == ["gpu=true:NoSchedule"]
    assert nodes["gpu-1"]["pod_cidr"] != nodes["cp-1"]["pod_cidr"]
    assert "password_sha256" not in nodes["gpu-1"]
    with urllib.request.urlopen(f"http://127.0.0.1:{kubelet}/healthz", timeout=5) as resp:
        assert resp.read() == b"ok"
    agent_dir = root / "var/lib/rancher/k3s/agent"
    assert (agent_dir / "etc/containerd/config.toml").exists()
    assert (root / "etc/rancher/node/password").stat().st_mode & 0o077 == 0
    assert "Joined the cluster" in a.log()


@needs_upstream
@pytest.mark.parametrize("case,message", [
    ("wrong-password", "401 Unauthorized"),
    ("wrong-ca", "token CA hash does not match the Cluster CA certificate hash"),
    ("agent-token-for-server", "401 Unauthorized"),
    # With agent-token set, agents authenticate as "node" with it only (k3s's passwd users).
    ("server-token-for-agent", "401 Unauthorized"),
    ("short-server-token-for-agent", "401 Unauthorized"),
    ("no-token", "--token is required"),
    ("http-url", "server url must begin with https://"),
])
def test_agent_with_wrong_token_or_url_fails_at_once(k3s, tmp_path, cluster, case, message):
    port, token, _ = cluster
    root = tmp_path / "bad"
    digest = K10.match(token).group(1)
    configs = {
        "wrong-password": agent_config(port, "not-the-password"),
        "wrong-ca": agent_config(port, f"K10{'f' * 64}::node:agent-only-9b2"),
        "server-token-for-agent": agent_config(port, token),
        "short-server-token-for-agent": agent_config(port, PASSWORD),
        "agent-token-for-server": yaml.safe_dump({"server": f"https://127.0.0.1:{port}",
                                                  "token": f"K10{digest}::node:agent-only-9b2"}),
        "no-token": yaml.safe_dump({"server": f"https://127.0.0.1:{port}"}),
        "http-url": agent_config(port, PASSWORD).replace("https://", "http://"),
    }
    write_config(root, configs[case])
    command = "server" if case == "agent-token-for-server" else "agent"
    args = server_args(free_port(), "cp-2") if command == "server" else ["agent", "--node-name", "w-bad"]
    started = time.monotonic()
    proc = run(k3s, *args, root=root, env={"K3S_STANDIN_JOIN_TIMEOUT": "3"})
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert time.monotonic() - started < 10


@needs_upstream
def test_a_join_to_an_impostor_server_is_refused_before_any_credential_is_sent(k3s, tmp_path, procs, cluster):
    """Another k3s at the server's address (a machine in the middle, another cluster):
    its CA has another hash, so the joining node refuses it with k3s's own message (the
    token's hash, then the server's: pkg/clientaccess/token.go) and never sends its
    token; an agent keeps asking, a server exits."""
    port, token, _ = cluster
    digest = K10.match(token).group(1)
    impostor_root = tmp_path / "impostor"
    evil, impostor = start_server(procs, k3s, impostor_root, yaml.safe_dump(
        {"token": "impostor-pw-1", "cluster-init": True, "agent-token": "agent-only-9b2"}), name="evil")
    impostor_hash = get_json(impostor, "/v1-standin/info")["ca_hash"]
    assert impostor_hash != digest
    expected = f"token CA hash does not match the Cluster CA certificate hash: {digest} != {impostor_hash}"
    write_config(tmp_path / "a", agent_config(impostor, f"K10{digest}::node:agent-only-9b2"))
    agent = run(k3s, "agent", "--node-name", "w-1", root=tmp_path / "a", env={"K3S_STANDIN_JOIN_TIMEOUT": "3"})
    assert agent.returncode == 1 and f'level=error msg="{expected}"' in agent.stderr, agent.stderr
    assert agent.stderr.count(expected) >= 2  # asked again, as a real agent does
    write_config(tmp_path / "s", yaml.safe_dump({"server": f"https://127.0.0.1:{impostor}", "token": token,
                                                "agent-token": "agent-only-9b2"}))
    server = run(k3s, *server_args(free_port(), "cp-9"), root=tmp_path / "s")
    assert server.returncode == 1 and expected in server.stderr, server.stderr
    assert {n["name"] for n in get_json(impostor, "/v1-standin/nodes")["nodes"]} == {"evil"}
    assert "Failed to authenticate" not in evil.log()  # no credential ever reached it


@needs_upstream
def test_agent_gives_up_on_an_unreachable_server(k3s, tmp_path):
    write_config(tmp_path, agent_config(free_port(), PASSWORD))
    proc = run(k3s, "agent", "--node-name", "w", root=tmp_path, env={"K3S_STANDIN_JOIN_TIMEOUT": "2"})
    assert proc.returncode == 1
    assert re.search(r'level=info msg="Waiting to retrieve agent configuration; server is not ready: '
                     r'Get \\"https://127.0.0.1:\d+/cacerts\\": dial tcp 127.0.0.1:\d+: connect: connection refused"',
                     proc.stderr), proc.stderr
    assert "level=fatal" in proc.stderr.splitlines()[-1]


@needs_upstream
def test_second_server_joins_and_shares_the_ca(k3s, tmp_path, procs, cluster):
    port, token, root1 = cluster
    root2 = tmp_path / "s2"
    p2, port2 = start_server(procs, k3s, root2, yaml.safe_dump(
        {"server": f"https://127.0.0.1:{port}", "token": token, "agent-token": "agent-only-9b2"}), name="cp-2")
    assert (root2 / "var/lib/rancher/k3s/server/token").read_text().strip() == token
    assert (root2 / "var/lib/rancher/k3s/server/db/etcd/member").is_dir()
    assert {n["name"] for n in get_json(port, "/v1-standin/nodes")["nodes"]} == {"cp-1", "cp-2"}
    assert {n["name"] for n in get_json(port2, "/v1-standin/nodes")["nodes"]} == {"cp-1", "cp-2"}
    assert get_json(port2, "/v1-standin/info")["ca_hash"] == K10.match(token).group(1)
    # The joined server has the cluster's CAs (bootstrap data) and its own admin certificate
    # from the shared client CA: its k3s.yaml works against it, verified.
    tls1, tls2 = (r / "var/lib/rancher/k3s/server/tls" for r in (root1, root2))
    for name in ("server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key"):
        assert (tls1 / name).read_bytes() == (tls2 / name).read_bytes()
    context = ssl.create_default_context(cadata=(tls2 / "server-ca.crt").read_text())
    context.load_cert_chain(tls2 / "client-admin.crt", tls2 / "client-admin.key")
    with urllib.request.urlopen(f"https://127.0.0.1:{port2}/api/v1/nodes", timeout=5, context=context) as resp:
        assert json.loads(resp.read())["kind"] == "NodeList"


@needs_upstream
def test_joining_server_with_different_critical_config_is_refused(k3s, tmp_path, cluster):
    port, token, _ = cluster
    root = tmp_path / "s3"
    write_config(root, yaml.safe_dump({"server": f"https://127.0.0.1:{port}", "token": token,
                                       "agent-token": "agent-only-9b2", "flannel-backend": "wireguard-native"}))
    proc = run(k3s, *server_args(free_port(), "cp-3"), root=root)
    assert proc.returncode == 1
    assert "critical configuration value mismatch between servers: flannel-backend" in proc.stderr


@needs_upstream
def test_server_cannot_join_a_server_without_etcd(k3s, tmp_path, procs):
    _, port = start_server(procs, k3s, tmp_path / "sqlite", f"token: {PASSWORD}\n")
    write_config(tmp_path / "s2", agent_config(port, PASSWORD))
    proc = run(k3s, *server_args(free_port(), "cp-2"), root=tmp_path / "s2")
    assert proc.returncode == 1 and "cluster-init" in proc.stderr


@needs_upstream
def test_server_serves_tls_like_k3s(k3s, tmp_path, procs):
    """CAs, serving certificate and admin client certificate as k3s makes them
    (k3s-io/k3s pkg/daemons/control/deps/deps.go, pkg/cluster/https.go), and the API
    authenticating by client certificate only."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _, port = start_server(procs, k3s, tmp_path, yaml.safe_dump(
        {"token": PASSWORD, "tls-san": ["api.example.test", "192.0.2.10"]}))
    tls = tmp_path / "var/lib/rancher/k3s/server/tls"
    server_ca = x509.load_pem_x509_certificate((tls / "server-ca.crt").read_bytes())
    client_ca = x509.load_pem_x509_certificate((tls / "client-ca.crt").read_bytes())
    cn = lambda cert: cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value  # noqa: E731
    assert re.fullmatch(r"k3s-server-ca@\d+", cn(server_ca)) and re.fullmatch(r"k3s-client-ca@\d+", cn(client_ca))
    assert server_ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in ("server-ca.key", "client-ca.key", "client-admin.key"):
        assert stat.S_IMODE((tls / key).stat().st_mode) == 0o600 and b"EC PRIVATE KEY" in (tls / key).read_bytes()

    kubeconfig = yaml.safe_load((tmp_path / "etc/rancher/k3s/k3s.yaml").read_text())
    user = kubeconfig["users"][0]["user"]
    admin, chained_ca = x509.load_pem_x509_certificates(base64.b64decode(user["client-certificate-data"]))
    assert chained_ca == client_ca and admin.issuer == client_ca.subject
    assert cn(admin) == "system:admin"
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    assert list(admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]

    # The server verifies as 127.0.0.1 with the CA; its certificate carries k3s's SANs.
    verified = ssl.create_default_context(cadata=(tls / "server-ca.crt").read_text())
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            verified.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        serving = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
    assert cn(serving) == "k3s" and serving.issuer == server_ca.subject
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "cp-1", "api.example.test", "kubernetes.default.svc.cluster.local"} <= set(
        sans.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "::1", "192.0.2.10"} <= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}

    def status(path, context):
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=5, context=context) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    # anonymous-auth=false (pkg/daemons/control/server.go): no certificate, no API
    assert status("/api/v1/nodes", verified) == 401 and status("/version", verified) == 401
    assert status("/ping", verified) == 200 and status("/cacerts", verified) == 200
    with_cert = ssl.create_default_context(cadata=(tls / "server-ca.crt").read_text())
    with_cert.load_cert_chain(tls / "client-admin.crt", tls / "client-admin.key")
    assert status("/api/v1/nodes", with_cert) == 200 and status("/version", with_cert) == 200
    # a client certificate from another CA does not get in
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-subj", "/O=system:masters/CN=system:admin", "-keyout", other / "k",
                    "-out", other / "c", "-days", "1"], check=True, capture_output=True)
    forged = ssl.create_default_context(cadata=(tls / "server-ca.crt").read_text())
    forged.load_cert_chain(other / "c", other / "k")
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        status("/api/v1/nodes", forged)


# --------------------------------------------------------------------------- node footprint


@needs_upstream
@pytest.mark.parametrize("with_nvidia", [True, False])
def test_containerd_config_detects_the_nvidia_runtime(k3s, tmp_path, procs, airgap_dir, with_nvidia):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if with_nvidia:
        runtime = bindir / "nvidia-container-runtime"
        runtime.write_text("#!/bin/sh\nexit 0\n")
        runtime.chmod(0o755)
    images = tmp_path / "var/lib/rancher/k3s/agent/images"
    images.mkdir(parents=True)
    shutil.copy(airgap_dir / "k3s-airgap-images-amd64.tar.zst", images)
    (images / "broken.tar.zst").write_bytes(b"not zstd")
    p, _ = start_server(procs, k3s, tmp_path, f"token: {PASSWORD}\n",
                        env={"PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    data = tmp_path / "var/lib/rancher/k3s"
    text = (data / "agent/etc/containerd/config.toml").read_text()
    config = tomllib.loads(text)
    runtimes = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    cni_dir = config["plugins"]["io.containerd.cri.v1.runtime"]["cni"]["bin_dirs"][0]
    assert cni_dir == str(data / "data/cni") and os.path.isdir(cni_dir)
    assert (data / "data/current").resolve().parent == (data / "data").resolve()
    assert (data / "data/current/bin/containerd-shim-runc-v2").exists()
    if with_nvidia:
        assert runtimes["nvidia"] == {"runtime_type": "io.containerd.runc.v2",
                                      "options": {"BinaryName": str(runtime), "SystemdCgroup": True}}
        assert f'Found nvidia container runtime at {runtime}' in p.log()
    else:
        assert set(runtimes) == {"runc"}
    for path in ("run/k3s/containerd", "run/flannel/subnet.env", "var/lib/kubelet", "var/lib/cni",
                 "etc/rancher/node/password", "var/lib/rancher/k3s/agent/etc/cni/net.d/10-flannel.conflist"):
        assert (tmp_path / path).exists(), path
    log = p.log()
    assert f"Imported images from {images}/k3s-airgap-images-amd64.tar.zst in " in log
    assert f"Error encountered while importing {images}/broken.tar.zst" in log


@needs_upstream
def test_image_lists_are_pulled_before_the_start_or_in_the_background_as_k3s_does(k3s, tmp_path, procs):
    """k3s-io/k3s pkg/agent/containerd/containerd.go: Run pulls every .txt list in agent/images
    before the node goes on (PreloadImages); watcher.go pulls one that lands later, beside
    everything else. Bad lines are logged and skipped (prePullImages)."""
    images = tmp_path / "var/lib/rancher/k3s/agent/images"
    images.mkdir(parents=True)
    (images / "early.txt").write_text("docker.io/example/early:1\n\n   \nNot A Reference!\n")
    env = {"K3S_STANDIN_PULL_SECONDS": "1"}
    p, _ = start_server(procs, k3s, tmp_path, f"token: {PASSWORD}\n", env=env)
    log = p.log()
    # the list's pull came before the start went on
    assert log.index("Pulling image docker.io/example/early:1") < log.index("k3s is up and running")
    assert f"Pulling images from {images}/early.txt" in log
    assert 'Failed to parse image reference \\"Not A Reference!\\": could not parse reference: Not A Reference!' in log
    assert log.count("Pulling image ") == 1  # blank lines skipped
    # a list written while k3s runs: pulled in the background, one image after the other
    (images / "later.txt.part").write_text("docker.io/example/early:1\nghcr.io/example/a:2\nregistry.k8s.io/b:3\n")
    os.rename(images / "later.txt.part", images / "later.txt")
    pulls = tmp_path / "var/lib/rancher/k3s/agent/containerd/standin-pulls.log"
    deadline = time.monotonic() + 20
    while f"Imported images from {images}/later.txt in " not in p.log():
        assert time.monotonic() < deadline, p.log()
        time.sleep(0.2)
    log = p.log()
    assert "Image docker.io/example/early:1 has already been pulled" in log
    assert [line.split()[1] for line in pulls.read_text().splitlines()] == [
        "docker.io/example/early:1", "ghcr.io/example/a:2", "registry.k8s.io/b:3"]
    listed = run(k3s, "crictl", "images", root=tmp_path).stdout
    assert "ghcr.io/example/a" in listed and "registry.k8s.io/b" in listed
    assert "later.txt.part" not in log  # a name the watcher does not take


# --------------------------------------------------------------------------- snapshots and restore


@needs_upstream
def test_snapshot_and_restore_onto_a_new_host(k3s, tmp_path, procs, cluster):
    port, token, root1 = cluster
    a = tmp_path / "a1"
    write_config(a, agent_config(port, "agent-only-9b2"))
    start(procs, k3s, ["agent", "--node-name", "gpu-1"], a)
    proc = run(k3s, "etcd-snapshot", "save", "--name", "before-upgrade", "--node-name", "cp-1", root=root1)
    assert proc.returncode == 0, proc.stderr
    name = re.search(r'msg="Snapshot (before-upgrade-cp-1-\d+) saved\."', proc.stderr).group(1)
    listing = run(k3s, "etcd-snapshot", "ls", root=root1).stdout
    snapshot = root1 / "var/lib/rancher/k3s/server/db/snapshots" / name
    assert name in listing and str(snapshot) in listing
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600 and PASSWORD not in snapshot.read_text()

    new_host = tmp_path / "new"
    restore = ["server", "--cluster-reset", f"--cluster-reset-restore-path={snapshot}"]
    proc = run(k3s, *restore, "--token", "wrong-token", root=new_host)
    assert proc.returncode == 1 and "different token" in proc.stderr
    proc = run(k3s, *restore, "--token", token, root=new_host)
    assert proc.returncode == 0, proc.stderr
    assert "Managed etcd cluster membership has been reset, restart without --cluster-reset flag now." in proc.stderr
    assert (new_host / "var/lib/rancher/k3s/server/token").read_text().strip() == token
    write_config(new_host, f"token: {token}\n")
    _, port2 = start_server(procs, k3s, new_host)
    assert {n["name"] for n in get_json(port2, "/v1-standin/nodes")["nodes"]} == {"cp-1", "gpu-1"}


@needs_upstream
def test_snapshot_needs_etcd(k3s, tmp_path, procs):
    p, _ = start_server(procs, k3s, tmp_path, f"token: {PASSWORD}\n")
    p.stop()
    proc = run(k3s, "etcd-snapshot", "save", root=tmp_path)
    assert proc.returncode == 1 and "etcd database not found" in proc.stderr


# --------------------------------------------------------------------------- versions


@needs_upstream
def test_version_guard_refuses_downgrades_and_skipped_minors(k3s, tmp_path, procs):
    builds = {v: airgap.build_airgap(tmp_path / v, v) / "k3s" for v in ("v1.34.1+k3s1", "v1.36.0+k3s1")}
    root = tmp_path / "host"
    p, _ = start_server(procs, k3s, root, f"token: {PASSWORD}\n")  # v1.33.5
    p.stop()
    proc = run(builds["v1.36.0+k3s1"], *server_args(free_port()), root=root)
    assert proc.returncode == 1 and "skips a minor version" in proc.stderr
    p, _ = start_server(procs, builds["v1.34.1+k3s1"], root)
    assert "Upgrading data dir from k3s v1.33.5+k3s1 to v1.34.1+k3s1" in p.stop()
    data = root / "var/lib/rancher/k3s/data"
    assert (data / "previous").resolve() != (data / "current").resolve()
    proc = run(k3s, *server_args(free_port()), root=root)
    assert proc.returncode == 1 and "downgrades are not supported" in proc.stderr


# --------------------------------------------------------------------------- on test hosts
