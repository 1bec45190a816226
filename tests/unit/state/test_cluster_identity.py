"""A cluster's identity: one state folder per cluster, hosts and snapshots carry its id.

Each test here fails on the code before identities: two inventories shared one folder,
`state_dir` pointing at /etc or ~ was chmod'ed and written into, any host was wiped,
snapshots of another cluster were pruned and restored.
"""

import os
import stat
import time

import pytest
import yaml

from kubeconfigs import K3S_YAML

from bootstrap.state import snapshots
from bootstrap.cluster import kubeconfig_file as kc
from bootstrap.cluster.liveness import service_verdict
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.inventory.loader import load_inventory
from bootstrap.checks.preflight import ownership_findings
from bootstrap.checks.ownership import ownership
from bootstrap.state.folder import IDENTITY, StateDir


def inventory_file(path, cluster="solo", state_dir=None, address="203.0.113.10"):
    data = {"cluster": cluster, "nodes": [{"name": "box-1", "address": address, "role": "server"}]}
    if state_dir:
        data["state_dir"] = str(state_dir)
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOTSTRAP_STATE_HOME", str(tmp_path / "state-home"))


def test_the_first_command_creates_a_private_folder_with_an_id(tmp_path):
    state = StateDir(inventory_file(tmp_path / "a.yaml"))
    state.ensure()
    assert stat.S_IMODE(state.path.stat().st_mode) == 0o700
    assert len(state.cluster_id) == 16
    assert stat.S_IMODE((state.path / IDENTITY).stat().st_mode) == 0o600
    assert StateDir(load_inventory(tmp_path / "a.yaml")).cluster_id == state.cluster_id


def test_a_second_inventory_with_the_same_cluster_name_is_refused(tmp_path):
    StateDir(inventory_file(tmp_path / "a.yaml")).ensure()
    other = StateDir(inventory_file(tmp_path / "b.yaml", address="203.0.113.99"))
    with pytest.raises(UsageError) as caught:
        other.ensure()
    assert "a.yaml" in caught.value.message and "state_dir" in caught.value.hint
    assert not (other.path / "token").exists()


def test_an_edited_copy_naming_the_same_servers_is_the_same_cluster(tmp_path):
    """`plan` of a copy with one change (a chart version) must not need a second folder."""
    first = StateDir(inventory_file(tmp_path / "a.yaml"))
    first.ensure()
    copy = StateDir(inventory_file(tmp_path / "a-preview.yaml"))
    assert copy.cluster_id == first.cluster_id
    assert "a-preview" not in (first.path / IDENTITY).read_text()  # the original keeps the folder


def test_a_shared_state_dir_with_another_cluster_name_is_refused(tmp_path):
    shared = tmp_path / "shared"
    StateDir(inventory_file(tmp_path / "a.yaml", cluster="alpha", state_dir=shared)).ensure()
    with pytest.raises(UsageError, match="belongs to cluster 'alpha'"):
        StateDir(inventory_file(tmp_path / "b.yaml", cluster="beta", state_dir=shared)).ensure()


def test_a_moved_inventory_keeps_its_cluster(tmp_path):
    first = StateDir(inventory_file(tmp_path / "a.yaml", state_dir=tmp_path / "st"))
    first.ensure()
    (tmp_path / "a.yaml").rename(tmp_path / "renamed.yaml")
    moved = StateDir(load_inventory(tmp_path / "renamed.yaml"))
    assert moved.cluster_id == first.cluster_id
    assert "renamed.yaml" in (moved.path / IDENTITY).read_text()


@pytest.mark.parametrize("where", ["etc-like", "home-like"])
def test_an_existing_folder_with_other_files_is_refused_and_keeps_its_mode(tmp_path, where):
    folder = tmp_path / where
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    (folder / ("passwd" if where == "etc-like" else ".bashrc")).write_text("x")
    state = StateDir(inventory_file(tmp_path / "a.yaml", state_dir=folder))
    with pytest.raises(UsageError, match="not a bootstrap state folder"):
        state.ensure()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert sorted(p.name for p in folder.iterdir()) == ["passwd" if where == "etc-like" else ".bashrc"]


def test_an_empty_folder_is_used_but_its_mode_is_left_alone(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    os.chmod(folder, 0o750)
    state = StateDir(inventory_file(tmp_path / "a.yaml", state_dir=folder))
    state.write_secret("token", "t\n")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750
    assert stat.S_IMODE((folder / "token").stat().st_mode) == 0o600


def test_a_state_folder_from_before_identities_is_adopted_with_its_snapshots(tmp_path):
    folder = tmp_path / "old"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "token").write_text("t\n")
    (folder / "snapshots" / "bootstrap-20261101-101010-cp-1-1790000000").write_text("snap")
    (folder / "snapshots" / "bootstrap-20261101-101010-cp-1-1790000000.token").write_text("t")
    state = StateDir(inventory_file(tmp_path / "a.yaml", state_dir=folder))
    newest = snapshots.newest(state)
    assert newest is not None and newest.name.startswith(f"bootstrap-{state.cluster_id}-20261101-101010")
    assert (newest.path.parent / (newest.name + ".token")).exists()


