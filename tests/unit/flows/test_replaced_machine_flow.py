"""A machine re-created under a node's name, in-process: `up` and `rebuild` on a fake host
session (tests/fakes.py) against the sandboxed stand-in API (tests/sandbox.py), which
refuses a new node password as k3s does. The old Node and its node-password secret must
be gone before the new machine's join step runs, even while the old Node says Ready."""

from __future__ import annotations

import contextlib
import hashlib
import io
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from sandbox import TOKEN, Cluster, Proc, k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_cluster_side_flow import helm_calls  # noqa: F401  (a fixture: the recording Helm)
from test_host_phase_flow import healthy_host

from bootstrap import progress
from bootstrap.cluster.client import Cluster as ApiCluster
from bootstrap.host.facts.host_facts import FileState, K3sInstall, SystemdUnit
from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.flows.repair import RepairOptions, repair
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.host.plan.join_tokens import SERVER_TOKEN_FILE
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

VERSION = "v1.33.5+k3s1"


class RecordingSession(FakeSession):
    """Also answers the kubeconfig read, notes what the API held when each step ran, and
    starts the new machine's k3s (a stand-in agent on a root of its own, so a node password
    of its own) when its join step runs."""

    def __init__(self, inventory, facts, lab, kubeconfig_text):
        super().__init__(inventory, facts)
        self.lab, self.kubeconfig_text = lab, kubeconfig_text
        self.seen_at_step: dict[str, tuple[set, set]] = {}
        self.new_agent = None

    def read_root_file(self, name, path):
        if path == SERVER_TOKEN_FILE:  # the CA hash the joins' secure tokens name
            return (self.lab.root / path.lstrip("/")).read_text()
        return self.kubeconfig_text

    def execute(self, steps, after=None):
        for step in steps:
            if step.commands:
                nodes = {n.metadata.name for n in self.lab.core.list_node().items}
                secrets = {s.metadata.name for s in self.lab.core.list_namespaced_secret("kube-system").items}
                self.seen_at_step[step.name] = (nodes, secrets)
            if step.name == "join agents" and "a1" in step.commands:
                root = self.lab.base / "a1-new-machine"
                config = root / "etc/rancher/k3s/config.yaml"
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{self.lab.port}", "token": TOKEN}))
                self.new_agent = Proc(self.lab.k3s, ["agent", "--node-name", "a1"], root,
                                      {"K3S_STANDIN_JOIN_TIMEOUT": "5"})
                self.lab.procs.append(self.new_agent)
                self.lab.wait_ready("a1")
        return super().execute(steps, after)


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp")
    old = sandbox.agent("a1")
    sandbox.wait_ready("cp", "a1")
    sandbox.old_agent = old
    yield sandbox
    sandbox.stop()


@pytest.fixture
def cluster(lab, k3s, tmp_path):  # noqa: F811
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state",
                                    "k3s": {"airgap": str(k3s.parent), "version": VERSION}, "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server", "gpu": {"enabled": False}},
        {"name": "a1", "address": "10.0.0.2", "gpu": {"enabled": False}}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", TOKEN + "\n")  # the lab cluster's own
    kubeconfig = lab.root / "etc/rancher/k3s/k3s.yaml"
    state.write_secret("kubeconfig", kubeconfig.read_text())  # a cluster `up` built before
    sha = hashlib.sha256(k3s.read_bytes()).hexdigest()
    server = replace(healthy_host("cp"), gpus=[], manifest={"cluster_id": state.cluster_id, "cluster": "t"},
                     files={K3S_BINARY: FileState(0o755, sha)},
                     k3s=K3sInstall(K3S_BINARY, VERSION, True, [SystemdUnit("k3s.service", "loaded", "active",
                                                                             "enabled")]))
    # The spot VM behind a1 is gone and a new one answers at its address: nothing on it.
    new_machine = replace(healthy_host("a1"), gpus=[])
    assert new_machine.k3s is None
    facts = {"cp": server, "a1": new_machine}

    @contextlib.contextmanager
    def connect(inv, st):
        yield ApiCluster(lab.api, tmp_path / "helm-kubeconfig")

    lab.old_agent.stop()  # its Node still says Ready for a while (the node controller's grace)
    assert lab.ready("a1") == "True"
    return inventory, state, RecordingSession(inventory, facts, lab, kubeconfig.read_text()), connect


