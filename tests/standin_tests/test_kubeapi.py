"""The stand-in Kubernetes API server and cluster simulator (tests/standins/kubeapi.py),
served by the built k3s stand-in on its supervisor port and driven by the official
`kubernetes` Python client, as the tool drives a real cluster.

Fast tests run the built stand-in on this machine in a sandbox (K3S_STANDIN_ROOT, free
ports on 127.0.0.1) with short simulator timings; tests/hosts/test_kubeapi_hosts.py runs it on two
test hosts under systemd and reaches the API through an SSH local port forward.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "standins"))
import airgap  # noqa: E402

kubernetes = pytest.importorskip("kubernetes", reason="the official kubernetes client (pip install "
                                 "'kubernetes>=33,<37') drives the stand-in API")
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

TS4 = "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    renameByDefault: false\n" \
      "    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"

needs_upstream = pytest.mark.skipif(airgap.upstream_missing() is not None, reason=airgap.upstream_missing() or "")

from sandbox import FAST, TOKEN, VERSION, Cluster, Proc, cluster, free_port, k3s, wait  # noqa: E402,F401


def pod(name, image="busybox:1.36", command=None, resources=None, **spec):
    container = {"name": "main", "image": image}
    if command:
        container["command"] = command
    if resources:
        container["resources"] = {"limits": resources}
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


# --------------------------------------------------------------------------- connection and API surface


@needs_upstream
def test_kubeconfig_is_https_with_a_client_certificate_and_the_api_checks_it(cluster):
    cluster.server()
    kubeconfig = yaml.safe_load((cluster.root / "etc/rancher/k3s/k3s.yaml").read_text())
    (entry,) = kubeconfig["clusters"]
    assert entry["cluster"]["server"] == f"https://127.0.0.1:{cluster.port}"
    assert set(entry["cluster"]) == {"server", "certificate-authority-data"}
    assert set(kubeconfig["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}
    # TLS without the client certificate: 401 everywhere, /version too (anonymous-auth=false)
    for path in ("/api/v1/nodes", "/version", "/apis", "/healthz"):
        status, body = cluster.raw("GET", path, auth=False)
        assert status == 401 and json.loads(body)["reason"] == "Unauthorized", path
    status, body = cluster.raw("GET", "/api/v1/nodes", auth=False, headers={"Authorization": "Bearer anything"})
    assert status == 401
    status, body = cluster.raw("GET", "/version")
    assert status == 200 and json.loads(body)["gitVersion"] == VERSION
    assert client.VersionApi(cluster.api).get_code().minor == "33"
    # discovery knows the built-in groups, k3s's CRDs and the add-on presets
    groups = {g.name for g in client.ApisApi(cluster.api).get_api_versions().groups}
    assert {"apps", "batch", "storage.k8s.io", "helm.cattle.io", "batch.volcano.sh", "scheduling.volcano.sh",
            "k8s.cni.cncf.io", "nvidia.com"} <= groups
    resources = {r.name for r in cluster.core.get_api_resources().resources}
    assert {"pods", "pods/log", "pods/status", "pods/eviction", "nodes", "configmaps", "secrets"} <= resources
    # k3s's own objects
    assert {n.metadata.name for n in cluster.core.list_namespace().items} >= {
        "default", "kube-system", "kube-public", "kube-node-lease"}
    (sc,) = cluster.storage.list_storage_class().items
    assert (sc.metadata.name, sc.provisioner, sc.volume_binding_mode) == (
        "local-path", "rancher.io/local-path", "WaitForFirstConsumer")
    assert sc.metadata.annotations["storageclass.kubernetes.io/is-default-class"] == "true"
    assert "nvidia" in {r.metadata.name for r in client.NodeV1Api(cluster.api).list_runtime_class().items}
    assert client.AppsV1Api(cluster.api).read_namespaced_deployment("coredns", "kube-system").status.ready_replicas == 1
    assert cluster.core.read_namespaced_service_account("default", "kube-system").metadata.name == "default"


@needs_upstream
def test_config_disabling_local_storage_drops_the_class(cluster):
    cluster.server("disable:\n- local-storage\n- traefik\n")
    assert cluster.storage.list_storage_class().items == []
    names = {d.metadata.name for d in client.AppsV1Api(cluster.api).list_namespaced_deployment("kube-system").items}
    assert "traefik" not in names and "coredns" in names


@needs_upstream
def test_crud_patches_selectors_and_real_error_replies(cluster):
    cluster.server()
    core = cluster.core
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "cfg", "labels": {"app": "a"}},
                                                            "data": {"k": "v"}})
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    core.create_namespaced_config_map("default", {"metadata": {"name": "other", "labels": {"app": "b"}}})
    names = lambda sel: sorted(c.metadata.name for c in core.list_namespaced_config_map("default", label_selector=sel).items)  # noqa: E731
    assert names("app=a") == ["cfg"]
    assert names("app in (a,b)") == ["cfg", "other"]
    assert names("app!=a") == ["kube-root-ca.crt", "other"]
    assert names("!app") == ["kube-root-ca.crt"]
    assert [c.metadata.name for c in core.list_config_map_for_all_namespaces(
        field_selector="metadata.name=cfg").items] == ["cfg"]
    # the three patch types the client sends
    core.patch_namespaced_config_map("cfg", "default", {"metadata": {"labels": {"tier": "x"}}, "data": {"k2": "v2"}})
    core.patch_namespaced_config_map("cfg", "default", [{"op": "remove", "path": "/metadata/labels/tier"}])
    status, _ = cluster.raw("PATCH", "/api/v1/namespaces/default/configmaps/cfg", {"data": {"k": None}},
                            "application/merge-patch+json")
    assert status == 200
    got = core.read_namespaced_config_map("cfg", "default")
    assert got.data == {"k2": "v2"} and got.metadata.labels == {"app": "a"}
    # optimistic concurrency, conflicts, validation
    stale = created.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("cfg", "default", {"metadata": {"name": "cfg", "resourceVersion": stale},
                                                              "data": {}})
    assert exc.value.status == 409 and "the object has been modified" in json.loads(exc.value.body)["message"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", {"metadata": {"name": "Bad_Name"}})
    assert exc.value.status == 422 and "RFC 1123 subdomain" in json.loads(exc.value.body)["message"]
    status, body = cluster.raw("POST", "/api/v1/namespaces/default/configmaps",
                               {"metadata": {"name": "n"}, "data": {"count": 3}})
    assert status == 400 and "cannot unmarshal" in json.loads(body)["message"]
    with pytest.raises(ApiException) as exc:
        core.patch_node("cp-1", {"metadata": {"labels": {"gpu": "NVIDIA H200"}}})
    assert exc.value.status == 422 and "a valid label must be" in json.loads(exc.value.body)["message"]
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("missing-ns", {"metadata": {"name": "x"}})
    assert exc.value.status == 404 and json.loads(exc.value.body)["message"] == 'namespaces "missing-ns" not found'
    # delete, then 404 with the API server's message
    assert core.delete_namespaced_config_map("cfg", "default").status == "Success"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("cfg", "default")
    assert exc.value.status == 404 and json.loads(exc.value.body)["message"] == 'configmaps "cfg" not found'
    # secrets: stringData becomes base64 data
    core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"pw": "hunter2"}})
    assert base64.b64decode(core.read_namespaced_secret("s", "default").data["pw"]) == b"hunter2"
    # server-side apply creates, then updates
    for value in ("1", "2"):
        status, body = cluster.raw("PATCH", "/api/v1/namespaces/default/configmaps/applied?fieldManager=t",
                                   {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"},
                                    "data": {"v": value}}, "application/apply-patch+yaml")
        assert status in (200, 201), body
    assert core.read_namespaced_config_map("applied", "default").data == {"v": "2"}


@needs_upstream
def test_watch_streams_changes(cluster):
    cluster.server()
    seen = []

    def make():
        time.sleep(0.5)
        cluster.core.create_namespaced_config_map("default", {"metadata": {"name": "watched"}})
        cluster.core.delete_namespaced_config_map("watched", "default")

    threading.Thread(target=make, daemon=True).start()
    w = watch.Watch()
    t0 = time.monotonic()
    for event in w.stream(cluster.core.list_namespaced_config_map, "default", timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    assert ("ADDED", "kube-root-ca.crt") in seen  # the current objects first
    assert seen[-2:] == [("ADDED", "watched"), ("DELETED", "watched")]
    assert time.monotonic() - t0 < 4  # events arrive as they happen, not at the end of the stream
    # a resourceVersion from long ago: 410 Gone, as the real API server says it
    status, body = cluster.raw("GET", "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1"
                                      "&timeoutSeconds=1")
    assert status == 200


@needs_upstream
def test_connections_stay_open_across_requests_watches_and_bodies_until_the_client_closes(cluster):
    """HTTP/1.1 keep-alive as kube-apiserver's Go server: requests share one TLS connection
    (through the tool's tunnel one SSH channel and one handshake, not one per request)."""
    import http.client

    cluster.server()
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.port, timeout=10, context=cluster.tls(cluster.kubeconfig))

    def ask(method, path, body=None, headers=None):
        conn.request(method, path, body=body, headers={"Accept": "application/json", **(headers or {})},
                     encode_chunked="Transfer-Encoding" in (headers or {}))
        resp = conn.getresponse()
        return resp, resp.read()

    resp, body = ask("GET", "/version")
    assert resp.status == 200 and resp.version == 11 and json.loads(body)["gitVersion"] == VERSION
    first = conn.sock
    assert first is not None  # not closed after the answer
    # a body in chunks (Go sends them when it does not know the length), then one by length
    chunks = iter([json.dumps({"metadata": {"name": "chunked"}}).encode()])
    resp, body = ask("POST", "/api/v1/namespaces/default/configmaps", body=chunks,
                     headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    assert resp.status == 201, body
    resp, body = ask("POST", "/api/v1/namespaces/default/configmaps", body=json.dumps({"metadata": {"name": "sized"}}),
                     headers={"Content-Type": "application/json"})
    assert resp.status == 201, body
    # an error answer and a watch that runs out keep the connection too
    resp, body = ask("GET", "/api/v1/namespaces/default/configmaps/missing")
    assert resp.status == 404 and json.loads(body)["reason"] == "NotFound"
    resp, body = ask("GET", "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1")
    assert resp.status == 200 and {json.loads(line)["object"]["metadata"]["name"] for line in body.splitlines()} >= {
        "chunked", "sized"}
    resp, body = ask("GET", "/api/v1/namespaces/default/configmaps/sized")
    assert resp.status == 200 and conn.sock is first
    # the client's Connection: close ends it
    resp, body = ask("GET", "/version", headers={"Connection": "close"})
    assert resp.status == 200 and resp.getheader("Connection") == "close" and conn.sock is None
    conn.close()


# --------------------------------------------------------------------------- nodes


@needs_upstream
def test_joined_nodes_become_ready_with_roles_labels_taints_and_capacity(cluster):
    cluster.server("node-label:\n- site=lab\n")
    cluster.agent("gpu-1", gpus=2, labels=["pool=a"], taints=["dedicated=gpu:NoSchedule"])
    cluster.wait_ready("cp-1", "gpu-1")
    cp, gpu = cluster.node("cp-1"), cluster.node("gpu-1")
    assert cp.metadata.labels["node-role.kubernetes.io/control-plane"] == "true"
    assert cp.metadata.labels["node-role.kubernetes.io/etcd"] == "true" and cp.metadata.labels["site"] == "lab"
    assert "node-role.kubernetes.io/control-plane" not in gpu.metadata.labels
    assert gpu.metadata.labels["pool"] == "a" and gpu.metadata.labels["kubernetes.io/hostname"] == "gpu-1"
    assert [(t.key, t.value, t.effect) for t in gpu.spec.taints] == [("dedicated", "gpu", "NoSchedule")]
    assert {(a.type, a.address) for a in gpu.status.addresses} >= {("InternalIP", "127.0.0.1"), ("Hostname", "gpu-1")}
    assert gpu.status.node_info.kubelet_version == VERSION
    assert int(gpu.status.allocatable["cpu"]) >= 1 and gpu.status.allocatable["pods"] == "110"
    labels = gpu.metadata.labels
    assert (labels["nvidia.com/gpu.present"], labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == (
        "true", "NVIDIA-H200", "2")
    assert gpu.status.allocatable["nvidia.com/gpu"] == "2" and gpu.status.capacity["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu.present" not in cp.metadata.labels and "nvidia.com/gpu" not in cp.status.allocatable
    secrets = {s.metadata.name for s in cluster.core.list_namespaced_secret("kube-system").items}
    assert {"cp-1.node-password.k3s", "gpu-1.node-password.k3s"} <= secrets


@needs_upstream
def test_an_agent_that_stops_goes_unknown_and_comes_back(cluster):
    cluster.server()
    agent = cluster.agent("w-1")
    cluster.wait_ready("cp-1", "w-1")
    agent.stop(signal.SIGKILL)  # no heartbeat any more
    t0 = time.monotonic()
    wait("w-1 Unknown", lambda: cluster.ready("w-1") == "Unknown", 10)
    assert 2.5 < time.monotonic() - t0 < 8  # K3S_STANDIN_NODE_GRACE=3 here (20 by default)
    node = cluster.node("w-1")
    assert {(t.key, t.effect) for t in node.spec.taints} == {("node.kubernetes.io/unreachable", "NoSchedule"),
                                                             ("node.kubernetes.io/unreachable", "NoExecute")}
    assert next(c for c in node.status.conditions if c.type == "Ready").reason == "NodeStatusUnknown"
    assert cluster.ready("cp-1") == "True"  # the server's own node stays Ready
    cluster.agent("w-1")
    cluster.wait_ready("w-1")
    assert not cluster.node("w-1").spec.taints


@needs_upstream
def test_cordon_delete_node_and_etcd_member_removal(cluster):
    cluster.server()
    cluster.agent("w-1")
    cluster.wait_ready("cp-1", "w-1")
    cluster.core.patch_node("w-1", {"spec": {"unschedulable": True}})
    wait("the cordon taint", lambda: any(t.key == "node.kubernetes.io/unschedulable"
                                         for t in cluster.node("w-1").spec.taints or []))
    cluster.core.create_namespaced_pod("default", pod("on-w1", command=["sleep", "infinity"],
                                                      nodeSelector={"kubernetes.io/hostname": "w-1"}))
    msg = wait("unschedulable", lambda: next((c.message for c in cluster.core.read_namespaced_pod(
        "on-w1", "default").status.conditions or [] if c.type == "PodScheduled"), None))
    assert msg.startswith("0/2 nodes are available: ") and "1 node(s) were unschedulable" in msg
    cluster.core.patch_node("w-1", {"spec": {"unschedulable": None}})
    wait("on-w1 running", lambda: cluster.core.read_namespaced_pod("on-w1", "default").status.phase == "Running")
    # deleting the node removes it, its pods and its node-password secret
    assert cluster.core.delete_node("w-1").status == "Success"
    wait("w-1 gone", lambda: "w-1" not in {n.metadata.name for n in cluster.core.list_node().items})
    time.sleep(1)
    assert "w-1" not in {n.metadata.name for n in cluster.core.list_node().items}  # stays deleted
    assert "on-w1" not in {p.metadata.name for p in cluster.core.list_namespaced_pod("default").items}
    assert "w-1.node-password.k3s" not in {s.metadata.name for s in cluster.core.list_namespaced_secret(
        "kube-system").items}
    # k3s's etcd member removal by annotation
    cluster.core.patch_node("cp-1", {"metadata": {"annotations": {"etcd.k3s.cattle.io/remove": "true"}}})
    removed = wait("removed-node-name", lambda: (cluster.node("cp-1").metadata.annotations or {}).get(
        "etcd.k3s.cattle.io/removed-node-name"))
    assert re.fullmatch(r"cp-1-[0-9a-f]{8}", removed)


# --------------------------------------------------------------------------- pods


@needs_upstream
def test_pods_schedule_run_and_log(cluster):
    cluster.server()
    cluster.agent("gpu-1", gpus=1)
    cluster.wait_ready("cp-1", "gpu-1")
    core = cluster.core
    core.create_namespaced_pod("default", pod("echo", command=["sh", "-c", "echo x > /data/f && cat /data/f"]))
    # a pod that has not started has no log yet (asked at once: it starts after 0.3 s, and
    # every create is persisted before it is answered, so five more creates can outlast that)
    with pytest.raises(ApiException) as exc:
        cluster.log("echo")
    assert exc.value.status == 400 and "is waiting to start: ContainerCreating" in json.loads(exc.value.body)["message"]
    core.create_namespaced_pod("default", pod("cuda", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                                              resources={"nvidia.com/gpu": "1"}))
    core.create_namespaced_pod("default", pod("cuda-no-gpu", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"))
    core.create_namespaced_pod("default", pod("broken", "example.com/fail-on-purpose:1"))
    core.create_namespaced_pod("default", pod("smi", "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04",
                                              command=["nvidia-smi", "-L"], resources={"nvidia.com/gpu": "1"}))
    core.create_namespaced_pod("default", pod("greedy", resources={"nvidia.com/gpu": "2"}))
    p = cluster.pod_done("echo")
    assert p.status.phase == "Succeeded" and cluster.log("echo") == "x\n"
    assert p.spec.node_name in ("cp-1", "gpu-1") and p.status.pod_ip.startswith("10.42.")
    assert p.status.container_statuses[0].state.terminated.exit_code == 0
    p = cluster.pod_done("cuda")
    assert p.spec.node_name == "gpu-1" and p.status.phase == "Succeeded"
    log = cluster.log("cuda")
    assert log.startswith("[Vector addition of 50000 elements]\n") and "Test PASSED" in log
    p = cluster.pod_done("cuda-no-gpu")
    assert p.status.phase == "Failed" and "no CUDA-capable device is detected" in cluster.log("cuda-no-gpu")
    p = cluster.pod_done("broken")
    assert p.status.phase == "Failed" and p.status.container_statuses[0].state.terminated.exit_code == 1
    cluster.pod_done("smi")
    assert re.fullmatch(r"GPU 0: NVIDIA H200 \(UUID: GPU-[0-9a-f-]+\)\n", cluster.log("smi"))
    greedy = core.read_namespaced_pod("greedy", "default")
    assert greedy.status.phase == "Pending"
    cond = next(c for c in greedy.status.conditions if c.type == "PodScheduled")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert cond.message.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=greedy").items
    assert any(e.reason == "FailedScheduling" and "Insufficient nvidia.com/gpu" in e.message for e in events)
    # a pod bound by nodeName that does not fit is rejected by the kubelet
    core.create_namespaced_pod("default", pod("pinned", resources={"nvidia.com/gpu": "3"}, nodeName="gpu-1"))
    p = cluster.pod_done("pinned")
    assert p.status.reason == "OutOfnvidia.com/gpu" and "Node didn't have enough resource" in p.status.message
    # deleting a pod removes it at once; a running pod stays running until then
    core.create_namespaced_pod("default", pod("server", command=["sh", "-c", "echo up; sleep infinity"]))
    wait("server running", lambda: core.read_namespaced_pod("server", "default").status.phase == "Running")
    time.sleep(1)
    assert core.read_namespaced_pod("server", "default").status.phase == "Running" and cluster.log("server") == "up\n"
    core.delete_namespaced_pod("server", "default")
    assert "server" not in {x.metadata.name for x in core.list_namespaced_pod("default").items}


@needs_upstream
def test_eviction_respects_pod_disruption_budgets(cluster):
    cluster.server()
    cluster.wait_ready("cp-1")
    core = cluster.core
    p = pod("guarded", command=["sleep", "infinity"])
    p["metadata"]["labels"] = {"app": "guarded"}
    core.create_namespaced_pod("default", p)
    wait("running", lambda: core.read_namespaced_pod("guarded", "default").status.phase == "Running")
    cluster.policy.create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "guarded", "namespace": "default"}}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("guarded", "default", eviction)
    assert exc.value.status == 429 and "disruption budget" in json.loads(exc.value.body)["message"]
    cluster.policy.delete_namespaced_pod_disruption_budget("pdb", "default")
    core.create_namespaced_pod_eviction("guarded", "default", eviction)
    assert core.list_namespaced_pod("default").items == []


# --------------------------------------------------------------------------- GPUs, MIG, RDMA


@needs_upstream
def test_gpus_reach_a_pod_only_through_an_nvidia_runtime(cluster):
    cluster.server()
    cluster.agent("gpu-runc", gpus=2, default_runtime=None)  # k3s found the runtime, runc stays default
    cluster.agent("gpu-nvidia", gpus=1)  # default-runtime: nvidia, as the tool sets it
    cluster.wait_ready("gpu-runc", "gpu-nvidia")
    smi = {"command": ["nvidia-smi", "-L"], "resources": {"nvidia.com/gpu": "1"}}
    cluster.core.create_namespaced_pod("default", pod("plain-on-runc", nodeName="gpu-runc", **smi))
    cluster.core.create_namespaced_pod("default", pod("classed-on-runc", nodeName="gpu-runc",
                                                      runtimeClassName="nvidia", **smi))
    cluster.core.create_namespaced_pod("default", pod("plain-on-nvidia", nodeName="gpu-nvidia", **smi))
    assert cluster.pod_done("plain-on-runc").status.phase == "Failed"
    assert "nvidia-smi: not found" in cluster.log("plain-on-runc")
    for name in ("classed-on-runc", "plain-on-nvidia"):
        assert cluster.pod_done(name).status.phase == "Succeeded", cluster.log(name)
        assert cluster.log(name).startswith("GPU 0: NVIDIA H200")
    with pytest.raises(ApiException) as refused:  # the RuntimeClass admission plugin
        cluster.core.create_namespaced_pod("default", pod("no-such-class", runtimeClassName="nope", **smi))
    assert refused.value.status == 403
    assert 'pod rejected: RuntimeClass "nope" not found' in json.loads(refused.value.body)["message"]


@needs_upstream
def test_a_default_runtime_containerd_lacks_stops_the_agent(cluster):
    cluster.server()
    agent = cluster.agent("gpu-1", gpus=1, toolkit=False)  # default-runtime: nvidia, no toolkit on the host
    agent.proc.wait(20)
    assert agent.proc.returncode != 0
    # (logged logrus-style: the inner quotes escaped)
    assert 'no corresponding runtime configured in `containerd.runtimes` for `containerd` ' \
           '`default_runtime_name = \\"nvidia\\"`' in agent.log()


def gpu_node_with_plugin_configs(cluster, configs: dict):
    """A GPU agent (2 GPUs) and the device plugin's ConfigMap with these configs."""
    cluster.server()
    cluster.agent("gpu-1", gpus=2)
    cluster.wait_ready("gpu-1")
    cluster.core.create_namespace({"metadata": {"name": "gpu-operator"}})
    cluster.core.create_namespaced_config_map("gpu-operator", {
        "metadata": {"name": "bootstrap-device-plugin-config"}, "data": configs})
    return cluster.core


@needs_upstream
def test_time_slicing_and_mps_configs_multiply_the_gpus(cluster):
    core = gpu_node_with_plugin_configs(cluster, {"ts-4": TS4, "ts-3-renamed": TS4.replace("false", "true").replace("replicas: 4", "replicas: 3"),
                 "mps-2": "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
                 "ts-1": TS4.replace("replicas: 4", "replicas: 1")})
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-4"}}})
    node = wait("8 GPUs", lambda: (lambda n: n if n.status.allocatable.get("nvidia.com/gpu") == "8" else None)(
        cluster.node("gpu-1")))
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    labels = node.metadata.labels
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"],
            labels["nvidia.com/gpu.product"]) == ("4", "time-slicing", "NVIDIA-H200-SHARED")
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-3-renamed"}}})
    node = wait("gpu.shared", lambda: (lambda n: n if n.status.allocatable.get("nvidia.com/gpu.shared") == "6"
                                       else None)(cluster.node("gpu-1")))
    assert node.status.allocatable["nvidia.com/gpu"] == "0" and labels["nvidia.com/gpu.product"]
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "mps-2"}}})
    wait("mps", lambda: cluster.node("gpu-1").metadata.labels.get("nvidia.com/gpu.sharing-strategy") == "mps")
    assert cluster.node("gpu-1").status.allocatable["nvidia.com/gpu"] == "4"
    # a config name the ConfigMap lacks: the plugin advertises nothing and says why
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "nope"}}})
    wait("no GPUs", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "0")
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-1").items
    assert any(e.reason == "DevicePluginConfigError" and "'nope'" in e.message for e in events)
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": None}}})
    wait("back to 2", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "2")
    # one replica: the real plugin refuses the config (replicas.go) and advertises nothing
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-1"}}})
    wait("no GPUs for replicas: 1", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "0")
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-1").items
    assert any("number of replicas must be >= 2" in e.message for e in events)


