"""GPU health on test hosts: the nvidia-smi stand-in replays the real H200 recording on
gpu-ok and a degraded variant of it on gpu-bad (tests/fixtures/gpu-vm-h200-variants), whose
kernel log (the dmesg stand-in) holds an Xid 79. Preflight names gpu-bad, its GPU and the
fix; gpu.health strict leaves only gpu-bad out of `up`; with warn it joins but the acceptance
gate keeps it gated (gh-ok passes); `bootstrap health --cordon` cordons and gates it in the
cluster, `status` shows the verdicts and the gate, and a replacement of gh-ok joined by
`rebuild` passes the gate again."""

from pathlib import Path

import pytest
import yaml
from clirun import run_bootstrap
from labcharts import lab_charts
from labinv import write_inventory

import testhosts
from bootstrap.cluster.gate_rules import GATE_KEY, GATE_REASON

pytestmark = pytest.mark.hosts

VARIANTS = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-vm-h200-variants"
VARIANT = "remap-pending"


def degraded_files() -> dict:
    """The variant's recordings over the real ones, and a kernel log with an Xid 79."""
    files = {testhosts.GPU_FIXTURES_REMOTE + f.name: (f.read_text(), 0o644)
             for f in sorted((VARIANTS / VARIANT).iterdir()) if f.is_file()}
    files["/etc/bootstrap-standin/kmsg"] = ((VARIANTS / "dmesg-xid79.txt").read_text(), 0o644)
    return files


@pytest.fixture
def gpu_lab(lab, tmp_path, airgap):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    hosts = lab.start(["gh-cp", testhosts.HostSpec("gh-ok", gpu=True),
                       testhosts.HostSpec("gh-bad", gpu=True, extra_files=degraded_files())])
    repo = AptRepo([build_toolkit_deb(tmp_path / "debs")])
    try:
        yield {"hosts": {h.name: h for h in hosts}, "tmp": tmp_path, "lab": lab, "extra": {
            "k3s": {"airgap": str(airgap)}, "gpu": {"container_toolkit": {"apt_source": repo.source_line}},
            "charts": lab_charts(tmp_path / "charts"), "validate": {"timeout_s": 60}}}
    finally:
        repo.close()


def taint_keys(node: dict) -> list:
    return [t.get("key") for t in node["spec"].get("taints") or []]


def inventory(gpu_lab, health: str) -> Path:
    extra = yaml.safe_load(yaml.safe_dump(gpu_lab["extra"]))
    extra["gpu"]["health"] = health
    return write_inventory(gpu_lab["tmp"] / "inv.yaml", list(gpu_lab["hosts"].values()), extra=extra)


