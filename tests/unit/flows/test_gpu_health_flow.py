"""GPU health wired in: the probe's health sections parsed from the real H200 recording (and
a degraded variant), preflight's findings (warn reports, strict leaves the node out, off
skips, siblings decide the GPU count), `bootstrap health`'s Xid bookkeeping and render, the
status column, and the burn-in's judging of n-body output."""

import contextlib
import io
import re
from dataclasses import replace
from pathlib import Path

from fakes import FakeSession
from test_facts_parsers import from_fixture, h200_probe_output, section

from bootstrap import progress
from bootstrap.flows.gpu_health import check_health
from bootstrap.state.folder import StateDir
from bootstrap.host.facts.probe import PROBE_SCRIPT, parse_host_facts, probe_script
from bootstrap.inventory.loader import load_inventory, parse_inventory
from bootstrap.checks.preflight import gpu_health_findings, health_blocked
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them
from repo_paths import TESTS

VARIANTS = TESTS / "fixtures" / "gpu-vm-h200-variants"
XID79 = (VARIANTS / "dmesg-xid79.txt").read_text().splitlines()
BOOT = "0f4c1e5a-6b1e-4a53-9d62-2f8f1c1d2e3f"


def probe_output(variant: str | None = None, kernel_log=(), boot=BOOT) -> list[str]:
    out = h200_probe_output()
    xml = from_fixture("nvidia-smi-xml", "nvidia-smi-q-x.txt")
    if variant:
        body = (VARIANTS / variant / "nvidia-smi-q-x.txt").read_text().splitlines()[1:-1]
        xml = section("nvidia-smi-xml", body)
    return out + xml + from_fixture("nvidia-smi-nvlink", "nvidia-smi-nvlink.txt") \
        + from_fixture("nvidia-smi-topo", "nvidia-smi-topo.txt") + section("xid", [f"boot_id {boot}", *kernel_log])


def inventory(health="warn"):
    return parse_inventory(f"cluster: h\ngpu: {{health: {health}}}\nnodes:\n"
                           "  - {name: cp, address: 10.0.0.1, role: server}\n"
                           "  - {name: g1, address: 10.0.0.2}\n  - {name: g2, address: 10.0.0.3}\n")


def test_the_probe_asks_the_recorded_questions_only_when_health_is_on():
    for invocation in ("nvsmi -q -x", "nvsmi nvlink -s", "nvsmi topo -m"):
        assert invocation in PROBE_SCRIPT  # the nvidia-smi stand-in answers exactly these
    assert "BOOTSTRAP_HEALTH=1" in probe_script() and "BOOTSTRAP_HEALTH=0" in probe_script(health=False)
    facts = parse_host_facts(probe_output(kernel_log=XID79))
    assert len(facts.gpu_health) == 1 and facts.gpu_health[0].pcie_width_max == 16
    assert [x.xid for x in facts.xids] == [79] and facts.boot_id == BOOT
    plain = parse_host_facts(h200_probe_output())
    assert plain.gpu_health is None and plain.xids is None  # not probed: unknown, not healthy


def test_preflight_reports_in_warn_leaves_out_in_strict_and_skips_when_off():
    good = parse_host_facts(probe_output())
    bad = parse_host_facts(probe_output("remap-pending", XID79))
    facts = {"g1": good, "g2": bad}
    warn = gpu_health_findings(inventory(), facts, gpu_nodes(inventory(), facts))
    assert warn["g1"] == [] and {f.check for f in warn["g2"]} == {"gpu-health:remap", "gpu-health:xid"}
    assert all(f.severity == "warning" for f in warn["g2"])
    said = {f.check: "(gpu.health: strict would leave this node out)" in f.message for f in warn["g2"]}
    assert said == {"gpu-health:remap": False, "gpu-health:xid": True}  # a pending remap is only a warning
    strict = gpu_health_findings(inventory("strict"), facts, gpu_nodes(inventory("strict"), facts))
    assert set(health_blocked([f for fs in strict.values() for f in fs])) == {"g2"}
    assert "sudo nvidia-smi -r" in strict["g2"][0].fix
    assert [f.check for f in health_blocked([f for fs in strict.values() for f in fs])["g2"]] == ["gpu-health:xid"]
    assert gpu_health_findings(inventory("off"), facts, gpu_nodes(inventory("off"), facts)) == {}


def test_strict_keeps_a_node_whose_only_issue_is_a_pending_row_remap():
    """NVML (nvmlDeviceGetRemappedRows): a pending remap "won't affect future work on the GPU";
    only a remap failure is NVIDIA's replacement criterion."""
    pending = parse_host_facts(probe_output("remap-pending"))
    strict = gpu_health_findings(inventory("strict"), {"g1": pending}, gpu_nodes(inventory("strict"), {"g1": pending}))
    assert [(f.check, f.severity) for f in strict["g1"]] == [("gpu-health:remap", "warning")]
    assert health_blocked(strict["g1"]) == {}


