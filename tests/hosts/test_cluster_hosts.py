"""`bootstrap up` cluster side and `bootstrap validate`, over real SSH and the API tunnel,
against the k3s stand-in's Kubernetes API (tests/standins/kubeapi.py) on the test server,
with the real Helm installing lab chart archives (tests/labcharts.py)."""

import json

import pytest
from clirun import run_bootstrap
from labcharts import helm, helm_json, lab_charts
from labinv import write_inventory

pytestmark = pytest.mark.hosts


@pytest.fixture
def cluster(lab, tmp_path, airgap):
    """1 server + 2 GPU agents with the H200 stand-in, time-slicing x4, the toolkit from a
    local apt repository; `up` has run once."""
    from standins.aptrepo import AptRepo, build_toolkit_deb

    hosts = lab.start(["cl-cp", "cl-g1", "cl-g2"], gpu=["cl-g1", "cl-g2"])
    repo = AptRepo([build_toolkit_deb(tmp_path / "debs")])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
        "k3s": {"airgap": str(airgap)},
        "gpu": {"cuda": "12.4", "sharing": {"time_slicing": {"replicas": 4}},
                "container_toolkit": {"apt_source": repo.source_line}},
        "volcano": {"queues": [{"name": "research", "weight": 2}]},
        "charts": lab_charts(tmp_path / "charts"),
        "validate": {"timeout_s": 60}})
    env = {"BOOTSTRAP_HELM": helm()}  # the real Helm, as a user runs it
    before = logins(hosts[0])
    first = run_bootstrap("up", inventory, env=env, timeout=900)
    try:
        yield {"hosts": hosts, "inventory": inventory, "env": env, "first": first, "tmp": tmp_path,
               "kubeconfig": tmp_path / "state" / "kubeconfig", "server_logins": logins(hosts[0]) - before}
    finally:
        repo.close()


def logins(host) -> int:
    """SSH logins of the inventory's user sshd has logged on `host` (read as root: not one of them)."""
    out = host.ssh("journalctl -q --no-pager | grep -c 'Accepted publickey for ubuntu' || true", user="root")
    return int(out.stdout.strip() or 0)


def releases(kubeconfig):
    """{release: (chart, revision, status)} as the real Helm lists them."""
    return {r["name"]: (r["chart"], r["revision"], r["status"]) for r in helm_json(kubeconfig, "list", "-A")}