@needs_upstream
def test_mps_is_refused_when_the_cluster_policy_says_mixed(cluster):
    core = gpu_node_with_plugin_configs(cluster, {
        "mps-2": "version: v1\nflags:\n  migStrategy: none\nsharing:\n  mps:\n    resources:\n"
                 "    - name: nvidia.com/gpu\n      replicas: 2\n"})
    policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
              "spec": {"mig": {"strategy": "mixed"}, "devicePlugin": {"config": {"name": "bootstrap-device-plugin-config"}}}}
    cluster.custom.create_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", policy)
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "mps-2"}}})
    wait("no GPUs for MPS under mixed", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "0")
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-1").items
    assert any("mixed is not supported with MPS" in e.message for e in events)


@needs_upstream
def test_mig_manager_applies_layouts_per_strategy(cluster):
    cluster.server()
    cluster.agent("gpu-1", gpus=2)
    cluster.wait_ready("gpu-1")
    core = cluster.core
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.18gb",
                                                      "nvidia.com/mig.strategy": "mixed"}}})
    assert wait("pending", lambda: cluster.node("gpu-1").metadata.labels.get("nvidia.com/mig.config.state")) == "pending"
    node = wait("success", lambda: (lambda n: n if n.metadata.labels.get("nvidia.com/mig.config.state") == "success"
                                    else None)(cluster.node("gpu-1")))
    assert node.status.allocatable["nvidia.com/mig-1g.18gb"] == "14"
    assert node.status.allocatable["nvidia.com/gpu"] == "0" and node.metadata.labels["nvidia.com/mig-1g.18gb.count"] == "14"
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.71gb",
                                                      "nvidia.com/mig.strategy": "single"}}})
    wait("single", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "4")
    node = cluster.node("gpu-1")
    assert "nvidia.com/mig-1g.18gb" not in node.status.allocatable
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-3g.71gb"
    # a MIG pod runs on a slice
    core.create_namespaced_pod("default", pod("on-mig", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                                              resources={"nvidia.com/gpu": "1"}))
    assert cluster.pod_done("on-mig").status.phase == "Succeeded"
    # an unknown layout fails, with MIG manager's reason on the node
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-9g.999gb"}}})
    node = wait("failed", lambda: (lambda n: n if n.metadata.labels.get("nvidia.com/mig.config.state") == "failed"
                                   else None)(cluster.node("gpu-1")))
    assert "all-9g.999gb" in node.metadata.annotations["nvidia.com/mig.config.state.reason"]
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-1").items
    assert any(e.reason == "MigConfigFailed" for e in events)
    # the tool's own mig-parted config (profiles per node) replaces the built-in layouts
    core.create_namespace({"metadata": {"name": "gpu-operator"}})
    core.create_namespaced_config_map("gpu-operator", {"metadata": {"name": "bootstrap-mig-parted-config"}, "data": {
        "config.yaml": yaml.safe_dump({"version": "v1", "mig-configs": {
            "all-disabled": [{"devices": "all", "mig-enabled": False}],
            "custom-1a2b3c4d": [{"devices": "all", "mig-enabled": True, "mig-devices": {"2g.35gb": 1, "3g.71gb": 1}}],
            "custom-toobig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.141gb": 1, "1g.18gb": 1}}],
        }}, sort_keys=False)}})
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "custom-1a2b3c4d",
                                                      "nvidia.com/mig.strategy": "mixed"}}})
    node = wait("custom", lambda: (lambda n: n if n.metadata.labels.get("nvidia.com/mig.config.state") == "success"
                                   else None)(cluster.node("gpu-1")))
    assert (node.status.allocatable["nvidia.com/mig-2g.35gb"], node.status.allocatable["nvidia.com/mig-3g.71gb"]) == (
        "2", "2")
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "custom-toobig"}}})
    node = wait("too big", lambda: (lambda n: n if n.metadata.labels.get("nvidia.com/mig.config.state") == "failed"
                                    else None)(cluster.node("gpu-1")))
    assert "7 and 8" in node.metadata.annotations["nvidia.com/mig.config.state.reason"]
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-disabled"}}})
    wait("whole GPUs", lambda: cluster.node("gpu-1").status.allocatable.get("nvidia.com/gpu") == "2")


