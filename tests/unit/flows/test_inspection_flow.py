"""`status` and `plan` in-process, with a fake session and cluster connection: what each
shows when a host does not answer and the API is unreachable."""

import contextlib
import json
from dataclasses import replace

import yaml
from fakes import FakeSession
from test_host_phase_flow import healthy_host

from bootstrap import progress
from bootstrap.cluster.client import ClusterError
from bootstrap.host.facts.host_facts import K3sInstall, SystemdUnit
from bootstrap.flows.inspection import cluster_status, planned_changes, render_status
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir


@contextlib.contextmanager
def api_unreachable(*_):
    raise ClusterError("the tunnel to cp failed")
    yield  # pragma: no cover


def lab(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "k3s": {"version": "v1.33.5+k3s1"}, "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def test_status_shows_a_silent_host_and_an_unreachable_api(tmp_path):
    inventory, state = lab(tmp_path)
    running = replace(healthy_host("cp"), k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                                        [SystemdUnit("k3s.service", "loaded", "active")]))
    session = FakeSession(inventory, {"cp": running}, unreachable=["a1"])
    report = cluster_status(inventory, state, progress.Console(progress.Reporter()),
                            open_session=lambda *a: contextlib.nullcontext(session), connect=api_unreachable)
    json.dumps(report)  # --json prints it as it is
    rows = {r["node"]: r for r in report["nodes"]}
    assert report["api"] is False and report["components"] == {}
    assert rows["a1"]["answers_ssh"] is False and rows["cp"]["k3s"] == "v1.33.5+k3s1"
    assert rows["cp"]["gpus"].startswith("1 x NVIDIA H200")
    text = "\n".join(render_status(report))
    assert "API unreachable" in text and "NO-SSH" in text
    assert "newest snapshot: none (`bootstrap snapshot` takes one)" in text
    assert "inventory:" not in text  # never applied by `up`


def test_plan_lists_each_hosts_changes_and_changes_nothing(tmp_path):
    inventory, state = lab(tmp_path)
    session = FakeSession(inventory, {"cp": healthy_host("cp"), "a1": healthy_host("a1")})
    lines = planned_changes(inventory, state, progress.Console(progress.Reporter()),
                            open_session=lambda *a: contextlib.nullcontext(session), connect=api_unreachable)
    assert lines[0] == "cp:" and any(line.startswith("  - ") for line in lines)
    assert "a1:" in lines
    assert any(line.startswith("component gpu-operator: install") for line in lines), lines
    assert session.executed == []  # a plan runs nothing on any host
    assert not (state.path / "token").exists()  # nor creates the join token