def test_up_applies_components_validates_and_a_second_up_makes_no_helm_call(cluster):
    first = cluster["first"]
    assert first.returncode == 0, first.stdout + first.stderr
    # One SSH connection to the server for the whole `up`: the facts, the steps, the
    # kubeconfig, the API tunnel (Helm, the checks) and the snapshot all go over it.
    assert cluster["server_logins"] == 1, cluster["server_logins"]
    installed = releases(cluster["kubeconfig"])
    assert installed["gpu-operator"] == ("gpu-operator-v26.7.0", "1", "deployed")
    assert installed["volcano"] == ("volcano-1.15.1", "1", "deployed") and "multus" not in installed
    values = helm_json(cluster["kubeconfig"], "get", "values", "gpu-operator", "-n", "gpu-operator")
    assert values and "CONTAINERD_SOCKET" not in json.dumps(values)  # the host toolkit is used
    for line in ("PASS  gpu-pod:cl-g1", "PASS  gpu-pod:cl-g2", "PASS  gpu-capacity:cl-g1", "PASS  pvc",
                 "PASS  volcano-gang"):
        assert line in first.stdout, first.stdout
    assert "nvidia.com/gpu=4" in first.stdout
    second = run_bootstrap("up", cluster["inventory"], env=cluster["env"])
    assert second.returncode == 0, second.stderr
    assert "cluster: no change" in second.stdout and "hosts: no change" in second.stdout
    assert "checks not re-run" in second.stdout and "snapshot:" not in second.stdout
    assert releases(cluster["kubeconfig"]) == installed  # no release was upgraded again
    plan = run_bootstrap("plan", cluster["inventory"])
    assert "component gpu-operator: no change" in plan.stdout and "cl-g1: no change" in plan.stdout
    import yaml

    changed = cluster["tmp"] / "more-replicas.yaml"
    data = yaml.safe_load(cluster["inventory"].read_text())
    data["charts"] = {"volcano": "1.15.0"}
    changed.write_text(yaml.safe_dump(data))
    assert "component volcano: upgrade to volcano 1.15.0" in run_bootstrap("plan", changed).stdout
    status = run_bootstrap("status", cluster["inventory"], "--json")
    report = json.loads(status.stdout)
    by_node = {r["node"]: r for r in report["nodes"]}
    assert by_node["cl-g1"]["ready"] == "Ready" and by_node["cl-g1"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert report["components"]["gpu-operator"]["state"] == "applied"


def test_each_validation_check_fails_for_the_right_reason(cluster):
    assert cluster["first"].returncode == 0, cluster["first"].stdout + cluster["first"].stderr
    inventory, tmp = cluster["inventory"], cluster["tmp"]
    import yaml

    data = yaml.safe_load(inventory.read_text())
    data["gpu"]["sharing"]["time_slicing"]["replicas"] = 8  # the cluster advertises 4
    data["validate"] = {"timeout_s": 15, "image": "example.com/cuda-sample:fail"}
    data["network"] = {"rdma": {"interfaces": ["ibp26s0"]}}
    wrong = tmp / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(data))
    # A pod that holds every GPU of cl-g2 makes the gang (one member per GPU node) unschedulable.
    hog = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": "default"},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": "cl-g2"}, "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                                    "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    from bootstrap.cluster.client import connect, request
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(wrong)
    with connect(inv, StateDir(inv)) as api:
        assert request(api, "POST", "/api/v1/namespaces/default/pods", hog)[0] < 300
        assert request(api, "DELETE", "/apis/storage.k8s.io/v1/storageclasses/local-path")[0] < 300
    result = run_bootstrap("validate", wrong, "--json", timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {(c["check"], c["node"]): c for c in json.loads(result.stdout)["checks"]}
    assert checks[("gpu-capacity", "cl-g1")]["status"] == "FAIL"
    assert "expected 8" in checks[("gpu-capacity", "cl-g1")]["reason"]
    assert checks[("rdma", "cl-g1")]["status"] == "FAIL"
    assert checks[("gpu-pod", "cl-g1")]["status"] == "FAIL" and "failed" in checks[("gpu-pod", "cl-g1")]["reason"]
    assert checks[("gpu-pod", "cl-g2")]["status"] == "FAIL" and "never ran" in checks[("gpu-pod", "cl-g2")]["reason"]
    assert checks[("pvc", None)]["status"] == "FAIL" and "not Bound" in checks[("pvc", None)]["reason"]
    assert checks[("volcano-gang", None)]["status"] == "FAIL"
    assert checks[("nccl", None)]["status"] == "SKIP"
    # validate cleans up after itself: its namespace of its own, and every pod in it.
    with connect(inv, StateDir(inv)) as api:
        mine = [("labelSelector", "app.kubernetes.io/part-of=bootstrap-validate")]
        assert request(api, "GET", "/api/v1/pods", query=mine)[1].get("items", []) == []
        assert request(api, "GET", "/api/v1/namespaces", query=mine)[1].get("items", []) == []


def test_nccl_all_reduce_is_judged_against_the_bandwidth_floor(cluster):
    assert cluster["first"].returncode == 0, cluster["first"].stdout + cluster["first"].stderr
    data = yaml_load(cluster["inventory"])
    for floor, expected in ((100, "PASS"), (150, "FAIL")):
        data["validate"] = {"timeout_s": 60, "gpu_pod": False,
                            "nccl": {"min_busbw_gbps": floor, "image": "example.com/nccl-tests:busbw-120"}}
        path = cluster["tmp"] / f"nccl-{floor}.yaml"
        path.write_text(yaml_dump(data))
        result = run_bootstrap("validate", path, "--json", timeout=600)
        nccl = next(c for c in json.loads(result.stdout)["checks"] if c["check"] == "nccl")
        assert nccl["status"] == expected, nccl
        assert "120.0 GB/s" in nccl["reason"]
        # NCCL is told each node's node-ip interface (the lab hosts' own), and it is printed.
        assert "[NCCL_SOCKET_IFNAME==" in nccl["reason"], nccl


def test_mig_layout_is_applied_and_advertised(lab, tmp_path, airgap):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    hosts = lab.start(["mg-cp", "mg-g1"], gpu=["mg-g1"])
    with AptRepo([build_toolkit_deb(tmp_path / "debs")]) as repo:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
            "k3s": {"airgap": str(airgap)},
            "gpu": {"sharing": {"mig": {"layout": "all-1g.18gb"}},
                    "container_toolkit": {"apt_source": repo.source_line}},
            "charts": lab_charts(tmp_path / "charts"),
            "validate": {"timeout_s": 60}})
        result = run_bootstrap("up", inventory, env={"BOOTSTRAP_HELM": helm()}, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS  gpu-capacity:mg-g1  nvidia.com/gpu=7" in result.stdout
    assert "PASS  gpu-pod:mg-g1" in result.stdout


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


def yaml_dump(data):
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def test_a_failed_mig_layout_is_reported_with_mig_managers_reason(cluster):
    assert cluster["first"].returncode == 0, cluster["first"].stdout + cluster["first"].stderr
    from bootstrap.cluster.apply import wait_mig
    from bootstrap.cluster.client import connect, merge_patch
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(cluster["inventory"])
    with connect(inv, StateDir(inv)) as api:
        merge_patch(api, "/api/v1/nodes/cl-g1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-9g.999gb"}}})
        failed = wait_mig(api, {"cl-g1": "all-9g.999gb"}, timeout_s=60)  # that node's failure, not the run's
    assert list(failed) == ["cl-g1"]
    assert "MIG layout all-9g.999gb failed on cl-g1" in failed["cl-g1"]
    assert "see the nvidia-mig-manager" not in failed["cl-g1"]  # MIG Manager's own reason is shown