@needs_upstream
def test_rdma_shared_device_plugin_resources(cluster):
    cluster.server()
    cluster.agent("gpu-1", gpus=1, rdma=[{"hca": "mlx5_0", "netdevs": ["ib0"], "vendor": "0x15b3",
                                          "device": "0x1021", "link_layer": "InfiniBand"}])
    cluster.agent("gpu-2", gpus=1)
    cluster.wait_ready("gpu-1", "gpu-2")
    cluster.core.create_namespaced_config_map("kube-system", {"metadata": {"name": "rdma-devices"}, "data": {
        "config.json": json.dumps({"periodicUpdateInterval": 300, "configList": [
            {"resourceName": "hca", "rdmaHcaMax": 63, "selectors": {"ifNames": ["ib0", "ib1"]}}]})}})
    wait("rdma/hca", lambda: cluster.node("gpu-1").status.allocatable.get("rdma/hca") == "63")
    assert "rdma/hca" not in cluster.node("gpu-2").status.allocatable
    cluster.core.create_namespaced_pod("default", pod("ib", resources={"rdma/hca": "1", "nvidia.com/gpu": "1"}))
    assert cluster.pod_done("ib").spec.node_name == "gpu-1"


# --------------------------------------------------------------------------- storage


@needs_upstream
def test_pvcs_bind_through_local_path_and_keep_their_files(cluster):
    cluster.server()
    cluster.agent("w-1")
    cluster.wait_ready("cp-1", "w-1")
    core = cluster.core
    claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                   "resources": {"requests": {"storage": "1Gi"}}}}
    core.create_namespaced_persistent_volume_claim("default", claim)
    time.sleep(0.5)
    pvc = core.read_namespaced_persistent_volume_claim("data", "default")
    assert pvc.spec.storage_class_name == "local-path" and pvc.status.phase == "Pending"  # WaitForFirstConsumer
    mount = {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
    writer = pod("writer", command=["sh", "-c", "echo bootstrap-ok > /data/probe && cat /data/probe"], **mount)
    writer["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/data"}]
    core.create_namespaced_pod("default", writer)
    p = cluster.pod_done("writer")
    assert p.status.phase == "Succeeded" and cluster.log("writer") == "bootstrap-ok\n"
    pvc = core.read_namespaced_persistent_volume_claim("data", "default")
    assert pvc.status.phase == "Bound" and pvc.status.capacity == {"storage": "1Gi"}
    pv = core.read_persistent_volume(pvc.spec.volume_name)
    assert pv.spec.claim_ref.name == "data" and pv.spec.host_path.path.startswith("/var/lib/rancher/k3s/storage/")
    # a second pod lands on the same node (local volumes are pinned) and reads the file
    reader = pod("reader", command=["cat", "/mnt/probe"], **mount)
    reader["spec"]["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/mnt"}]
    core.create_namespaced_pod("default", reader)
    r = cluster.pod_done("reader")
    assert r.spec.node_name == p.spec.node_name and cluster.log("reader") == "bootstrap-ok\n"
    # a claim for a class that does not exist stays Pending, with the provisioner's event
    core.create_namespaced_persistent_volume_claim("default", dict(claim, metadata={"name": "nfs"}, spec=dict(
        claim["spec"], storageClassName="nfs-csi")))
    time.sleep(0.5)
    assert core.read_namespaced_persistent_volume_claim("nfs", "default").status.phase == "Pending"
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=nfs").items
    assert any(e.reason == "ProvisioningFailed" and '"nfs-csi" not found' in e.message for e in events)
    # ... until the class appears (Immediate binding)
    cluster.storage.create_storage_class({"metadata": {"name": "nfs-csi"}, "provisioner": "nfs.csi.k8s.io"})
    wait("bound", lambda: core.read_namespaced_persistent_volume_claim("nfs", "default").status.phase == "Bound")
    # deleting a claim with reclaimPolicy Delete removes its volume
    core.delete_namespaced_pod("writer", "default")
    core.delete_namespaced_pod("reader", "default")
    core.delete_namespaced_persistent_volume_claim("data", "default")
    wait("pv gone", lambda: pv.metadata.name not in {v.metadata.name for v in core.list_persistent_volume().items})


