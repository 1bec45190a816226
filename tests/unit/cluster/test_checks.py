"""What validate expects a node to advertise, and how it reads NCCL output."""

from dataclasses import replace

import pytest
from test_facts_parsers import h200_probe_output

from hypothesis import given
from hypothesis import strategies as st

from bootstrap.cluster.checks import CheckResult, _waiting, expected_gpu_resources, parse_busbw, render_table
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.inventory.loader import parse_inventory

H200 = parse_host_facts(h200_probe_output())
EIGHT = replace(H200, gpus=[replace(H200.gpus[0], index=i) for i in range(8)])


def inv(gpu: str):
    return parse_inventory(f"cluster: t\nnodes: [{{name: cp, address: 10.0.0.1, role: server}}, "
                           f"{{name: g, address: 10.0.0.2}}]\ngpu: {gpu}\n")


@pytest.mark.parametrize("gpu, facts, expected", [
    ("{sharing: {time_slicing: {replicas: 4}}}", H200, {"nvidia.com/gpu": 4}),
    ("{sharing: {time_slicing: {replicas: 4}}}", EIGHT, {"nvidia.com/gpu": 32}),
    ("{sharing: {time_slicing: {replicas: 2, rename_by_default: true}}}", H200, {"nvidia.com/gpu.shared": 2}),
    ("{sharing: {mps: {replicas: 3}}}", EIGHT, {"nvidia.com/gpu": 24}),
    ("{sharing: {mig: {layout: all-1g.18gb}}}", EIGHT, {"nvidia.com/gpu": 56}),
    # mig-parted's name for the 1g.18gb+me profile on every GPU (one such instance per GPU)
    ("{sharing: {mig: {layout: all-1g.18gb.me}}}", EIGHT, {"nvidia.com/gpu": 8}),
    ("{sharing: {mig: {layout: all-balanced, strategy: mixed}}}", H200,
     {"nvidia.com/mig-1g.18gb": 2, "nvidia.com/mig-2g.35gb": 1, "nvidia.com/mig-3g.71gb": 1}),
    ("{driver: preinstalled}", EIGHT, {"nvidia.com/gpu": 8}),
])
def test_expected_gpu_resources(gpu, facts, expected):
    inventory = inv(gpu)
    assert expected_gpu_resources(inventory, inventory.node("g"), facts) == expected


def test_nccl_bus_bandwidth_is_read_from_all_reduce_perf_output():
    log = "#  Out of bounds values : 0 OK\n# Avg bus bandwidth    : 187.234 \n#\n"
    assert parse_busbw(log) == pytest.approx(187.234)
    assert parse_busbw("no summary") is None


def test_table_has_one_row_per_check():
    table = render_table([CheckResult("gpu-pod", "PASS", "ok", "g"), CheckResult("pvc", "FAIL", "not bound")])
    assert table.splitlines()[0].startswith("PASS  gpu-pod:g") and "FAIL  pvc" in table


