"""One run context (bootstrap.flows.run): one resolved inventory that the planners and the
cluster side share, a topology resolved once after the probe, one record per host, and
preflight as one entry that returns its findings (the flow prints and decides)."""

import contextlib
import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import gevent
import pytest
from fakes import FakeSession
from test_host_phase_flow import healthy_host
from test_join_tokens import JoinSession, fresh_facts, inventory_of, k3s  # noqa: F401 (k3s: a fixture)

from bootstrap import progress, topology
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.flows import cluster_side, host_phase, replaced_machines
from bootstrap.flows.host_check import check_hosts
from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.flows.preflight_phase import PreflightFailed, enforce, examine
from bootstrap.flows.run import Run
from bootstrap.state.folder import StateDir


def console(out=None, err=None):
    return progress.Console(progress.Reporter(out or io.StringIO()), err or io.StringIO())


def test_up_resolves_the_topology_once(k3s, tmp_path, monkeypatch):  # noqa: F811
    inv = inventory_of(tmp_path, k3s, servers=1, agents=2)
    state = StateDir(inv)
    calls = []
    real = topology.embedded_mirror_on
    monkeypatch.setattr(topology, "embedded_mirror_on", lambda *a: calls.append(a) or real(*a))
    bring_up(inv, state, UpOptions(hosts_only=True), console(),
             open_session=lambda *a: contextlib.nullcontext(JoinSession(inv, fresh_facts(inv), state)))
    assert len(calls) == 1  # preflight, reachability and the planners read the run's topology


def test_the_planners_and_the_cluster_side_read_one_resolved_inventory(k3s, tmp_path, monkeypatch):  # noqa: F811
    inv = inventory_of(tmp_path, k3s, servers=1, agents=1)
    state = StateDir(inv)
    planned, applied = [], []
    real_make_plans = host_phase.make_plans
    monkeypatch.setattr(host_phase, "make_plans", lambda inventory, *a, **kw:
                        planned.append(inventory) or real_make_plans(inventory, *a, **kw))

    def apply_cluster(cluster, inventory, plan, say, **kw):
        applied.append((inventory, plan() if callable(plan) else plan))
        return {"labelled": [], "objects": [], "releases": [], "nodes": {}, "compared": []}  # no Node objects: no gate

    monkeypatch.setattr(cluster_side, "apply_cluster", apply_cluster)
    monkeypatch.setattr(cluster_side, "plan_cluster", lambda inventory, facts, gpu: ("plan of", inventory, facts))
    bring_up(inv, state, UpOptions(validate=False), console(),
             open_session=lambda *a: contextlib.nullcontext(JoinSession(inv, fresh_facts(inv), state)),
             connect=lambda *a: contextlib.nullcontext(SimpleNamespace(prefetched=None)),
             take_snapshot=lambda *a: Path("snap.db"))
    assert planned and applied
    (inventory, (_, plan_inventory, facts)), = applied
    assert all(p is inventory for p in planned) and plan_inventory is inventory
    assert isinstance(facts, dict) and sorted(facts) == ["a1", "cp-1"]  # the second probe's, one type


def test_each_host_has_one_record_and_its_failure_is_the_sessions(tmp_path):
    inv = inventory_of(tmp_path, servers=1, agents=2)
    session = FakeSession(inv, fresh_facts(inv), unreachable=["a2"])
    run = Run(inv, StateDir(inv), console())
    run.attach(session)
    run.set_facts(session.gather(None))
    assert list(run.hosts) == ["cp-1", "a1", "a2"]
    assert run.hosts["a1"].facts is session.facts["a1"] and run.hosts["a2"].facts is None
    assert run.hosts["a2"].failure.message == "no SSH answer" and run.hosts["a1"].failure is None
    run.fail("a1", "its step failed")
    assert run.hosts["a1"].failure.message == "its step failed" and sorted(run.failures) == ["a1", "a2"]
    assert run.topology.gpu_nodes == () and run.topology.first_server == "cp-1"


def test_preflight_returns_every_finding_and_the_flow_prints_and_decides(tmp_path):
    inv = inventory_of(tmp_path, servers=1, agents=1)
    other = HostFacts(manifest={"cluster_id": "ffffffffffffffff", "cluster": "other"},
                      k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                     [SystemdUnit("k3s-agent.service", "loaded", "active")]))
    session = FakeSession(inv, {"cp-1": healthy_host("cp-1"), "a1": other})
    out, err = io.StringIO(), io.StringIO()
    run = Run(inv, StateDir(inv), console(out, err))
    run.attach(session)
    run.set_facts(session.gather(None))
    report = examine(run)
    assert "owner" in {f.check for f in report.errors if f.node == "a1"}
    assert out.getvalue() == "" and err.getvalue() == ""  # nothing printed yet: the flow does that
    with pytest.raises(PreflightFailed, match="no host was changed"):
        enforce(run, report)
    assert "a1: owner: it belongs to another cluster" in out.getvalue()