def test_up_removes_the_old_node_and_its_secret_before_the_new_machine_joins(cluster):
    inventory, state, session, connect = cluster
    out = io.StringIO()
    bring_up(inventory, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter(out)),
             open_session=lambda *a: contextlib.nullcontext(session), connect=connect)
    assert ("join agents", "a1") in session.executed
    nodes, secrets = session.seen_at_step["join agents"]
    assert "a1" not in nodes and "a1.node-password.k3s" not in secrets
    assert "cp" in nodes and "cp.node-password.k3s" in secrets  # the healthy server is left alone
    assert "a1: a new machine under this name" in out.getvalue()
    assert "Node password rejected" not in session.new_agent.log()


def test_rebuild_removes_a_replaced_machines_node_that_still_says_ready(cluster, helm_calls):  # noqa: F811
    inventory, state, session, connect = cluster
    out = io.StringIO()
    repair(inventory, state, RepairOptions(validate=False), progress.Console(progress.Reporter(out)),
           open_session=lambda *a: contextlib.nullcontext(session), connect=connect)
    nodes, secrets = session.seen_at_step["join agents"]
    assert "a1" not in nodes and "a1.node-password.k3s" not in secrets
    assert "lost a1; joined a1" in out.getvalue() and "unchanged cp" in out.getvalue()
    assert "Node password rejected" not in session.new_agent.log()


@pytest.mark.parametrize("answer", ["new host key", "silent"])
def test_rebuild_names_a_machine_that_does_not_answer_and_does_not_wait_for_it(lab, k3s, tmp_path,  # noqa: F811
                                                                               helm_calls, answer):  # noqa: F811
    """A spot machine gone and not replaced yet (or replaced, with a new host key the tool
    refuses): rebuild says so with the cause and the fix, and finishes with the nodes that
    answer instead of waiting out the Ready time-out for one that cannot join."""
    import time

    from bootstrap.remote.session import HostFailure

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state",
                                    "k3s": {"airgap": str(k3s.parent), "version": VERSION}, "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server", "gpu": {"enabled": False}},
        {"name": "a1", "address": "10.0.0.2", "gpu": {"enabled": False}},
        {"name": "a2", "address": "10.0.0.3", "gpu": {"enabled": False}}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", TOKEN + "\n")  # the lab cluster's own
    kubeconfig = lab.root / "etc/rancher/k3s/k3s.yaml"
    state.write_secret("kubeconfig", kubeconfig.read_text())
    sha = hashlib.sha256(k3s.read_bytes()).hexdigest()

    def running(name, unit):
        return replace(healthy_host(name), gpus=[], manifest={"cluster_id": state.cluster_id, "cluster": "t"},
                       files={K3S_BINARY: FileState(0o755, sha)},
                       k3s=K3sInstall(K3S_BINARY, VERSION, True, [SystemdUnit(unit, "loaded", "active", "enabled")]))

    session = RecordingSession(inventory, {"cp": running("cp", "k3s.service"), "a1": running("a1", "k3s-agent.service")},
                               lab, kubeconfig.read_text())
    if answer == "new host key":
        session.failures["a2"] = HostFailure("a2", "the host key of 10.0.0.3:22 changed",
                                             f"if a2 was replaced by a new machine, run: bootstrap rebuild {path} "
                                             "--replace a2", machine_answers=True)
    else:
        session.failures["a2"] = HostFailure("a2", "no answer from 10.0.0.3:22 within 5 s",
                                             "is the machine up, and does a firewall drop the SSH port?")

    @contextlib.contextmanager
    def connect(inv, st):
        yield ApiCluster(lab.api, tmp_path / "helm-kubeconfig")

    out = io.StringIO()
    started = time.monotonic()
    repair(inventory, state, RepairOptions(validate=False), progress.Console(progress.Reporter(out)),
           open_session=lambda *a: contextlib.nullcontext(session), connect=connect)
    assert time.monotonic() - started < 60, "rebuild waited for a node that cannot join"
    said = out.getvalue()
    assert "not answering a2" in said and "unchanged cp, a1" in said
    last = said.strip().splitlines()[-1]
    if answer == "new host key":
        assert (f"a2: left out of this rebuild: the host key of 10.0.0.3:22 changed (if a2 was replaced by a new "
                f"machine, run: bootstrap rebuild {path} --replace a2)") in said, said
        assert last == f"a2: if a2 was replaced by a new machine, run: bootstrap rebuild {path} --replace a2", said
    else:
        assert "a2: left out of this rebuild: no answer from 10.0.0.3:22 within 5 s" in said, said
        assert last == ("a2 is gone: rent a replacement, put its address in the inventory, run rebuild again "
                        "(or remove a2 from the inventory)"), said