# --------------------------------------------------------------------------- Jobs, Volcano, namespaces


@needs_upstream
def test_batch_jobs_complete_or_fail(cluster):
    cluster.server()
    cluster.wait_ready("cp-1")
    ok = {"metadata": {"name": "ok"}, "spec": {"completions": 2, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["echo", "done"]}]}}}}
    cluster.batch.create_namespaced_job("default", ok)
    bad = {"metadata": {"name": "bad"}, "spec": {"backoffLimit": 1, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["false"]}]}}}}
    cluster.batch.create_namespaced_job("default", bad)
    done = wait("ok complete", lambda: (lambda j: j if any(c.type == "Complete" for c in j.status.conditions or [])
                                        else None)(cluster.batch.read_namespaced_job("ok", "default")), 20)
    assert done.status.succeeded == 2
    failed = wait("bad failed", lambda: (lambda j: j if any(c.type == "Failed" for c in j.status.conditions or [])
                                         else None)(cluster.batch.read_namespaced_job("bad", "default")), 20)
    assert failed.status.failed == 2 and failed.status.conditions[-1].reason == "BackoffLimitExceeded"
    pods = cluster.core.list_namespaced_pod("default", label_selector="job-name=ok").items
    assert len(pods) == 2 and cluster.log(pods[0].metadata.name) == "done\n"
    cluster.batch.delete_namespaced_job("ok", "default", propagation_policy="Background")
    wait("job pods gone", lambda: not cluster.core.list_namespaced_pod("default", label_selector="job-name=ok").items)


