"""The real kubectl and Helm against the stand-in API, through k3s.yaml as k3s writes it
(HTTPS, the server CA, the system:admin client certificate): what a user runs after
`bootstrap kubeconfig --merge`. Sandboxed (tests/sandbox.py); the host tests run the same
clients through the tool's tunnel and merged kubeconfig (tests/hosts/test_kubectl_hosts.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "standins"))
import airgap  # noqa: E402

from labcharts import user_manifest  # noqa: E402
from sandbox import cluster, k3s  # noqa: E402,F401

needs_upstream = pytest.mark.skipif(airgap.upstream_missing() is not None, reason=airgap.upstream_missing() or "")
KUBECTL, HELM = shutil.which("kubectl"), shutil.which("helm")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH (.ci/run installs it)")
needs_helm = pytest.mark.skipif(HELM is None, reason="helm is not on PATH (.ci/run installs it)")


def run(kubeconfig: Path, *argv: str, check=True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "HELM_"))}
    env.update(KUBECONFIG=str(kubeconfig), HELM_CACHE_HOME=str(kubeconfig.parent / "helm-cache"),
               HELM_CONFIG_HOME=str(kubeconfig.parent / "helm-config"), HOME=str(kubeconfig.parent))
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr}"
    return proc


def make_chart(folder: Path, name: str, version: str, replicas: int = 1) -> Path:
    """A small chart with the component's name: a ConfigMap and a Deployment."""
    chart = folder / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": name, "version": version}))
    (chart / "values.yaml").write_text(yaml.safe_dump({"replicas": replicas}))
    (chart / "templates/all.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n"
        "  replicas: \"{{ .Values.replicas }}\"\n---\n"
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n"
        "  replicas: {{ .Values.replicas }}\n  selector:\n    matchLabels: {app: {{ .Release.Name }}}\n"
        "  template:\n    metadata:\n      labels: {app: {{ .Release.Name }}}\n    spec:\n"
        "      containers: [{name: main, image: \"registry.example/%s:%s\"}]\n" % (name, version))
    out = subprocess.run([HELM, "package", str(chart), "-d", str(folder)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return folder / f"{name}-{version}.tgz"


@needs_upstream
@needs_kubectl
def test_kubectl_gets_nodes_and_pods_creates_and_applies(cluster, tmp_path):
    cluster.server()
    cluster.agent("gpu-1", gpus=1)
    cluster.wait_ready("cp-1", "gpu-1")
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"
    nodes = run(kubeconfig, KUBECTL, "get", "nodes").stdout.splitlines()
    assert nodes[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    rows = {line.split()[0]: line.split() for line in nodes[1:]}
    assert rows["cp-1"][1:3] == ["Ready", "control-plane,etcd,master"] and rows["cp-1"][-1] == "v1.33.5+k3s1"
    assert rows["gpu-1"][1:3] == ["Ready", "<none>"]
    # kubectl create sends protobuf (client-go's typed client)
    run(kubeconfig, KUBECTL, "create", "namespace", "team-a")
    assert cluster.core.read_namespace("team-a").metadata.name == "team-a"
    manifest = tmp_path / "app.yaml"
    manifest.write_text(user_manifest("team-a"))
    assert "configmap/settings created" in run(kubeconfig, KUBECTL, "apply", "-f", str(manifest)).stdout
    manifest.write_text(user_manifest("team-a", "two"))
    assert "configmap/settings configured" in run(kubeconfig, KUBECTL, "apply", "-f", str(manifest)).stdout
    assert cluster.core.read_namespaced_config_map("settings", "team-a").data == {"mode": "two"}
    pods = run(kubeconfig, KUBECTL, "get", "pods", "-A").stdout.splitlines()
    assert pods[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert any(line.split()[:2] == ["team-a", "hello"] for line in pods[1:])
    # a bearer token instead of the client certificate is refused, as k3s refuses it
    anonymous = yaml.safe_load(kubeconfig.read_text())
    anonymous["users"][0]["user"] = {"token": "standin-admin.not-a-credential"}
    (tmp_path / "anon.yaml").write_text(yaml.safe_dump(anonymous))
    refused = run(tmp_path / "anon.yaml", KUBECTL, "get", "nodes", check=False)
    assert refused.returncode != 0 and "You must be logged in to the server" in refused.stderr


@needs_upstream
@needs_helm
def test_helm_installs_upgrades_reports_and_uninstalls(cluster, tmp_path):
    cluster.server()
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"
    archive = make_chart(tmp_path, "gpu-operator", "v26.7.0")
    install = run(kubeconfig, HELM, "upgrade", "--install", "gpu-operator", str(archive), "--namespace",
                  "gpu-operator", "--create-namespace", "--wait", "--timeout", "60s")
    assert "STATUS: deployed" in install.stdout
    status = json.loads(run(kubeconfig, HELM, "status", "gpu-operator", "-n", "gpu-operator", "-o", "json").stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 1)
    # Helm keeps releases in Secrets it finds by label (owner=helm)
    (secret,) = cluster.core.list_namespaced_secret("gpu-operator", label_selector="owner=helm,name=gpu-operator").items
    assert secret.type == "helm.sh/release.v1" and secret.metadata.labels["status"] == "deployed"
    assert cluster.core.read_namespaced_config_map("gpu-operator-config", "gpu-operator").data == {"replicas": "1"}
    run(kubeconfig, HELM, "upgrade", "--install", "gpu-operator", str(archive), "--namespace", "gpu-operator",
        "--set", "replicas=2", "--wait", "--timeout", "60s")
    status = json.loads(run(kubeconfig, HELM, "status", "gpu-operator", "-n", "gpu-operator", "-o", "json").stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)
    assert cluster.core.read_namespaced_config_map("gpu-operator-config", "gpu-operator").data == {"replicas": "2"}
    run(kubeconfig, HELM, "uninstall", "gpu-operator", "-n", "gpu-operator", "--wait")
    assert cluster.core.list_namespaced_secret("gpu-operator", label_selector="owner=helm").items == []
    assert cluster.core.list_namespaced_config_map("gpu-operator").items == [] or all(
        c.metadata.name == "kube-root-ca.crt" for c in cluster.core.list_namespaced_config_map("gpu-operator").items)
    missing = run(kubeconfig, HELM, "status", "gpu-operator", "-n", "gpu-operator", check=False)
    assert missing.returncode != 0 and "release: not found" in missing.stderr


@needs_upstream
@needs_helm
def test_the_tools_install_of_a_new_release_and_its_fall_back_to_an_upgrade(cluster, tmp_path, monkeypatch):
    """The real Helm through the tool's own calls: a release the tool never applied is
    `helm install`ed (Helm 4: server-side apply, no OpenAPI reads); when Helm has it after
    all, Helm's own "name in use" answer turns it into an upgrade (revision 2)."""
    from bootstrap.cluster import helm as tool_helm
    from bootstrap.cluster.components.release import Release

    cluster.server()
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"
    archive = make_chart(tmp_path, "volcano", "1.12.2")
    release = Release(name="volcano", chart="volcano", repo="", version="1.12.2", namespace="volcano-system",
                      values={"replicas": 1}, archive=str(archive))
    for key in ("HOME", "HELM_CACHE_HOME", "HELM_CONFIG_HOME"):
        monkeypatch.setenv(key, str(tmp_path / key.lower()))
    monkeypatch.setenv("BOOTSTRAP_HELM", HELM)
    version = tool_helm.check_version()
    tool_helm.upgrade_install(release, kubeconfig, timeout=60, new_with=version)
    tool_helm.upgrade_install(release, kubeconfig, timeout=60, new_with=version)  # a record lost
    status = json.loads(run(kubeconfig, HELM, "status", "volcano", "-n", "volcano-system", "-o", "json").stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 2)


def leave_pending(cluster, name: str, namespace: str, revision: int, status: str, deployed: int | None = None):
    """What a Helm killed mid-operation leaves: its release Secret (helm/helm pkg/storage/driver/
    secrets.go: data.release is base64 of gzipped JSON, labelled with the status) marked
    pending, its time long past; an upgrade's previous revision still `deployed`."""
    import base64
    import gzip

    for secret in cluster.core.list_namespaced_secret(namespace, label_selector=f"owner=helm,name={name}").items:
        rev = int(secret.metadata.labels["version"])
        mark = status if rev == revision else "deployed" if rev == deployed else None
        if mark is None:
            continue
        release = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secret.data["release"]))))
        release["info"]["status"] = mark
        if rev == revision:
            release["info"]["last_deployed"] = "2026-01-01T00:00:00Z"
        packed = base64.b64encode(gzip.compress(json.dumps(release).encode())).decode()
        secret.data["release"] = base64.b64encode(packed.encode()).decode()
        secret.metadata.labels["status"] = mark
        cluster.core.replace_namespaced_secret(secret.metadata.name, namespace, secret)


