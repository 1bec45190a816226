"""Preflight on facts parsed from real output (the H200 fixture) and small variations."""

from dataclasses import replace

import pytest
from test_facts_parsers import h200_probe_output

from bootstrap.host.facts.host_facts import ListeningPort, RdmaDevice
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks.preflight import preflight
from bootstrap.checks import cuda, mig

H200 = replace(parse_host_facts(h200_probe_output()), has_systemd=True, init_process="systemd",
               sudo_ok=True, hostname="gpu-1", disk_free_gib={"/": 200.0, "/var/lib/rancher": 200.0})
CPU = replace(H200, gpus=[], mig_profiles=[], nvidia_pci=[], driver_version=None, cuda_version=None,
              hostname="cp-1")


def inventory(extra: str = "", gpu_node: str = "") -> str:
    return parse_inventory(f"""\
cluster: t
nodes:
  - {{name: cp-1, address: 10.0.0.1, role: server}}
  - {{name: gpu-1, address: 10.0.0.2{gpu_node}}}
{extra}""")


def errors(inv, facts=None):
    found = preflight(inv, facts or {"cp-1": CPU, "gpu-1": H200})
    return [f for f in found if f.severity == "error"]


def test_h200_with_cuda_12_4_passes_and_prints_versions():
    inv = inventory('gpu: {cuda: "12.4"}')
    found = preflight(inv, {"cp-1": CPU, "gpu-1": H200})
    assert [f for f in found if f.severity == "error"] == []
    info = [f for f in found if f.check == "gpu"]
    assert "driver 580.159.04, CUDA 13.0" in info[0].message


def test_cuda_13_1_needs_a_590_driver():
    (finding,) = errors(inventory('gpu: {cuda: "13.1"}'))
    assert finding.node == "gpu-1" and finding.check == "cuda"
    assert "580.159.04" in finding.message and "590.44.01" in finding.message
    assert "590" in finding.fix


@pytest.mark.parametrize("cuda_version, ok", [("12.0", True), ("13.0", True), ("13.2", False), ("13.4", False)])
def test_cuda_table_against_the_h200_driver(cuda_version, ok):
    assert (cuda.driver_problem("580.159.04", cuda_version, "13.0") is None) == ok


def test_old_driver_for_12_8():
    assert "570.26" in cuda.driver_problem("550.54.14", "12.8", "12.4")
    assert cuda.driver_problem("570.124.06", "12.8", "12.8") is None


@pytest.mark.parametrize("layout", ["all-1g.18gb", "all-3g.71gb", "all-7g.141gb", "all-balanced", "all-disabled"])
def test_mig_layouts_that_fit_the_h200(layout):
    inv = inventory(f"gpu: {{sharing: {{mig: {{layout: {layout}, strategy: mixed}}}}}}")
    assert errors(inv) == []


def test_mig_layout_of_another_gpu_is_refused_naming_the_real_profiles():
    inv = inventory("gpu: {sharing: {mig: {layout: all-1g.10gb}}}")  # an H100-80GB layout
    (finding,) = errors(inv)
    assert finding.check == "mig" and "no 1g.10gb profile" in finding.message
    assert "1g.18gb x7" in finding.fix and "7g.141gb x1" in finding.fix


def test_mig_profiles_that_exceed_counts_or_slices():
    too_many = inventory("gpu: {sharing: {mig: {profiles: {3g.71gb: 3}}}}")
    assert "at most 2" in errors(too_many)[0].message
    overlap = inventory("gpu: {sharing: {mig: {profiles: {4g.71gb: 1, 3g.71gb: 1, 1g.18gb: 1}, strategy: mixed}}}")
    assert "compute slices" in errors(overlap)[0].message or "do not fit" in errors(overlap)[0].message