@needs_upstream
def test_volcano_gang_jobs_run_all_or_nothing(cluster):
    cluster.server()
    cluster.agent("gpu-1", gpus=2)
    cluster.wait_ready("gpu-1")
    custom = cluster.custom
    custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues",
                                        {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                                         "metadata": {"name": "train"}, "spec": {"weight": 2}})
    assert custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", "train")["status"] == {
        "state": "Open"}

    def job(name, replicas, min_available, queue="train"):
        return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
                "spec": {"minAvailable": min_available, "schedulerName": "volcano", "queue": queue, "tasks": [
                    {"name": "member", "replicas": replicas, "template": {"spec": {
                        "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}], "containers": [
                            {"name": "c", "image": "busybox:1.36", "command": ["sh", "-c", "echo member-ok"],
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}]}}

    get = lambda name: custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", name)  # noqa: E731
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", job("fits", 2, 2))
    done = wait("fits completed", lambda: (lambda j: j if j["status"]["state"]["phase"] == "Completed" else None)(
        get("fits")), 20)
    assert done["status"]["succeeded"] == 2
    assert cluster.log("fits-member-0") == "member-ok\n"
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", job("toobig", 3, 3))
    blocked = wait("gang message", lambda: (lambda j: j if j["status"]["state"].get("message") else None)(
        get("toobig")))
    assert blocked["status"]["state"]["phase"] == "Pending"
    assert "3/3 tasks in gang unschedulable" in blocked["status"]["state"]["message"]
    time.sleep(1)
    pods = cluster.core.list_namespaced_pod("default", label_selector="volcano.sh/job-name=toobig").items
    assert len(pods) == 3 and {p.status.phase for p in pods} == {"Pending"} and not any(p.spec.node_name for p in pods)
    cond = next(c for c in pods[0].status.conditions if c.type == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in cond.message
    (pg,) = [g for g in custom.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", "default",
                                                              "podgroups")["items"]
             if g["metadata"]["name"].startswith("toobig-")]
    assert pg["spec"]["minMember"] == 3 and pg["status"]["phase"] == "Pending"
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs",
                                               job("nowhere", 1, 1, queue="missing"))
    assert exc.value.status == 400
    assert json.loads(exc.value.body)["message"] == ('admission webhook "validatejob.volcano.sh" denied the request: '
                                                     'unable to find job queue: queues.scheduling.volcano.sh "missing" '
                                                     'not found')
    # deleting the job takes its pods and podgroup
    custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "toobig")
    wait("gang pods gone", lambda: not cluster.core.list_namespaced_pod(
        "default", label_selector="volcano.sh/job-name=toobig").items)
    # NetworkAttachmentDefinitions are stored as they are
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": "ib"},
           "spec": {"config": json.dumps({"cniVersion": "0.3.1", "type": "ib-sriov"})}}
    custom.create_namespaced_custom_object("k8s.cni.cncf.io", "v1", "default", "network-attachment-definitions", nad)
    got = custom.get_namespaced_custom_object("k8s.cni.cncf.io", "v1", "default", "network-attachment-definitions", "ib")
    assert got["spec"] == nad["spec"] and got["kind"] == "NetworkAttachmentDefinition"