@needs_upstream
@needs_helm
def test_the_real_helm_refuses_a_pending_release_and_the_tool_recovers_it(cluster, tmp_path, monkeypatch):
    """Helm's own words for a pending release, its history JSON and its rollback and
    uninstall flags, as bootstrap.cluster.helm reads and uses them: a pending upgrade is
    rolled back to the revision still deployed and upgraded; a pending install never
    deployed is uninstalled and installed again."""
    from bootstrap.cluster import helm as tool_helm
    from bootstrap.cluster.components.release import Release

    cluster.server()
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"
    for key in ("HOME", "HELM_CACHE_HOME", "HELM_CONFIG_HOME"):
        monkeypatch.setenv(key, str(tmp_path / key.lower()))
    monkeypatch.setenv("BOOTSTRAP_HELM", HELM)
    version = tool_helm.check_version()
    archive = make_chart(tmp_path, "volcano", "1.12.2")
    release = Release(name="volcano", chart="volcano", repo="", version="1.12.2", namespace="volcano-system",
                      values={"replicas": 1}, archive=str(archive))
    tool_helm.upgrade_install(release, kubeconfig, timeout=60, new_with=version)
    tool_helm.upgrade_install(release, kubeconfig, timeout=60, version=version)  # revision 2
    leave_pending(cluster, "volcano", "volcano-system", 2, "pending-upgrade", deployed=1)
    said = []
    tool_helm.upgrade_install(release, kubeconfig, timeout=60, version=version, say=said.append)
    assert said and "pending-upgrade at revision 2" in said[0] and "rolled back to revision 1" in said[0]
    history = json.loads(run(kubeconfig, HELM, "history", "volcano", "-n", "volcano-system", "-o", "json").stdout)
    assert [h["status"] for h in history][-2:] == ["superseded", "deployed"] and history[-1]["revision"] == 4

    nfs = make_chart(tmp_path, "csi-driver-nfs", "4.13.4")
    fresh = Release(name="csi-driver-nfs", chart="csi-driver-nfs", repo="", version="4.13.4",
                    namespace="kube-system", values={}, archive=str(nfs))
    tool_helm.upgrade_install(fresh, kubeconfig, timeout=60, new_with=version)
    leave_pending(cluster, "csi-driver-nfs", "kube-system", 1, "pending-install")
    said.clear()
    tool_helm.upgrade_install(fresh, kubeconfig, timeout=60, new_with=version, say=said.append)
    assert said and "never deployed" in said[0]
    status = json.loads(run(kubeconfig, HELM, "status", "csi-driver-nfs", "-n", "kube-system", "-o", "json").stdout)
    assert (status["info"]["status"], status["version"]) == ("deployed", 1)


