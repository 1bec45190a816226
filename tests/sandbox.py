"""A sandboxed k3s stand-in cluster on this machine (K3S_STANDIN_ROOT, free ports on
127.0.0.1, short simulator timings), driven by the official `kubernetes` client: for the
stand-in's own tests (standin_tests/test_kubeapi.py) and for in-process flow tests that
need an API (unit/test_cluster_side_flow.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))
import airgap  # noqa: E402

kubernetes = pytest.importorskip("kubernetes", reason="the official kubernetes client (pip install "
                                 "'kubernetes>=33,<37') drives the stand-in API")
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

VERSION = "v1.33.5+k3s1"
TOKEN = "ka-Secret-3c9e"
FAST = {"K3S_STANDIN_NODE_GRACE": "3", "K3S_STANDIN_HEARTBEAT": "0.5", "K3S_STANDIN_NODE_READY_SECONDS": "0.3",
        "K3S_STANDIN_POD_SECONDS": "0.3", "K3S_STANDIN_POD_START_SECONDS": "0.1", "K3S_STANDIN_MIG_SECONDS": "0.5"}
# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def k3s(tmp_path_factory) -> Path:
    if airgap.upstream_missing():
        pytest.skip(airgap.upstream_missing())
    return airgap.build_airgap(tmp_path_factory.mktemp("airgap"), VERSION) / "k3s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, check, timeout=15.0, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except ApiException as exc:
            last = exc
            if exc.status != 404:
                raise
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Proc:
    """A stand-in process in the background; its log in a file."""

    def __init__(self, k3s: Path, args, root: Path, env: dict | None = None):
        self.root = root
        self.logfile = tempfile.NamedTemporaryFile("w+", prefix="k3s-", suffix=".log", delete=False)
        full = {k: v for k, v in os.environ.items() if not k.startswith(("K3S_", "NOTIFY_SOCKET"))}
        full.update(FAST, K3S_STANDIN_ROOT=str(root), **(env or {}))
        self.proc = subprocess.Popen([sys.executable, str(k3s)] + list(args), stdout=self.logfile,
                                     stderr=subprocess.STDOUT, env=full)

    def log(self) -> str:
        self.logfile.flush()
        return Path(self.logfile.name).read_text()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log()


class Cluster:
    """A sandboxed stand-in server (and agents) with an official-client connection."""

    def __init__(self, k3s: Path, base: Path):
        self.k3s, self.base, self.procs, self.port = k3s, base, [], None

    def server(self, config_text: str = "", env=None, name="cp-1", root=None):
        root = root or self.base / name
        cfg = root / "etc/rancher/k3s/config.yaml"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(f"token: {TOKEN}\ncluster-init: true\n" + config_text)
        self.port = free_port()
        p = Proc(self.k3s, ["server", "--https-listen-port", str(self.port), "--bind-address", "127.0.0.1",
                            "--node-name", name], root, env)
        self.procs.append(p)
        self.root = root
        kubeconfig = self.kubeconfig = root / "etc/rancher/k3s/k3s.yaml"
        wait("the server's API", lambda: kubeconfig.exists() and self._ping(), 20)
        self.connect(kubeconfig)
        return p

    def _ping(self):
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/ping", timeout=2,
                                        context=self.tls(self.kubeconfig, client=False)) as resp:
                return resp.read() == b"pong"
        except (OSError, ValueError, KeyError):
            return False

    def tls(self, kubeconfig: Path, client: bool = True) -> ssl.SSLContext:
        """TLS as the kubeconfig says: its CA verifies the server (127.0.0.1 is in its SANs);
        its client certificate, unless `client` is False."""
        user = yaml.safe_load(kubeconfig.read_text())
        ca = base64.b64decode(user["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
        if client:
            creds = user["users"][0]["user"]
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                cert.write_bytes(base64.b64decode(creds["client-certificate-data"]))
                key.write_bytes(base64.b64decode(creds["client-key-data"]))
                context.load_cert_chain(cert, key)
        return context

    def connect(self, kubeconfig: Path):
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        self.api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.storage = client.StorageV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)

    def agent(self, name, gpus: int = 0, labels=(), taints=(), rdma=None, env=None, toolkit=True,
              default_runtime="nvidia"):
        root = self.base / name
        cfg = root / "etc/rancher/k3s/config.yaml"
        cfg.parent.mkdir(parents=True, exist_ok=True)
        config = {"server": f"https://127.0.0.1:{self.port}", "token": TOKEN,
                  "node-label": list(labels), "node-taint": list(taints)}
        path = os.environ.get("PATH", "")
        if gpus:
            bindir = root / "fakebin"
            bindir.mkdir(parents=True, exist_ok=True)
            # As the tool sets up a GPU node with the host's toolkit: the runtime on the PATH
            # (k3s finds it) and the default.
            if toolkit:
                (bindir / "nvidia-container-runtime").write_text("#!/bin/sh\nexec runc \"$@\"\n")
                (bindir / "nvidia-container-runtime").chmod(0o755)
            if default_runtime:
                config["default-runtime"] = default_runtime
            lines = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-0cb55614-f19b-b5ec-e96f-134d60bf42{i:02d})\\n"
                            for i in range(gpus))
            (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
            (bindir / "nvidia-smi").chmod(0o755)
            path = f"{bindir}:{path}"
        cfg.write_text(yaml.safe_dump(config))
        if rdma:
            (root / "etc/bootstrap-standin").mkdir(parents=True, exist_ok=True)
            (root / "etc/bootstrap-standin/infiniband.json").write_text(json.dumps(rdma))
        p = Proc(self.k3s, ["agent", "--node-name", name], root, dict(env or {}, PATH=path))
        self.procs.append(p)
        return p

    def node(self, name):
        return self.core.read_node(name)

    def ready(self, name):
        try:
            node = self.node(name)
        except ApiException:
            return None
        return next((c.status for c in node.status.conditions if c.type == "Ready"), None)

    def wait_ready(self, *names, timeout=20):
        for name in names:
            wait(f"node {name} Ready", lambda: self.ready(name) == "True", timeout)

    def raw(self, method, path, body=None, content_type="application/json", auth=True, headers=None):
        """(status, text) of one request, as the tool's raw client sends it; `auth` False:
        TLS without the client certificate."""
        headers = {"Content-Type": content_type, "Accept": "application/json", **(headers or {})}
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", data=data, method=method, headers=headers)
        context = self.tls(self.kubeconfig, client=auth)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def log(self, pod, ns="default", **kw):
        resp = self.core.read_namespaced_pod_log(pod, ns, _preload_content=False, **kw)
        return resp.data.decode()

    def pod_done(self, name, ns="default", timeout=15):
        return wait(f"pod {name} to finish", lambda: (lambda p: p if p.status.phase in ("Succeeded", "Failed")
                                                      else None)(self.core.read_namespaced_pod(name, ns)), timeout)

    def stop(self):
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def cluster(k3s, tmp_path):
    c = Cluster(k3s, tmp_path)
    yield c
    c.stop()
    for p in c.procs:  # the simulator logs what went wrong in its thread instead of dying
        assert "kubeapi simulator:" not in p.log(), p.log()
