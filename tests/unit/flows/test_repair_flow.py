"""The repair flow (`bootstrap rebuild`) in-process, with a fake session, cluster and API
port check: when the API does not answer, is the control plane lost? Nothing may be
restored (or changed on any host) unless no server's k3s answers and --restore says so."""

import contextlib
import time

import pytest
import yaml
from fakes import FakeSession

from bootstrap.state import snapshots
from bootstrap.cluster.client import ClusterError
from bootstrap import progress
from bootstrap.errors import HostsFailed
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.flows.repair import RepairOptions, repair
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir


def k3s(state: str) -> K3sInstall:
    return K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", state)])


@contextlib.contextmanager
def api_refuses(why):
    raise ClusterError(why)
    yield  # pragma: no cover


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", "secret\n")
    taken = time.time() - 7200  # the age shown is the time in the name's
    named = time.strftime("%Y%m%d-%H%M%S", time.localtime(taken))
    snap = snapshots.local_dir(state) / f"bootstrap-{state.cluster_id}-{named}-cp-{int(taken)}"
    snap.write_text("etcd")
    return inventory, state


def run(inventory, state, session, *, port=(True, "accepts"), **options):
    repair(inventory, state, RepairOptions(**options), progress.Console(progress.Reporter()),
           open_session=lambda *a: contextlib.nullcontext(session),
           connect=lambda *a: api_refuses("401 Unauthorized"), api_port_accepts=lambda *a: port)


def test_an_api_error_with_k3s_running_is_an_error_never_a_restore(cluster):
    inventory, state = cluster
    session = FakeSession(inventory, {"cp": HostFacts(k3s=k3s("active")), "a1": HostFacts(k3s=k3s("active"))})
    with pytest.raises(HostsFailed) as caught:
        run(inventory, state, session, restore=True, assume_yes=True)
    assert "not lost" in caught.value.message and "401 Unauthorized" in caught.value.message
    assert session.executed == []


def test_no_server_answering_without_restore_names_the_snapshot_and_changes_nothing(cluster, capsys):
    inventory, state = cluster
    session = FakeSession(inventory, {"cp": HostFacts(), "a1": HostFacts(k3s=k3s("active"))})
    with pytest.raises(HostsFailed) as caught:
        run(inventory, state, session)
    assert "the control plane is lost" in caught.value.message
    assert "--restore" in caught.value.hint and "taken 2 h 0 min ago" in caught.value.hint
    assert "cp: has no k3s service" in capsys.readouterr().out
    assert session.executed == []


@pytest.mark.parametrize("facts, port", [
    (HostFacts(k3s=k3s("failed")), (True, "accepts")),  # k3s stopped: its port is not asked
    (HostFacts(k3s=k3s("active")), (False, "refuses")),  # running, port closed
])
def test_a_server_whose_k3s_does_not_answer_counts_as_lost(cluster, facts, port):
    inventory, state = cluster
    session = FakeSession(inventory, {"cp": facts, "a1": HostFacts(k3s=k3s("active"))})
    with pytest.raises(HostsFailed, match="the control plane is lost"):
        run(inventory, state, session, port=port)
    assert session.executed == []