# What kubectl 1.33 sent for `kubectl create namespace foo` (captured from the stand-in).
KUBECTL_NAMESPACE_BODY = (b'k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x1b\n\x13\n\x03foo\x12\x00\x1a\x00"\x00*\x00'
                          b'2\x008\x00B\x00\x12\x00\x1a\x02\n\x00\x1a\x00"\x00')


def test_protobuf_bodies_decode_and_other_kinds_are_refused():
    kubeapi = _kubeapi()
    assert kubeapi.decode_protobuf(KUBECTL_NAMESPACE_BODY) == {"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": "foo"}}
    pod = KUBECTL_NAMESPACE_BODY.replace(b"\x0f\n\x02v1\x12\tNamespace", b"\t\n\x02v1\x12\x03Pod")
    with pytest.raises(kubeapi.ApiError) as refused:
        kubeapi.decode_protobuf(pod)
    assert refused.value.code == 415
    with pytest.raises(kubeapi.ApiError) as garbled:
        kubeapi.decode_protobuf(b"k8s\x00\n\xff")
    assert garbled.value.code == 400


def _kubeapi():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kubeapi_for_test", TESTS / "standins/kubeapi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


@needs_upstream
@needs_kubectl
def test_discovery_is_aggregated_as_a_real_api_server_serves_it(cluster, tmp_path):
    """kubectl (client-go) asks /api and /apis for aggregated discovery first and gets every
    resource in those two answers, as from kube-apiserver 1.30: no request per group-version
    (kubernetes staging/src/k8s.io/client-go/discovery/discovery_client.go). The aggregated
    answer says what the per-group-version documents say."""
    cluster.server()
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"
    listed = run(kubeconfig, KUBECTL, "api-resources", "-v=6")
    # -v=6 logs each response: ... "Response" verb="GET" url="https://127.0.0.1:PORT/apis?timeout=32s" ...
    paths = [urllib.parse.urlparse(m).path for m in re.findall(r'verb="GET" url="([^"]+)"', listed.stderr)]
    assert paths == ["/api", "/apis"], listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows["deployments"][:4] == ["deployments", "deploy", "apps/v1", "true"] and "pods" in rows
    status, text = cluster.raw("GET", "/apis", headers={"Accept": AGGREGATED_V2 + ",application/json"})
    aggregated = json.loads(text)
    assert status == 200 and aggregated["kind"] == "APIGroupDiscoveryList"
    apps = next(i for i in aggregated["items"] if i["metadata"]["name"] == "apps")
    (v1,) = [v for v in apps["versions"] if v["version"] == "v1"]
    deployments = next(r for r in v1["resources"] if r["resource"] == "deployments")
    assert deployments["scope"] == "Namespaced" and deployments["responseKind"]["kind"] == "Deployment"
    legacy = json.loads(cluster.raw("GET", "/apis/apps/v1")[1])
    assert {r["resource"] for r in v1["resources"]} | {f"{r['resource']}/{s['subresource']}" for r in v1["resources"]
                                                      for s in r.get("subresources", [])} == \
        {r["name"] for r in legacy["resources"]}
    assert json.loads(cluster.raw("GET", "/apis")[1])["kind"] == "APIGroupList"  # a plain JSON client: as before


