"""What validate expects a node to advertise, and how it reads NCCL output."""

from dataclasses import replace

import pytest
from test_facts_parsers import h200_probe_output

from bootstrap.cluster.validate import CheckResult, expected_gpu_resources, parse_busbw, render_table
from bootstrap.facts.probe import parse_host_facts
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