def test_a_node_with_fewer_gpus_than_its_siblings_is_named_but_judged_by_its_own_answers():
    good = parse_host_facts(probe_output())
    two = replace(good, gpus=good.gpus * 2, gpu_health=good.gpu_health * 2)
    facts = {"g1": two, "g2": good}
    found = gpu_health_findings(inventory("strict"), facts, gpu_nodes(inventory("strict"), facts))
    assert [(f.check, f.severity) for f in found["g2"]] == [("gpu-health:gpu-count", "warning")] and found["g1"] == []
    assert "g1, with the same model, reports 2" in found["g2"][0].message and "gpu.count: 2" in found["g2"][0].fix
    assert health_blocked(found["g2"]) == {}


def hostile_inventory(count: str = "") -> str:
    return ("cluster: h\ngpu: {health: strict" + (f", count: {count}" if count else "") + "}\nnodes:\n"
            "  - {name: cp, address: 10.0.0.1, role: server}\n  - {name: g1, address: 10.0.0.2}\n"
            "  - {name: g2, address: 10.0.0.3}\n  - {name: liar, address: 10.0.0.4}\n")


def test_a_host_claiming_sixteen_gpus_blocks_no_honest_node():
    """Issue 32 item 12: the expected count was the most any node of the model reported."""
    good = parse_host_facts(probe_output())
    liar = replace(good, gpus=good.gpus * 16, gpu_health=good.gpu_health * 16)
    facts = {"g1": good, "g2": good, "liar": liar}
    inv = parse_inventory(hostile_inventory())
    found = gpu_health_findings(inv, facts, gpu_nodes(inv, facts))
    assert health_blocked([f for fs in found.values() for f in fs]) == {}
    assert {n: [f.severity for f in fs] for n, fs in found.items()} == \
        {"g1": ["warning"], "g2": ["warning"], "liar": []}


def test_the_gpu_count_is_the_inventorys_else_the_nodes_own_pci_bus():
    good = parse_host_facts(probe_output())
    assert sum(d.is_gpu for d in good.nvidia_pci) == len(good.gpus) == 1  # the recorded H200 VM: consistent
    pinned = parse_inventory(hostile_inventory("2"))
    found = gpu_health_findings(pinned, {"g1": good}, gpu_nodes(pinned, {"g1": good}))["g1"]
    assert [(f.check, f.severity) for f in found] == [("gpu-health:gpu-count", "health-error")]
    assert found[0].message == "1 GPU visible to nvidia-smi, 2 expected (gpu.count in the inventory)"
    # Unpinned: a GPU on the node's own PCI bus that nvidia-smi does not show is missing.
    lost = replace(good, nvidia_pci=good.nvidia_pci * 2)
    inv = parse_inventory(hostile_inventory())
    found = gpu_health_findings(inv, {"g1": lost}, gpu_nodes(inv, {"g1": lost}))["g1"]
    assert found[0].message == "1 GPU visible to nvidia-smi, 2 expected (NVIDIA GPUs on its own PCI bus)"
    assert found[0].severity == "health-error"
    per_node = parse_inventory(hostile_inventory("2").replace("{name: g1, address: 10.0.0.2}",
                                                                "{name: g1, address: 10.0.0.2, gpu: {count: 1}}"))
    assert gpu_health_findings(per_node, {"g1": good}, gpu_nodes(per_node, {"g1": good}))["g1"] == []


def test_health_counts_only_xids_it_has_not_seen_and_renders_each_issue():
    from bootstrap.flows.gpu_health import NodeHealth, new_since, render

    facts = parse_host_facts(probe_output("remap-pending", XID79))
    assert len(new_since({}, facts)) == 1
    seen = {"boot_id": BOOT, "last_xid_uptime_s": max(x.uptime_s for x in facts.xids)}
    assert new_since(seen, facts) == []
    assert len(new_since(dict(seen, boot_id="another-boot"), facts)) == 1  # rebooted: all are new
    findings = gpu_health_findings(inventory("strict"), {"g2": facts}, gpu_nodes(inventory("strict"), {"g2": facts}))["g2"]
    text = "\n".join(render([NodeHealth("g2", findings, facts.xids, 1), NodeHealth("g1", [], [], 1)]))
    assert "g2: WARN  remap: GPU 0" in text and "g2: ERROR xid: GPU 0" in text and "       fix: " in text
    assert "g2: new since the last check: Xid 79" in text and "g1: ok (1 GPU(s))" in text


def test_status_shows_the_last_verdict(tmp_path):
    import json

    from bootstrap.flows.gpu_health import RECORD, last_verdicts
    from bootstrap.flows.inspection import render_status

    class State:
        path = tmp_path

    (tmp_path / RECORD).write_text(json.dumps({"g1": {"verdict": "ok"}, "g2": {"verdict": "error"}}))
    assert last_verdicts(State()) == {"g1": "ok", "g2": "error"}
    row = {"role": "agent", "answers_ssh": True, "ready": "Ready", "cordoned": True, "k3s": "v1.33.5+k3s1",
           "gpus": "1 x NVIDIA H200", "driver": "570", "cuda": "12.8", "allocatable": {"nvidia.com/gpu": "1"}}
    report = {"cluster": "h", "state_dir": "/s", "api": True, "components": {}, "inventory_as_applied": None,
              "newest_snapshot": None, "nodes": [dict(row, node="g2", health="error")]}
    lines = render_status(report)
    assert "HEALTH" in lines[1] and lines[2].split()[-2:] == ["error", "nvidia.com/gpu=1"]