def test_check_hosts_runs_ups_first_phases_and_changes_nothing(k3s, tmp_path):  # noqa: F811
    inv = inventory_of(tmp_path, k3s, servers=1, agents=1)
    out = io.StringIO()
    session = JoinSession(inv, fresh_facts(inv), StateDir(inv))
    assert check_hosts(inv, console(out), open_session=lambda *a: contextlib.nullcontext(session)) == 0
    assert session.executed == [] and "`up` would go ahead" in out.getvalue()
    assert not (StateDir(inv).path / "token").exists()


def test_replaced_machines_are_marked_on_their_host_records(tmp_path, monkeypatch):
    """What the join needs of a replaced machine is on its record (an etcd member leaves etcd
    first) and on the run (the healthy server to join when the first server was replaced):
    no parallel `Replaced` beside the records."""
    inv = inventory_of(tmp_path, servers=3, agents=1)
    state = StateDir(inv)
    state.write_secret("kubeconfig", "a cluster `up` built before\n")
    facts = fresh_facts(inv)  # no k3s anywhere: cp-1 and a1 are new machines under old names
    for name in ("cp-2", "cp-3"):
        facts[name] = replace(facts[name], k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, []))
    server = {"node-role.kubernetes.io/control-plane": "true"}
    nodes = {name: {"metadata": {"name": name, "labels": server if name.startswith("cp") else {}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}} for name in facts}
    monkeypatch.setattr(replaced_machines, "cluster_nodes", lambda *a: (nodes, None))
    removed = []
    monkeypatch.setattr(replaced_machines, "remove_nodes", lambda inventory, state, names, members, connect:
                        removed.append((names, members)))
    run = Run(inv, state, console())
    run.set_facts(facts)
    replaced_machines.find_replaced(run)
    assert [(n, r.replaced, r.replaced_member) for n, r in run.hosts.items()] == [
        ("cp-1", True, True), ("cp-2", False, False), ("cp-3", False, False), ("a1", True, False)]
    assert run.join_via.name == "cp-2"
    replaced_machines.clear_replaced(run)
    assert removed == [(["cp-1", "a1"], ["cp-1"])]


def test_an_existing_clusters_api_connection_is_made_early_and_used_only_when_no_host_changed(k3s, tmp_path,  # noqa: F811
                                                                                               monkeypatch):
    inv = inventory_of(tmp_path, k3s, servers=1, agents=1)
    state = StateDir(inv)
    state.write_secret("kubeconfig", "apiVersion: v1\n")  # an existing cluster's
    opened, used = [], []

    @contextlib.contextmanager
    def connect(*a):  # the early one is made in the background, not on the run's own greenlet
        opened.append("early" if gevent.getcurrent() is not main else "in turn")
        yield SimpleNamespace(name=f"{opened[-1]} {len(opened)}", prefetched=None)

    main = gevent.getcurrent()

    monkeypatch.setattr(host_phase, "warm_connections", lambda cluster, paths=(): None)
    monkeypatch.setattr(cluster_side, "apply_cluster", lambda cluster, *a, **kw: used.append(cluster.name) or
                        {"labelled": [], "objects": [], "releases": [], "nodes": {}, "compared": []})
    bring_up(inv, state, UpOptions(validate=False), console(),
             open_session=lambda *a: contextlib.nullcontext(JoinSession(inv, fresh_facts(inv), state)),
             connect=connect, take_snapshot=lambda *a: Path("snap.db"))
    # The hosts changed (k3s may have restarted under the first early connection): the cluster
    # side takes the one made after the first server's start, while the agents joined.
    assert opened.count("early") == 2 and used == [f"early {len(opened) - opened[::-1].index('early')}"]
    assert used != [f"early {opened.index('early') + 1}"]
    opened.clear(), used.clear()
    monkeypatch.setattr(host_phase.Run, "changed", property(lambda run: False))
    bring_up(inv, state, UpOptions(validate=False), console(),
             open_session=lambda *a: contextlib.nullcontext(JoinSession(inv, fresh_facts(inv), state)),
             connect=connect, take_snapshot=lambda *a: Path("snap.db"))
    assert len(used) == 1 and used[0].startswith("early")  # no host changed: the early one