@needs_upstream
def test_deleting_a_namespace_removes_what_is_in_it(cluster):
    cluster.server()
    core = cluster.core
    core.create_namespace({"metadata": {"name": "scratch"}})
    core.create_namespaced_config_map("scratch", {"metadata": {"name": "c"}})
    assert core.read_namespace("scratch").status.phase == "Active"
    # (the API server answers with the Namespace, which this client reads as a V1Status)
    status, body = cluster.raw("DELETE", "/api/v1/namespaces/scratch")
    assert status == 200 and json.loads(body)["status"] == {"phase": "Terminating"}
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("scratch", {"metadata": {"name": "d"}})
    assert exc.value.status == 403 and "being terminated" in json.loads(exc.value.body)["message"]
    wait("namespace gone", lambda: "scratch" not in {n.metadata.name for n in core.list_namespace().items})
    assert core.list_namespaced_config_map("scratch").items == []


def test_a_kubelet_that_keeps_deleted_pods_holds_their_namespace_terminating(cluster):
    """A node labelled standin.k3s/kubelet=keeps-deleted-pods never confirms a pod's deletion;
    an object with finalizers keeps its namespace Terminating (the namespace controller)."""
    cluster.server()
    cluster.agent("keeper", labels=["standin.k3s/kubelet=keeps-deleted-pods"])
    cluster.wait_ready("cp-1", "keeper")
    core = cluster.core
    core.create_namespace({"metadata": {"name": "held"}})
    core.create_namespaced_pod("held", pod("p", nodeSelector={"kubernetes.io/hostname": "keeper"}))
    cluster.pod_done("p", "held")
    core.delete_namespace("held")
    time.sleep(2.5)  # the namespace controller's second, and more
    assert core.read_namespace("held").status.phase == "Terminating"
    kept = core.read_namespaced_pod("p", "held")
    assert kept.metadata.deletion_timestamp and kept.metadata.finalizers == ["standin.k3s/kubelet-confirms"]
    core.patch_namespaced_pod("p", "held", {"metadata": {"finalizers": None}})  # the kubelet confirms at last
    wait("namespace gone", lambda: "held" not in {n.metadata.name for n in core.list_namespace().items})