def nbody_log(gflops: float, model: str = "NVIDIA H200") -> str:
    """n-body's benchmark output (NVIDIA/cuda-samples nbody.cpp: main and _runBenchmark)."""
    return (f"> 1 Devices used for simulation\n> Compute 9.0 CUDA device: [{model}]\nnumber of bodies = 256000\n"
            f"256000 bodies, total time for 900 iterations: 59432.117 ms\n"
            f"= 992.317 billion interactions per second\n"
            f"= {gflops:.3f} single-precision GFLOP/s at 20 flops per interaction\n")


def test_burn_in_names_the_slow_gpu_and_a_gpu_that_gave_nothing():
    from bootstrap.cluster.burn_in import device, judge, throughputs

    logs = {0: nbody_log(14050), 1: nbody_log(9100), 2: "/bin/sh: 1: nbody: not found\n"}
    measured = {"g1": throughputs(logs), "g2": {0: 14050.0, 1: 13900.0}}
    assert measured["g1"] == {0: 14050.0, 1: 9100.0} and device(logs[0]) == "NVIDIA H200"
    verdict = judge(measured, {"g1": 3, "g2": 2, "g3": 1})
    assert [(n, g) for n, g, _, _ in verdict["slow"]] == [("g1", 1)]
    assert any(line.startswith("g1: GPU slot 1 ran at 9100 GFLOP/s, 79% of its siblings' median 11575 on this node")
               for line in verdict["failed"])
    assert "g1: no n-body result from GPU slot 2" in verdict["failed"]
    assert "g3: no n-body result from GPU slot 0" in verdict["failed"]
    # each GPU against its own model: an L4 is not slow next to H200s
    mixed = judge({"g1": {0: 14000.0, 1: 14100.0}, "g2": {0: 3000.0}}, {"g1": 2, "g2": 1},
                  {"g1": {0: "NVIDIA H200", 1: "NVIDIA H200"}, "g2": {0: "NVIDIA L4"}})
    assert mixed["failed"] == []


def test_burn_in_runs_the_images_own_entrypoint_with_arguments_one_container_per_gpu():
    """The k8s-samples image's binary is /cuda-samples/nbody behind ENTRYPOINT
    ["/cuda-samples/sample"], not on PATH (NVIDIA/k8s-samples deployments/container/Dockerfile):
    a shell running `nbody` never produced a result."""
    from bootstrap.cluster.burn_in import Slots, burn_in_pod, iterations, pod_name
    from bootstrap.cluster.checks import on_nodes

    pod = burn_in_pod("g1", Slots("nvidia.com/gpu", 2), 60)
    containers = pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["gpu-0", "gpu-1"]
    for container in containers:
        assert "command" not in container  # the image's ENTRYPOINT runs
        assert container["args"] == ["-benchmark", "-numbodies=256000", f"-i={iterations(60)}"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["spec"]["affinity"] == on_nodes(["g1"]) and "nodeSelector" not in pod["spec"]  # by name: a kubelet writes its labels
    assert iterations(60) == 900 and iterations(1) == 15
    long_name = "gpu-" + "a" * 240 + ".example"
    name = pod_name(long_name)
    assert len(name) <= 63 and name != pod_name(long_name[:-1]) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?",
                                                                                 name)
    assert burn_in_pod(long_name, Slots("nvidia.com/gpu", 1), 60)["metadata"]["name"] == name


def test_the_health_command_line():
    from bootstrap.cli import build_parser

    args = build_parser().parse_args(["health", "inv.yaml", "--cordon", "--burn-in", "60", "--json"])
    assert (args.cordon, args.burn_in, args.json) == (True, 60, True)
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["health", "inv.yaml", "--burn-in", "5"])


def test_health_runs_on_a_run_and_reports_a_host_that_did_not_answer(tmp_path):
    """`bootstrap health` on a `Run` like the other flows: its GPU nodes from the run's
    topology, its FAILED lines through the one reporter."""
    path = tmp_path / "inv.yaml"
    path.write_text("cluster: h\nstate_dir: state\ngpu: {health: warn}\n"
                    "nodes:\n  - {name: cp, address: 10.0.0.1, role: server, gpu: {enabled: false}}\n"
                    "  - {name: g1, address: 10.0.0.2}\n  - {name: g2, address: 10.0.0.3}\n")
    inv = load_inventory(path)
    facts = {"cp": replace(parse_host_facts(h200_probe_output()), gpus=[]),
             "g1": parse_host_facts(probe_output()), "g2": parse_host_facts(probe_output("remap-pending", XID79))}
    session = FakeSession(inv, facts, unreachable=["g2"])
    err = io.StringIO()
    results = check_health(inv, StateDir(inv), progress.Console(progress.Reporter(io.StringIO()), err),
                           open_session=lambda *a: contextlib.nullcontext(session))
    assert [(r.node, r.verdict) for r in results] == [("g1", "ok")]
    assert "FAILED g2" in err.getvalue()
