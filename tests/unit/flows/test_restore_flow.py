"""`rebuild --restore` in-process on a fake host session (tests/fakes.py): in HA, the other
servers lose their old etcd data before the first one is restored, and start after it; the
agents join only once the restored cluster's stale Nodes are cleared."""

import contextlib
import hashlib
import os
import time
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from kubeconfigs import K3S_YAML
from sandbox import k3s  # noqa: F401  (k3s: the built stand-in, a fixture)
from test_host_phase_flow import healthy_host

from bootstrap import progress
from bootstrap.state import snapshots
from bootstrap.cluster.client import ClusterError
from bootstrap.host.facts.host_facts import FileState, K3sInstall, SystemdUnit
from bootstrap.flows import repair as repair_flow
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

VERSION = "v1.33.5+k3s1"


KUBECONFIG = K3S_YAML  # what k3s writes


class Session(FakeSession):
    def read_root_file(self, name, path):
        return KUBECONFIG  # what the restored server wrote


@contextlib.contextmanager
def api_refuses(*args):
    raise ClusterError("connection refused")
    yield  # pragma: no cover


@pytest.fixture
def ha(k3s, tmp_path):  # noqa: F811
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state",
                                    "k3s": {"airgap": str(k3s.parent), "version": VERSION}, "nodes": [
        {"name": f"s{i}", "address": f"10.0.0.{i}", "role": "server", "gpu": {"enabled": False}} for i in (1, 2, 3)
    ] + [{"name": "a1", "address": "10.0.0.9", "gpu": {"enabled": False}}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", "secret\n")
    snap = snapshots.local_dir(state) / f"bootstrap-{state.cluster_id}-20261201-100000-s1-1796000000"
    snap.write_text("etcd")
    os.utime(snap, (time.time() - 60, time.time() - 60))
    sha = hashlib.sha256(k3s.read_bytes()).hexdigest()

    def host(name, unit, active):
        return replace(healthy_host(name), gpus=[], manifest={"cluster_id": state.cluster_id, "cluster": "t"},
                       files={K3S_BINARY: FileState(0o755, sha)},
                       k3s=K3sInstall(K3S_BINARY, VERSION, True,
                                      [SystemdUnit(f"{unit}.service", "loaded", active, "enabled")]))

    # Quorum is gone: k3s failed on every server; s1's machine was replaced (nothing on it).
    facts = {"s1": replace(healthy_host("s1"), gpus=[]), "s2": host("s2", "k3s", "failed"),
             "s3": host("s3", "k3s", "failed"), "a1": host("a1", "k3s-agent", "active")}
    return inventory, state, facts


def test_restore_clears_the_other_servers_then_restores_then_starts_them(ha, monkeypatch):
    inventory, state, facts = ha
    phases = []
    monkeypatch.setattr(repair_flow, "cluster_phase", lambda *a, **kw: phases.append("cluster side"))
    session = Session(inventory, facts)
    repair_flow.repair(inventory, state, repair_flow.RepairOptions(restore=True, assume_yes=True),
                       progress.Console(progress.Reporter()), open_session=lambda *a: contextlib.nullcontext(session),
                       connect=api_refuses, api_port_accepts=lambda *a: (False, "refuses"))
    ran = session.executed
    assert ran.index(("clear etcd data on the other servers", "s2")) < ran.index(("restore etcd snapshot on s1", "s1"))
    assert ("clear etcd data on the other servers", "s3") in ran
    assert ("clear etcd data on the other servers", "s1") not in ran and ("clear etcd data on the other servers",
                                                                          "a1") not in ran
    assert ran.index(("restore etcd snapshot on s1", "s1")) < ran.index(("start server s1", "s1")) < \
        ran.index(("join server s2", "s2")) < ran.index(("join server s3", "s3"))
    assert phases == ["cluster side"]