def test_scale_down_idle_keeps_capacity_pending_gpu_pods_wait_for_asks_and_keeps_n(cluster):
    """`scale-down --idle` on real GPU agents through the real kubectl's view: it refuses
    while a GPU pod waits for capacity, asks before it removes anything (no terminal, no
    --yes: refused), and --keep 1 leaves the first idle GPU node in place."""
    import shutil
    import subprocess

    assert cluster["first"].returncode == 0, cluster["first"].stdout + cluster["first"].stderr
    if shutil.which("kubectl") is None:
        pytest.skip("the real kubectl must be on PATH (.ci/run installs it)")
    inventory, kubeconfig = cluster["inventory"], cluster["kubeconfig"]

    def kubectl(*argv, stdin=None):
        done = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *argv], input=stdin,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"kubectl {' '.join(argv)}: {done.stderr}"
        return done.stdout

    waiting = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-99-gpus", "namespace": "default"},
               "spec": {"containers": [{"name": "main", "image": "registry.lab.invalid/cuda:12",
                                        "resources": {"limits": {"nvidia.com/gpu": 99}}}]}}
    kubectl("apply", "-f", "-", stdin=json.dumps(waiting))
    assert kubectl("get", "pod", "wants-99-gpus", "-o", "jsonpath={.status.phase}") == "Pending"
    refused = run_bootstrap("scale-down", inventory, "--idle", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "1 GPU pod(s) wait for a GPU (default/wants-99-gpus); nothing was changed" in refused.stderr
    kubectl("delete", "pod", "wants-99-gpus", "--wait=true")

    unasked = run_bootstrap("scale-down", inventory, "--idle")
    assert unasked.returncode == 2 and "--yes" in unasked.stderr, unasked.stdout + unasked.stderr
    assert "cl-g1, cl-g2" in unasked.stderr  # it says which nodes it would remove
    nodes = kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
    assert sorted(nodes) == ["cl-cp", "cl-g1", "cl-g2"]

    removed = run_bootstrap("scale-down", inventory, "--idle", "--keep", "1", "--yes", timeout=600)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "keeping 1 idle GPU node(s) (--keep 1): cl-g1" in removed.stdout
    assert "cl-g2: k3s stopped; removed from the cluster" in removed.stdout
    nodes = kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
    assert sorted(nodes) == ["cl-cp", "cl-g1"]
    g2 = next(h for h in cluster["hosts"] if h.name == "cl-g2")
    assert "k3s" not in g2.ssh("ls /usr/local/bin /etc/rancher 2>/dev/null; true").stdout