# --------------------------------------------------------------------------- persistence


@needs_upstream
def test_objects_survive_restarts_and_travel_in_snapshots(cluster, k3s, tmp_path):
    server = cluster.server()
    cluster.core.create_namespaced_config_map("default", {"metadata": {"name": "keep"}, "data": {"a": "1"}})
    server.stop()
    state = cluster.root / "var/lib/rancher/k3s/server/standin-api.json"
    assert oct(state.stat().st_mode & 0o777) == "0o600"
    cluster.server(root=cluster.root)
    assert cluster.core.read_namespaced_config_map("keep", "default").data == {"a": "1"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_")}
    proc = subprocess.run([sys.executable, str(k3s), "etcd-snapshot", "save", "--name", "snap"], capture_output=True,
                          text=True, env=dict(env, K3S_STANDIN_ROOT=str(cluster.root)), timeout=30)
    assert proc.returncode == 0, proc.stderr
    (snapshot,) = (cluster.root / "var/lib/rancher/k3s/server/db/snapshots").iterdir()
    assert "keep" in snapshot.read_text()
    cluster.stop()
    token = (cluster.root / "var/lib/rancher/k3s/server/token").read_text().strip()
    new_host = tmp_path / "new"
    proc = subprocess.run([sys.executable, str(k3s), "server", "--cluster-reset",
                           f"--cluster-reset-restore-path={snapshot}", "--token", token], capture_output=True,
                          text=True, env=dict(env, K3S_STANDIN_ROOT=str(new_host)), timeout=30)
    assert proc.returncode == 0, proc.stderr
    cluster.server(root=new_host)
    assert cluster.core.read_namespaced_config_map("keep", "default").data == {"a": "1"}


# --------------------------------------------------------------------------- on test hosts


@needs_upstream
def test_an_image_no_node_can_pull_holds_its_pod_pending_with_the_kubelets_reasons(cluster):
    """A registry under .invalid never resolves: the container waits with ErrImagePull and
    containerd's error, then ImagePullBackOff while the kubelet backs off (kubernetes
    pkg/kubelet/images/image_manager.go), with a Failed event; the pod stays Pending."""
    cluster.server()
    cluster.wait_ready("cp-1")
    cluster.core.create_namespaced_pod("default", pod("unpullable", "registry.invalid/cuda-sample:vectoradd-cuda12"))

    def waiting():
        statuses = cluster.core.read_namespaced_pod("unpullable", "default").status.container_statuses or []
        return statuses and statuses[0].state.waiting and statuses[0].state.waiting.reason

    assert wait("ErrImagePull", lambda: waiting() in ("ErrImagePull", "ImagePullBackOff"))
    first = cluster.core.read_namespaced_pod("unpullable", "default")
    assert wait("ImagePullBackOff", lambda: waiting() == "ImagePullBackOff")
    backing_off = cluster.core.read_namespaced_pod("unpullable", "default")
    assert backing_off.status.phase == "Pending"
    assert backing_off.status.container_statuses[0].state.waiting.message == \
        'Back-off pulling image "registry.invalid/cuda-sample:vectoradd-cuda12"'
    events = cluster.core.list_namespaced_event("default").items
    failed = [e.message for e in events if e.reason == "Failed" and e.involved_object.name == "unpullable"]
    assert failed and "lookup registry.invalid: no such host" in failed[0]
    if first.status.container_statuses[0].state.waiting.reason == "ErrImagePull":
        assert first.status.container_statuses[0].state.waiting.message.startswith(
            'rpc error: code = Unknown desc = failed to pull and unpack image "registry.invalid/')