@needs_upstream
@needs_kubectl
@needs_helm
def test_go_clients_speak_http2_with_every_request_a_stream_of_one_connection(cluster, tmp_path):
    """kube-apiserver offers ALPN h2 (h2serve.py): kubectl and Helm (Go's net/http, whose
    GODEBUG=http2debug=1 logs its HTTP/2 frames) send their requests, Helm's watches with them,
    as streams of HTTP/2 connections: more answers than connections."""
    cluster.server()
    kubeconfig = cluster.root / "etc/rancher/k3s/k3s.yaml"

    def answers_and_connections(*argv):
        got = run(kubeconfig, "env", "GODEBUG=http2debug=1", *argv)
        answers = re.findall(r"http2: Transport received HEADERS flags=\S+ stream=(\d+)", got.stderr)
        return got, len(answers), got.stderr.count("http2: Transport creating client conn")

    got, answers, conns = answers_and_connections(KUBECTL, "get", "nodes", "-o", "name")
    assert got.stdout.strip() == "node/cp-1", got.stderr[-3000:]
    # discovery (/api, /apis) and the list; kubectl's discovery client has a transport of its own
    assert conns <= 2 and answers >= 3, got.stderr[-3000:]
    chart = make_chart(tmp_path, "h2demo", "0.1.0")
    got, answers, conns = answers_and_connections(HELM, "install", "h2demo", str(chart), "--wait", "--timeout", "60s")
    assert "STATUS: deployed" in got.stdout, got.stderr[-3000:]
    assert conns >= 1 and answers > 3 * conns, got.stderr[-3000:]
