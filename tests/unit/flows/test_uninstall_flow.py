"""The teardown flow in-process, with a fake session: what `down` decides from what the
hosts answer (which hosts run the script, when the token goes), without booting hosts."""

import contextlib

import pytest
import yaml
from fakes import FakeSession

from bootstrap import progress
from bootstrap.errors import HostsFailed
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.flows.uninstall import tear_down
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

K3S = K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", "active")])


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", "secret\n")
    state.write_secret("kubeconfig", "apiVersion: v1\n")
    ours = {"cluster_id": state.cluster_id, "files": []}
    return inventory, state, {"cp": HostFacts(manifest=ours, k3s=K3S), "a1": HostFacts(manifest=ours, k3s=K3S)}


def run(inventory, state, session, force=False):
    tear_down(inventory, state, progress.Console(progress.Reporter()), purge_drivers=False, force=force,
              open_session=lambda *args: contextlib.nullcontext(session))


def test_everything_removed_then_the_secrets_go_and_the_id_is_renewed(cluster):
    inventory, state, facts = cluster
    old_id = state.cluster_id
    session = FakeSession(inventory, facts)
    run(inventory, state, session)
    assert session.executed == [("remove agent", "a1"), ("remove server", "cp")]  # agents first
    assert not (state.path / "token").exists() and not (state.path / "kubeconfig").exists()
    assert StateDir(inventory).cluster_id != old_id


@pytest.mark.parametrize("how", ["unreachable", "script failed"])
def test_a_server_that_may_still_run_k3s_keeps_the_token(cluster, how, capsys):
    inventory, state, facts = cluster
    session = FakeSession(inventory, facts, unreachable=["cp"] if how == "unreachable" else (),
                          failing=["cp"] if how == "script failed" else ())
    with pytest.raises(HostsFailed):
        run(inventory, state, session)
    assert (state.path / "token").read_text() == "secret\n" and (state.path / "kubeconfig").exists()
    assert "k3s may still run on cp" in capsys.readouterr().err


def test_another_clusters_host_stops_everything_before_any_change(cluster):
    inventory, state, facts = cluster
    facts["a1"] = HostFacts(manifest={"cluster_id": "ffffffffffffffff", "cluster": "other"}, k3s=K3S)
    session = FakeSession(inventory, facts)
    with pytest.raises(HostsFailed, match="not set up by this cluster"):
        run(inventory, state, session)
    assert session.executed == [] and (state.path / "token").exists()
    forced = FakeSession(inventory, facts)
    run(inventory, state, forced, force=True)
    assert ("remove agent", "a1") in forced.executed


def test_a_host_with_nothing_on_it_is_left_alone(cluster, capsys):
    inventory, state, facts = cluster
    facts["a1"] = HostFacts()
    session = FakeSession(inventory, facts)
    run(inventory, state, session)
    assert session.executed == [("remove server", "cp")]
    assert "a1: nothing of bootstrap's or k3s's on it; left untouched" in capsys.readouterr().out
