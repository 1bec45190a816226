"""An SSH password is offered to the host it is given for, so one shared by several nodes
lets any of them log in to the others: refused, naming file, line and field; each node may
name its own; keys stay the default.

Before (dba963f), the top-level ssh.password was given to every node's login and a node
could not name its own: each test here fails on that code.
"""

import pytest

from bootstrap.errors import InvalidInput, UsageError
from bootstrap.remote import sshlink
from bootstrap.remote.session import host_data
from bootstrap.inventory.loader import parse_inventory
from bootstrap.state.folder import StateDir

TWO_NODES = """\
cluster: pw
state_dir: {state}
ssh: {{user: ubuntu{top}}}
nodes:
- {{name: cp-1, address: 10.0.0.1, role: server{cp}}}
- {{name: gpu-1, address: 10.0.0.2{gpu}}}
"""


def inventory(tmp_path, top="", cp="", gpu=""):
    text = TWO_NODES.format(state=tmp_path / "state", top=top, cp=cp, gpu=gpu)
    return parse_inventory(text, str(tmp_path / "inv.yaml"))


def test_a_top_level_password_for_several_nodes_is_refused_with_the_reason(tmp_path):
    with pytest.raises(InvalidInput) as caught:
        inventory(tmp_path, top=", password_env: SSH_PW")
    [problem] = caught.value.problems
    assert (problem.file, problem.line, problem.path) == (str(tmp_path / "inv.yaml"), 3, "ssh.password_env")
    assert "can log in to the others" in problem.message and "'cp-1', 'gpu-1'" in problem.message


@pytest.mark.parametrize("cp, gpu", [
    (", ssh: {password_env: PW}", ", ssh: {password_env: PW}"),
    (", ssh: {password_file: ~/pw}", ", ssh: {password_file: ~/./pw}"),
], ids=["same-variable", "same-file"])
def test_one_reference_named_by_two_nodes_is_refused(tmp_path, cp, gpu):
    with pytest.raises(InvalidInput) as caught:
        inventory(tmp_path, cp=cp, gpu=gpu)
    assert sorted(p.line for p in caught.value.problems) == [5, 6]
    assert all("can log in to the others" in p.message for p in caught.value.problems)


def test_each_node_logs_in_with_its_own_password_and_a_node_without_one_gets_none(tmp_path, monkeypatch):
    monkeypatch.setenv("CP_PW", "cp-secret")
    monkeypatch.setenv("GPU_PW", "gpu-secret")
    inv = inventory(tmp_path, cp=", ssh: {password_env: CP_PW}")
    state = StateDir(inv)
    assert host_data(inv, state, inv.nodes[0])["ssh_password"] == "cp-secret"
    assert "ssh_password" not in host_data(inv, state, inv.nodes[1])
    inv = inventory(tmp_path, cp=", ssh: {password_env: CP_PW}", gpu=", ssh: {password_env: GPU_PW}")
    assert [host_data(inv, state, n)["ssh_password"] for n in inv.nodes] == ["cp-secret", "gpu-secret"]


def test_a_top_level_password_for_one_node_stays_that_nodes(tmp_path, monkeypatch):
    """The others name their own: the shared default reaches only the node that uses it."""
    monkeypatch.setenv("SSH_PW", "default-secret")
    monkeypatch.setenv("GPU_PW", "gpu-secret")
    inv = inventory(tmp_path, top=", password_env: SSH_PW", gpu=", ssh: {password_env: GPU_PW}")
    state = StateDir(inv)
    assert [host_data(inv, state, n)["ssh_password"] for n in inv.nodes] == ["default-secret", "gpu-secret"]


def test_two_references_that_hold_the_same_password_are_refused_before_any_login(tmp_path, monkeypatch):
    monkeypatch.setenv("CP_PW", "same-secret")
    monkeypatch.setenv("GPU_PW", "same-secret")
    inv = inventory(tmp_path, cp=", ssh: {password_env: CP_PW}", gpu=", ssh: {password_env: GPU_PW}")
    with pytest.raises(UsageError) as caught:
        host_data(inv, StateDir(inv), inv.nodes[0])
    assert "cp-1 and gpu-1" in caught.value.message and "same-secret" not in caught.value.render()
    connected = []
    monkeypatch.setattr(sshlink, "_connect", lambda *args, **kwargs: connected.append(args))
    with pytest.raises(UsageError):
        sshlink.connect(inv, inv.nodes[1], tmp_path / "known_hosts")
    assert connected == []


def test_paramiko_is_given_only_the_nodes_own_password(tmp_path, monkeypatch):
    monkeypatch.setenv("CP_PW", "cp-secret")
    inv = inventory(tmp_path, cp=", ssh: {password_env: CP_PW}")
    offered = {}
    monkeypatch.setattr(sshlink, "_connect",
                        lambda client, host, port, kwargs, what, *rest, **kw: offered.update({what: kwargs}))
    for node in inv.nodes:
        sshlink.connect(inv, node, tmp_path / "known_hosts")
    assert offered["cp-1"]["password"] == "cp-secret"
    assert "password" not in offered["gpu-1"]