def test_snapshots_of_another_cluster_are_never_listed_or_pruned(tmp_path):
    state = StateDir(inventory_file(tmp_path / "a.yaml"))
    folder = snapshots.local_dir(state)
    other = folder / "bootstrap-ffffffffffffffff-20261101-000000-cp-1-1790000000"
    other.write_text("another cluster's")
    mine = []
    for index in range(3):
        path = folder / f"bootstrap-{state.cluster_id}-2026110{index + 1}-000000-box-1-179000000{index}"
        path.write_text("mine")
        os.utime(path, (time.time() - 100 + index, time.time() - 100 + index))
        mine.append(path)
    assert [s.path for s in snapshots.local_snapshots(state)] == mine
    snapshots.prune(state, keep=1)
    assert other.exists() and not mine[0].exists() and not mine[1].exists() and mine[2].exists()


@pytest.mark.parametrize("name", [
    "bootstrap-0123456789abcdef-20261101-000000-cp-1-1790000000; rm -rf /",
    "bootstrap-0123456789abcdef-20261101-000000-cp-1-1790000000/../../etc",
    "bootstrap-0123456789abcdef-20261101-000000-$(id)-1790000000",
    "on-demand-cp-1-1790000000",
])
def test_only_names_of_the_tools_own_pattern_are_snapshots(name):
    assert not snapshots.is_ours(name, "0123456789abcdef")


def test_names_k3s_gives_our_snapshots_match():
    # k3s appends "-<node name>-<unix time>" to --name (k3s-io/k3s pkg/etcd/snapshot.go).
    assert snapshots.is_ours("bootstrap-0123456789abcdef-20261101-000000-rs-cp2-1790000000", "0123456789abcdef")
    assert snapshots.is_ours("bootstrap-0123456789abcdef-20261101-000000-cp-1-1790000000.zip", "0123456789abcdef")


# --- whose host is it ---------------------------------------------------------------------

K3S = K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", "active")])


@pytest.mark.parametrize("facts, verdict", [
    (HostFacts(manifest={"cluster_id": "aaaaaaaaaaaaaaaa", "files": []}), "ours"),
    (HostFacts(manifest={"files": ["/etc/rancher/k3s/config.yaml"]}, k3s=K3S), "ours"),  # before ids
    (HostFacts(manifest={"cluster_id": "bbbbbbbbbbbbbbbb", "cluster": "other"}, k3s=K3S), "foreign"),
    (HostFacts(k3s=K3S), "foreign"),  # a k3s installed by hand
    (HostFacts(), "empty"),
])
def test_ownership(facts, verdict):
    assert ownership(facts, "aaaaaaaaaaaaaaaa").verdict == verdict


def test_up_refuses_a_host_of_another_cluster_at_preflight(tmp_path):
    inventory = inventory_file(tmp_path / "a.yaml")
    found = ownership_findings(inventory, {"box-1": HostFacts(manifest={"cluster_id": "bbbbbbbbbbbbbbbb", "cluster": "x"})},
                               "aaaaaaaaaaaaaaaa")
    assert [(f.node, f.severity) for f in found] == [("box-1", "error")]
    assert "another cluster" in found[0].message and "'x'" in found[0].message


# --- kubeconfig merge ---------------------------------------------------------------------



def test_merge_never_overwrites_another_cluster_of_the_same_name(tmp_path):
    inventory = inventory_file(tmp_path / "a.yaml")
    target = tmp_path / "kube" / "config"
    kc.merge_into(target, yaml.safe_load(kc.rewrite(K3S_YAML, inventory, "aaaa")))
    kc.merge_into(target, yaml.safe_load(kc.rewrite(K3S_YAML, inventory, "aaaa")))  # the same cluster again: fine
    before = target.read_text()
    with pytest.raises(BootstrapError, match="another cluster of the same name"):
        kc.merge_into(target, yaml.safe_load(kc.rewrite(K3S_YAML, inventory, "bbbb")))
    assert target.read_text() == before
    assert kc.cluster_id_of(yaml.safe_load(before)["clusters"][0]) == "aaaa"


# --- is the control plane lost? -----------------------------------------------------------

def test_a_server_that_answers_ssh_with_k3s_active_is_asked_at_the_port(tmp_path):
    inventory = inventory_file(tmp_path / "a.yaml")
    node = inventory.nodes[0]
    assert service_verdict(node, None).answers is False
    assert service_verdict(node, HostFacts()).answers is False
    stopped = K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", "failed")])
    assert "failed" in service_verdict(node, HostFacts(k3s=stopped)).reason
    assert service_verdict(node, HostFacts(k3s=K3S)) is None  # running: only the API port decides


# --- what reaches the terminal ---------------------------------------------------------------

def test_host_and_usage_errors_escape_what_a_terminal_would_act_on():
    from bootstrap.remote.session import HostFailure

    error = BootstrapError("k3s said: \x1b[2Jall checks passed", "line one\nline two \u202e")
    assert "\x1b" not in error.render() and "\\x1b[2J" in error.render()
    assert error.render().splitlines()[1:] == ["hint: line one", "  line two \\u202e"]
    assert "\x1b" not in HostFailure("gpu-1", "apt: \x1b]0;owned\x07").render()
