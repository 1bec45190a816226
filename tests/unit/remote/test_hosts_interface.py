"""The hosts' interface (bootstrap.remote.interface.Hosts) is what the real session and the test
fake both are, signatures included, and all that flows use of a session: so the fake the flow
tests run on cannot drift from the real one silently."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from bootstrap.remote.interface import Hosts
from bootstrap.remote.session import HostSession
from bootstrap.inventory.loader import parse_inventory
from bootstrap.state.folder import StateDir
from fakes import FakeSession
from repo_paths import ROOT

METHODS = sorted(name for name, member in vars(Hosts).items() if inspect.isfunction(member) and not name.startswith("_"))
ATTRIBUTES = sorted(Hosts.__annotations__)


def _shape(function) -> list[tuple]:
    """A method's parameters as (name, kind, default): what a caller relies on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _sessions(tmp_path):
    inventory = parse_inventory(f"cluster: t\nstate_dir: {tmp_path / 'state'}\n"
                                "nodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n")
    return {"HostSession": HostSession(inventory, StateDir(inventory)), "FakeSession": FakeSession(inventory, {})}


def test_the_interface_lists_what_flows_call():
    assert METHODS == ["execute", "fail", "gather", "read_root_file", "run_each", "ssh_client"]
    assert ATTRIBUTES == ["failures", "nodes"]


@pytest.mark.parametrize("which", ["HostSession", "FakeSession"])
def test_each_session_is_the_interface_with_its_signatures(tmp_path, which):
    session = _sessions(tmp_path)[which]
    assert isinstance(session, Hosts)
    for name in ATTRIBUTES:
        assert hasattr(session, name), f"{which} has no {name}"
    for name in METHODS:
        assert _shape(getattr(type(session), name)) == _shape(getattr(Hosts, name)), \
            f"{which}.{name}{inspect.signature(getattr(type(session), name))} is not " \
            f"Hosts.{name}{inspect.signature(getattr(Hosts, name))}"


def test_the_fake_has_no_method_the_real_session_lacks():
    """A method only the fake has would let a flow test pass on a call the real session refuses."""
    fake_only = {name for name, member in vars(FakeSession).items()
                 if callable(member) and not name.startswith("_")} - set(dir(HostSession))
    assert not fake_only, f"FakeSession methods the real session lacks: {sorted(fake_only)}"


def _session_uses(path: Path) -> set[str]:
    """Attributes read off a variable named `session` in one module."""
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "session"}


def test_flows_use_only_the_interface():
    files = sorted((ROOT / "bootstrap" / "flows").glob("*.py"))
    used = {path.name: _session_uses(path) - set(METHODS) - set(ATTRIBUTES) for path in files}
    assert any(_session_uses(path) for path in files)
    assert not any(used.values()), f"flows use what bootstrap.remote.interface.Hosts lacks: " \
        f"{ {name: sorted(extra) for name, extra in used.items() if extra} }"


def test_the_cluster_connection_reuses_the_sessions_ssh_when_it_can_take_it():
    """No marker on the product's connect (it was `connect.reuses_ssh = True`, for tests' sake):
    a connect function with an `ssh` parameter gets the session's connections, one without does not."""
    from bootstrap.cluster.client import connect, reusing_ssh

    class Session(FakeSession):
        def ssh_client(self, name):
            return f"client of {name}"

    session = Session(parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server}]\n"), {})

    def takes_ssh(inventory, state, ssh=None):
        return ssh("cp-1")

    def sandboxed(inventory, state):
        return "own connection"

    assert reusing_ssh(takes_ssh, session)(None, None) == "client of cp-1"
    assert reusing_ssh(sandboxed, session)(None, None) == "own connection"
    assert reusing_ssh(connect, session).keywords == {"ssh": session.ssh_client}
    assert not hasattr(connect, "reuses_ssh")
