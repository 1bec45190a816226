"""`up`'s cluster half in-process: `cluster_phase` against the sandboxed stand-in API (the
built k3s stand-in on 127.0.0.1, tests/sandbox.py) through
an injected `connect`, with the recording Helm. What a first apply changes, and that a
second one on the converged cluster changes nothing and calls Helm no more."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from test_host_phase_flow import healthy_host
from sandbox import Cluster, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap import progress
from bootstrap.cluster.apply import DIGESTS_PATH
from bootstrap.cluster.client import Cluster as ApiCluster, warm_connections
from bootstrap.cluster.read_ahead import READS_FILE, remembered
from bootstrap.flows.cluster_side import cluster_phase
from bootstrap.flows.run import Run
from bootstrap.host.facts.host_facts import ContainerdConfig, RdmaDevice
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir
from repo_paths import TESTS

RECORDER = TESTS / "standins" / "helm_recorder.py"


@pytest.fixture
def helm_calls(tmp_path, monkeypatch):
    program = tmp_path / "bin" / "helm"
    program.parent.mkdir()
    shutil.copy(RECORDER, program)
    program.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("BOOTSTRAP_HELM", str(program))
    monkeypatch.setenv("HELM_RECORD", str(record))
    return lambda: [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("gpu-1", gpus=1)  # as many as its facts (the recording) show: the acceptance gate checks capacity
    sandbox.wait_ready("cp-1", "gpu-1")
    yield sandbox
    sandbox.stop()


def inventory_for(tmp_path, **gpu):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({"cluster": "flow", "state_dir": "state", "nodes": [
        {"name": "cp-1", "address": "10.0.0.1", "role": "server", "gpu": {"enabled": False}},
        {"name": "gpu-1", "address": "10.0.0.2", "labels": {"pool": "h200"},
         "gpu": {"sharing": {"time_slicing": {"replicas": 4}}, **gpu}}]}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)



def applied_once(lab, tmp_path, inventory, state, facts) -> str:
    """One cluster_phase that changed something; what it said."""
    @contextlib.contextmanager
    def connect(inv, st):
        yield ApiCluster(lab.api, tmp_path / "kubeconfig")

    out = io.StringIO()
    assert cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(out)), connect),
                         validate=False)
    return out.getvalue()


def a_run(inventory, state, facts, console, connect) -> Run:
    run = Run(inventory, state, console, connect=connect)
    run.set_facts(facts)
    return run


def test_a_first_apply_labels_installs_and_a_second_changes_nothing(lab, helm_calls, tmp_path):
    inventory, state = inventory_for(tmp_path)
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[]), "gpu-1": healthy_host("gpu-1")}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("# Helm's kubeconfig; the recording Helm only passes it on\n")
    connected = []

    @contextlib.contextmanager
    def connect(inv, st):
        assert (inv, st) == (inventory, state)
        connected.append(1)
        yield ApiCluster(lab.api, kubeconfig)

    out = io.StringIO()
    changed = cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(out)), connect),
                            validate=False)
    assert changed and connected
    first = helm_calls()
    # Releases the tool never applied: `helm install` (no history read first)
    releases = {call["argv"][1] for call in first if call["argv"][0] == "install"}
    assert "gpu-operator" in releases, first
    labels = lab.node("gpu-1").metadata.labels
    assert labels["pool"] == "h200"
    assert "cluster: " in out.getvalue() and "release(s) applied" in out.getvalue()

    again = io.StringIO()
    changed = cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(again)), connect),
                            validate=False, hosts_changed=False)
    assert not changed
    assert "cluster: no change" in again.getvalue()
    assert len(helm_calls()) == len(first), "a converged cluster calls Helm again"


def test_a_release_a_killed_helm_left_pending_is_recovered_and_said(lab, helm_calls, tmp_path):
    """A pending-install Helm never finished (an earlier run's Helm killed at its time-out):
    `install` meets the name in use, `upgrade --install` the pending mark; it was never
    deployed, so it is uninstalled and installed again, and the run says so."""
    inventory, state = inventory_for(tmp_path)
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[]), "gpu-1": healthy_host("gpu-1")}
    history = tmp_path / "record.jsonl.history"
    history.mkdir()
    (history / "gpu-operator.json").write_text(json.dumps(
        [{"revision": 1, "status": "pending-install", "updated": "2026-01-01T00:00:00Z"}]))

    out = applied_once(lab, tmp_path, inventory, state, facts)
    verbs = [c["argv"][:2] for c in helm_calls() if "gpu-operator" in c["argv"][:3]]
    assert verbs == [["install", "gpu-operator"], ["upgrade", "--install"], ["history", "gpu-operator"],
                     ["uninstall", "gpu-operator"], ["upgrade", "--install"]]
    assert "release gpu-operator was left pending-install at revision 1" in out
    assert "never deployed, so it is uninstalled and installed again" in out


def test_a_changed_sharing_setting_upgrades_only_what_it_touches(lab, helm_calls, tmp_path):
    inventory, state = inventory_for(tmp_path)
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[]), "gpu-1": healthy_host("gpu-1")}

    @contextlib.contextmanager
    def connect(inv, st):
        yield ApiCluster(lab.api, tmp_path / "kubeconfig")

    console = progress.Console(progress.Reporter(io.StringIO()))
    cluster_phase(a_run(inventory, state, facts, console, connect), validate=False)
    before = len(helm_calls())
    inventory, state = inventory_for(tmp_path, sharing={"time_slicing": {"replicas": 8}})
    out = io.StringIO()
    assert cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(out)), connect),
                         validate=False, hosts_changed=False)
    assert "no change" not in out.getvalue()
    # The sharing config lives in an object the operator's device plugin reads, not in a
    # release's values: what changed is named, and no release is re-applied for it.
    assert len(helm_calls()) == before, helm_calls()[before:]


def test_a_run_whose_hosts_did_not_change_compares_what_was_read_ahead(lab, helm_calls, tmp_path, monkeypatch):
    """The cluster side keeps the paths it compared; the next run reads them on the connection
    made while the hosts are probed, and when no host changed compares those answers without
    reading again. When a host changed they are read again (k3s may have changed them)."""
    inventory, state = inventory_for(tmp_path)
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[]), "gpu-1": healthy_host("gpu-1")}
    clusters = []

    @contextlib.contextmanager
    def connect(inv, st):
        yield clusters[-1]

    def read_ahead():
        ahead = ApiCluster(lab.api, tmp_path / "kubeconfig")
        warm_connections(ahead, remembered(state))
        clusters.append(ahead)
        return ahead

    clusters.append(ApiCluster(lab.api, tmp_path / "kubeconfig"))
    cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(io.StringIO())), connect),
                  validate=False)
    paths = remembered(state)
    assert paths[0] == "/api/v1/nodes" and DIGESTS_PATH in paths and len(paths) > 3
    written = (state.path / READS_FILE).stat().st_mtime_ns
    ahead = read_ahead()
    assert sorted(ahead.prefetched) == sorted(paths) and ahead.prefetched[DIGESTS_PATH] is not None
    gets = []
    real = lab.api.call_api  # the kubernetes client's, watched: which paths the cluster side reads

    def call_api(path, method, *a, **kw):
        gets.append(path) if method == "GET" else None
        return real(path, method, *a, **kw)

    monkeypatch.setattr(lab.api, "call_api", call_api)
    out = io.StringIO()
    assert not cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(out)), connect),
                             validate=False, hosts_changed=False)
    assert "cluster: no change" in out.getvalue() and not set(gets) & set(paths), gets
    assert (state.path / READS_FILE).stat().st_mtime_ns == written  # the same paths: not written again
    read_ahead()
    gets.clear()
    cluster_phase(a_run(inventory, state, facts, progress.Console(progress.Reporter(io.StringIO())), connect),
                  validate=False, hosts_changed=True)
    assert set(paths) <= set(gets)


@pytest.mark.parametrize("text", ["not json", '{"a": 1}', '["/api/v1/nodes", 7, "http://elsewhere/x", "/api/../etc"]',
                                  json.dumps(["/api/v1/nodes"] * 300)])
def test_a_reads_file_not_as_written_reads_nothing_ahead(tmp_path, text):
    _, state = inventory_for(tmp_path)
    state.ensure()
    (state.path / READS_FILE).write_text(text)
    assert remembered(state) in ([], ["/api/v1/nodes"])


def test_a_reads_file_that_is_a_symlink_is_not_followed(tmp_path):
    _, state = inventory_for(tmp_path)
    state.ensure()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('["/api/v1/nodes"]')
    (state.path / READS_FILE).symlink_to(elsewhere)
    assert remembered(state) == []


def test_an_agent_claiming_another_cni_bin_dir_is_named_and_the_cluster_side_goes_on(lab, helm_calls, tmp_path):
    """Issue 32: gpu-1's agent reports another containerd CNI bin dir and InfiniBand on an
    Ethernet name. Before, the plan raised for the whole cluster; now Multus gets the
    server's bin dir, gpu-1 alone is labelled out of RDMA, and the run says why."""
    path = tmp_path / "rdma.yaml"
    path.write_text(yaml.safe_dump({"cluster": "flow", "state_dir": "state", "gpu": {"gate": False},
                                    "network": {"rdma": {"interfaces": ["ens1f0np0"]}}, "nodes": [
        {"name": "cp-1", "address": "10.0.0.1", "role": "server", "gpu": {"enabled": False}},
        {"name": "gpu-1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    cni = "/var/lib/rancher/k3s/data/cni"
    liar = RdmaDevice("mlx5_1", 1, "InfiniBand", "ACTIVE", ["ens1f0np0"])
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[], containerd=ContainerdConfig(["runc"], cni)),
             "gpu-1": replace(healthy_host("gpu-1"), containerd=ContainerdConfig(["runc", "nvidia"], "/tmp/evil"),
                              rdma=[liar])}

    out = applied_once(lab, tmp_path, inventory, state, facts)
    multus = [c for c in helm_calls() if c["argv"][:2] in (["install", "multus"], ["upgrade", "--install"])
              and "multus" in c["argv"][:3]]
    assert multus and all(cni in json.dumps(c) and "/tmp/evil" not in json.dumps(c) for c in multus)
    labels = lab.node("gpu-1").metadata.labels
    assert labels["node-restriction.kubernetes.io/bootstrap.k3s-rdma"] == "false"
    assert lab.node("cp-1").metadata.labels["node-restriction.kubernetes.io/bootstrap.k3s-rdma"] == "true"
    assert "rdma: gpu-1 is left out of RDMA" in out and "ens1f0np0 as InfiniBand" in out