def test_a_degraded_gpu_is_named_strict_leaves_only_its_node_out_and_health_cordons_it(gpu_lab):
    hosts = gpu_lab["hosts"]
    warn = inventory(gpu_lab, "warn")
    facts = run_bootstrap("facts", warn, "--node", "gh-bad", timeout=300)
    assert facts.returncode == 0, facts.stderr
    assert "health" in facts.stdout and "remap" in facts.stdout.lower(), facts.stdout
    checked = run_bootstrap("check", warn, "--hosts", timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # warnings never block
    bad_lines = [line for line in checked.stdout.splitlines() if line.startswith("WARN gh-bad: gpu-health:")]
    assert any("GPU 0" in line and "Xid 79" in line for line in bad_lines), checked.stdout
    assert any("row remap" in line.lower() for line in bad_lines), checked.stdout
    assert "(gpu.health: strict would leave this node out)" in checked.stdout
    assert not [line for line in checked.stdout.splitlines() if line.startswith(("WARN gh-ok: gpu-health",
                                                                                 "FAIL gh-ok: gpu-health"))]

    strict = inventory(gpu_lab, "strict")
    up = run_bootstrap("up", strict, "--no-validate", timeout=900)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "FAILED gh-bad: GPU health:" in up.stderr, up.stdout + up.stderr
    assert "k3s" in hosts["gh-ok"].ssh("ls /usr/local/bin").stdout  # the others went on
    assert "k3s" not in hosts["gh-bad"].ssh("ls /usr/local/bin").stdout  # that node only was left out

    warn = inventory(gpu_lab, "warn")
    up = run_bootstrap("up", warn, "--no-validate", timeout=900)
    # gpu.health warn lets gh-bad join, but the acceptance gate holds it: its GPU health error
    # (the Xid 79) keeps the gate's taint on it, with the reason; gh-ok passed its checks.
    assert up.returncode == 1, up.stdout + up.stderr
    assert "gate: gh-ok: passed, takes workloads" in up.stdout, up.stdout
    assert "gate: gh-bad: not passed, stays gated: gpu-health:" in up.stdout, up.stdout
    assert "failed the acceptance gate and stay gated: gh-bad" in up.stdout + up.stderr
    from test_daytwo_hosts import api_nodes

    gated = api_nodes(warn)
    assert GATE_KEY in taint_keys(gated["gh-bad"]) and GATE_KEY not in taint_keys(gated["gh-ok"])
    assert "Xid 79" in gated["gh-bad"]["metadata"]["annotations"][GATE_REASON]
    health = run_bootstrap("health", warn, "--cordon", timeout=600)
    assert health.returncode == 1, health.stdout + health.stderr
    assert "gh-ok: ok (1 GPU(s))" in health.stdout, health.stdout
    assert "gh-bad: ERROR xid:" in health.stdout and "new since the last check: Xid 79" in health.stdout
    assert "gh-bad: cordoned (label bootstrap.k3s/gpu-health=error) and gated" in health.stdout

    nodes = api_nodes(warn)
    assert nodes["gh-bad"]["spec"].get("unschedulable") is True
    assert nodes["gh-bad"]["metadata"]["labels"]["bootstrap.k3s/gpu-health"] == "error"
    assert not nodes["gh-ok"]["spec"].get("unschedulable")
    assert GATE_KEY in taint_keys(nodes["gh-bad"]) and GATE_KEY not in taint_keys(nodes["gh-ok"])
    again = run_bootstrap("health", warn, "--burn-in", "10", timeout=900)
    assert "new since the last check" not in again.stdout, again.stdout  # the same Xid, seen already
    # The burn-in runs the n-body image through its own entrypoint on the healthy node's GPU
    # (the stand-in image refuses `nbody` by name, as the real one: not on PATH).
    assert "burn-in gh-ok GPU 0: 27000 GFLOP/s" in again.stdout, again.stdout + again.stderr
    assert "burn-in FAIL" not in again.stdout, again.stdout
    status = run_bootstrap("status", warn, timeout=300)
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines() if line.startswith("gh-")}
    assert "error" in rows["gh-bad"] and "ok" in rows["gh-ok"], status.stdout
    assert "gate gh-bad: failed, no workload pods: gpu-health:" in status.stdout, status.stdout
    assert not any(line.startswith("gate gh-ok") for line in status.stdout.splitlines()), status.stdout

    # A replacement machine under gh-ok's name joins through the gate too: k3s registers it
    # with the gate's taint (node-taint), and `rebuild` lifts it once its checks pass.
    hosts["gh-ok"].recreate(files=gpu_lab["lab"].gpu_files())
    assert run_bootstrap("forget-host", warn, "gh-ok").returncode == 0
    rebuild = run_bootstrap("rebuild", warn, "--no-validate", timeout=900)
    assert "gate: gh-ok: passed, takes workloads" in rebuild.stdout, rebuild.stdout + rebuild.stderr
    assert rebuild.returncode == 1 and "stay gated: gh-bad" in rebuild.stdout + rebuild.stderr  # still broken
    nodes = api_nodes(warn)
    new_id = hosts["gh-ok"].ssh("cat /etc/machine-id").stdout.strip()
    assert nodes["gh-ok"]["status"]["nodeInfo"]["machineID"] == new_id  # the replacement, registered anew
    assert GATE_KEY not in taint_keys(nodes["gh-ok"]) and GATE_KEY in taint_keys(nodes["gh-bad"])
