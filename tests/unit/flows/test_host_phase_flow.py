"""`up`'s host phase in-process, with a fake session: what it refuses before any host is
changed (the facts and preflight half, which `plan` and `rebuild` share)."""

import contextlib
from dataclasses import replace

import pytest
import yaml
from fakes import FakeSession
from test_facts_parsers import h200_probe_output

from bootstrap import progress
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.flows.preflight_phase import PreflightFailed
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.yaml"
    # No k3s.version: a channel would be resolved online, which must not happen here.
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def healthy_host(hostname: str) -> HostFacts:
    """The real H200 recording, on systemd (the recording was taken inside a container)."""
    return replace(parse_host_facts(h200_probe_output()), init_process="systemd", has_systemd=True, hostname=hostname)


def up(inventory, state, session):
    bring_up(inventory, state, UpOptions(), progress.Console(progress.Reporter()),
             open_session=lambda *a: contextlib.nullcontext(session))


def test_another_clusters_host_stops_up_before_any_change(cluster, capsys):
    inventory, state = cluster
    other = HostFacts(manifest={"cluster_id": "ffffffffffffffff", "cluster": "other"},
                      k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                     [SystemdUnit("k3s-agent.service", "loaded", "active")]))
    session = FakeSession(inventory, {"cp": healthy_host("cp"), "a1": other})
    with pytest.raises(PreflightFailed, match="no host was changed"):
        up(inventory, state, session)
    assert session.executed == []
    assert "a1: owner: it belongs to another cluster set up by bootstrap ('other'" in capsys.readouterr().out
    assert not (state.path / "token").exists()


def test_an_unreachable_host_is_named_and_no_channel_is_resolved(cluster, capsys):
    inventory, state = cluster
    # Both hosts pass preflight, so the one problem is the unreachable host; before, `up`
    # went on to resolve the stable channel online and failed (or hung) on that instead.
    session = FakeSession(inventory, {"cp": healthy_host("cp"), "a1": healthy_host("a1")}, unreachable=["a1"],
                          why_unreachable="no SSH answer from 10.0.0.2:22 in 5 s")
    with pytest.raises(PreflightFailed, match="1 problem"):
        up(inventory, state, session)
    assert session.executed == []
    assert "FAILED a1: no SSH answer from 10.0.0.2:22 in 5 s" in capsys.readouterr().err