def test_mig_placements_decide_fit():
    table = mig.table_for_gpu(H200.mig_profiles)
    # 4g (slices 0-3) + 2 x 1g.35gb (2 slices each at 4 and 6): fits exactly.
    placed = mig.place(mig.Counter({"4g.71gb": 1, "1g.35gb": 2}), table)
    assert sorted((s, z) for _, s, z in placed) == [(0, 4), (4, 2), (6, 2)]
    # 3 x 2g.35gb take 0-1, 2-3, 4-5; a 3g.71gb (at 0 or 4, size 4) no longer fits.
    with pytest.raises(mig.MigMisfit):
        mig.place(mig.Counter({"2g.35gb": 3, "1g.35gb": 1, "3g.71gb": 1}), table)


def test_mig_on_a_non_mig_gpu():
    rtx = replace(H200, mig_profiles=[], gpus=[replace(H200.gpus[0], name="NVIDIA RTX 4090",
                                                       mig_current=None, mig_pending=None)])
    inv = inventory("gpu: {sharing: {mig: {layout: all-1g.18gb}}}")
    (finding,) = errors(inv, {"cp-1": CPU, "gpu-1": rtx})
    assert "not MIG-capable" in finding.message


def test_host_problems_all_reported_at_once():
    bad = replace(CPU, os_id="centos", os_version_id="7", os_pretty="CentOS 7", arch="ppc64le",
                  has_systemd=False, init_process="tini", disk_free_gib={"/": 2.0},
                  listening_ports=[ListeningPort("tcp", 6443, "0.0.0.0", "nginx", 10)])
    checks = {f.check for f in errors(inventory(), {"cp-1": bad, "gpu-1": H200})}
    assert {"os", "arch", "machine", "disk", "ports"} <= checks


def test_port_owned_by_k3s_is_fine():
    ours = replace(CPU, listening_ports=[ListeningPort("tcp", 6443, "*", "k3s", 10)])
    assert errors(inventory(), {"cp-1": ours, "gpu-1": H200}) == []


def test_preinstalled_mode_without_driver():
    no_driver = replace(H200, gpus=[], mig_profiles=[], driver_version=None, cuda_version=None)
    (finding,) = errors(inventory(gpu_node=", gpu: {enabled: true}"), {"cp-1": CPU, "gpu-1": no_driver})
    assert finding.check == "driver" and "gpu.driver: host" in finding.fix


def test_operator_mode_refuses_a_host_driver():
    (finding,) = errors(inventory("gpu: {driver: operator}"))
    assert "driver container" in finding.message


def test_duplicate_hostnames_are_a_warning_that_stops_no_node():
    """A hostname is the host's own word: a rented agent copying the server's ("ubuntu") had
    failed the server's preflight, and with it the run. k3s goes by node-name, the inventory's."""
    facts = {"cp-1": replace(CPU, hostname="ubuntu"), "gpu-1": replace(H200, hostname="ubuntu")}
    assert errors(inventory(), facts) == []
    found = [f for f in preflight(inventory(), facts) if f.check == "hostname"]
    assert {(f.node, f.severity) for f in found} == {("cp-1", "warning"), ("gpu-1", "warning")}
    assert "inventory name" in found[0].message


def test_rdma_interfaces_must_have_a_device():
    inv = inventory("network: {rdma: {interfaces: [ibp26s0]}}", gpu_node=", gpu: {enabled: true}")
    assert errors(inv)[0].check == "rdma"
    with_ib = replace(H200, rdma=[RdmaDevice("mlx5_0", 1, "InfiniBand", "4: ACTIVE", ["ibp26s0"])])
    assert errors(inv, {"cp-1": CPU, "gpu-1": with_ib}) == []


def test_kernel_owned_vxlan_port_is_ours_when_k3s_is_installed():
    from bootstrap.host.facts.host_facts import K3sInstall, SystemdUnit

    vxlan = [ListeningPort("udp", 8472, "0.0.0.0", None, None)]
    stranger = replace(CPU, listening_ports=vxlan)
    assert [f.check for f in errors(inventory(), {"cp-1": stranger, "gpu-1": H200})] == ["ports"]
    ours = replace(stranger, k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                            [SystemdUnit("k3s.service", "loaded", "inactive", "enabled")]))
    assert errors(inventory(), {"cp-1": ours, "gpu-1": H200}) == []