def test_nccl_job_has_one_worker_per_gpu_node_and_a_launcher(tmp_path):
    from bootstrap.cluster.checks import nccl_job

    inventory = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}, "
                                "{name: a, address: 10.0.0.2}, {name: b, address: 10.0.0.3}]\n"
                                "validate: {nccl: {min_busbw_gbps: 150}}\n")
    gpu_nodes = [inventory.node("a"), inventory.node("b")]
    job = nccl_job(inventory, gpu_nodes, {"a": EIGHT, "b": EIGHT})
    tasks = {t["name"]: t for t in job["spec"]["tasks"]}
    assert job["spec"]["minAvailable"] == 3 and tasks["worker"]["replicas"] == 2
    worker = tasks["worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert "-np 16 -npernode 8" in tasks["launcher"]["template"]["spec"]["containers"][0]["command"][2]


def test_volcano_jobs_validate_against_the_upstream_crd():
    import jsonschema
    import yaml
    from upstream import upstream

    from bootstrap.cluster.checks import gang_job, nccl_job

    crd = yaml.safe_load(upstream("volcano/1.15.1/crd/bases/batch.volcano.sh_jobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    inventory = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}, "
                                "{name: a, address: 10.0.0.2}, {name: b, address: 10.0.0.3}]\n"
                                "validate: {nccl: {min_busbw_gbps: 150}}\n")
    gpu_nodes, facts = [inventory.node("a"), inventory.node("b")], {"a": H200, "b": H200}
    for job in (nccl_job(inventory, gpu_nodes, facts), gang_job(inventory, gpu_nodes, facts)):
        jsonschema.validate(job, schema)
    assert gang_job(inventory, gpu_nodes, facts)["spec"]["minAvailable"] == 2


def test_validation_pods_and_claim_are_valid_kubernetes_objects():
    import kubernetes_validate

    from bootstrap.cluster.checks import _pod, on_nodes

    pod = _pod("gpu-test-g", "g", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", {"nvidia.com/gpu": 1})
    writer = _pod("pvc-writer", None, "busybox:1.36", command=["sh", "-c", "true"],
                  volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "validate-pvc"}}],
                  mounts=[{"name": "data", "mountPath": "/data"}])
    for obj in (pod, writer):
        kubernetes_validate.validate(obj, "1.33", strict=True)
    assert pod["spec"]["affinity"] == on_nodes(["g"]) and "nodeSelector" not in pod["spec"]  # by name: a kubelet writes its labels


def test_time_outs_name_what_was_awaited():
    from bootstrap.cluster.client import WaitTimeout, wait_for

    def never():
        never.last = "gpu-1 NotReady"
        return None
    never.last = None
    with pytest.raises(WaitTimeout) as caught:
        wait_for("nodes gpu-1 to be Ready", never, timeout_s=0.2, interval_s=0.05)
    assert "waiting for nodes gpu-1 to be Ready" in caught.value.message
    assert "last seen: gpu-1 NotReady" in caught.value.message


def test_a_wait_for_what_is_a_moment_away_looks_again_soon_then_less_often(monkeypatch):
    from bootstrap.cluster import client

    pauses = []
    monkeypatch.setattr(client.time, "sleep", pauses.append)  # (the clock's pauses only, no real wait)
    answers = iter([None] * 6 + ["ready"])
    assert client.wait_for("nodes to be Ready", lambda: next(answers), timeout_s=60, interval_s=2.0,
                           first_interval_s=0.25) == "ready"
    assert pauses == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]



# A pod's status is written by its node's kubelet: whatever shape a hostile node gives it.
KEYS = st.sampled_from(["state", "waiting", "reason", "message", "containerStatuses", "initContainerStatuses", "x"])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=20)


@given(st.dictionaries(KEYS, JSON, max_size=4))
def test_a_containers_waiting_reason_is_read_from_any_shape_a_node_writes(status):
    reason, message = _waiting(status)
    assert isinstance(reason, str) and isinstance(message, str)


def test_the_first_waiting_container_says_why_init_containers_first():
    status = {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}}],
              "initContainerStatuses": [{"state": {"terminated": {}}}, {"state": {"waiting": {"reason": "ErrImagePull",
                                                                                            "message": 7}}}]}
    assert _waiting(status) == ("ErrImagePull", "")
    assert _waiting({"containerStatuses": {"state": "x"}}) == ("", "")


def test_a_node_whose_mig_profiles_were_not_read_gets_a_request_not_an_index_error():
    # MIG mixed names the MIG resources from the node's own profile table; without one the
    # list was empty and the gang job and the GPU pods raised IndexError for the whole run.
    from bootstrap.cluster.checks import gang_job, gpu_request

    inventory = inv("{sharing: {mig: {layout: all-balanced, strategy: mixed}}}")
    unread = replace(H200, mig_profiles=[])
    assert expected_gpu_resources(inventory, inventory.node("g"), unread) == {}
    assert gpu_request(inventory, inventory.node("g"), unread) == "nvidia.com/gpu"
    assert gpu_request(inventory, inventory.node("g"), H200) == "nvidia.com/mig-1g.18gb"
    job = gang_job(inventory, [inventory.node("g")], {"g": unread})
    limits = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "1"}
