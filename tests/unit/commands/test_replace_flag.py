"""`up --replace NODE` / `rebuild --replace NODE`: a replaced machine's pinned host key goes,
only while the cluster says that node is NotReady or gone (the sandboxed stand-in API)."""

import contextlib
import io

import pytest
import yaml
from sandbox import Cluster, k3s, wait  # noqa: F401  (k3s: the built stand-in, a fixture)

from bootstrap import progress
from bootstrap.cluster.client import Cluster as ApiCluster
from bootstrap.errors import UsageError
from bootstrap.flows.replaced_machines import forget_replaced_keys
from bootstrap.remote import hostkeys
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    try:
        yield from _lab(sandbox, tmp_path)
    finally:
        sandbox.stop()


def _lab(sandbox, tmp_path):
    sandbox.server(name="cp")
    gone = sandbox.agent("a1")
    later = sandbox.agent("a2")  # lost during a test, within the grace period
    sandbox.wait_ready("cp", "a1", "a2")
    gone.stop()  # a1's machine is lost: NotReady once the grace period (3 s here) is over
    wait("a1 NotReady", lambda: sandbox.ready("a1") != "True", 30)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"},
        {"name": "a2", "address": "10.0.0.3"}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    state.write_secret("token", "secret\n")  # a cluster `up` built: its state folder exists
    state.known_hosts.write_text("".join(f"{a} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldKey{i}\n"
                                         for i, a in enumerate(("10.0.0.1", "10.0.0.2", "10.0.0.3"))))

    @contextlib.contextmanager
    def connect(inv, st):
        connect.through = {n.name for n in inv.nodes}
        yield ApiCluster(sandbox.api, tmp_path / "kubeconfig")

    yield inventory, state, connect, later


def test_replace_forgets_the_key_of_a_node_that_is_gone_and_only_that(lab):
    inventory, state, connect, _ = lab
    out = io.StringIO()
    forget_replaced_keys(inventory, state, ["a1"], progress.Console(progress.Reporter(out)), connect)
    pinned = state.known_hosts.read_text()
    assert "10.0.0.2 " not in pinned and "10.0.0.1 " in pinned and "10.0.0.3 " in pinned
    assert "a1: forgot the pinned host key of the replaced machine" in out.getvalue()
    assert "a1" not in connect.through  # the API is not asked through the machine being replaced


def test_replace_refuses_a_node_that_stays_ready_and_an_unknown_name(lab):
    inventory, state, connect, _ = lab
    before = state.known_hosts.read_text()
    out = io.StringIO()
    with pytest.raises(UsageError, match="a2 is Ready in the cluster, so its machine was not replaced"):
        forget_replaced_keys(inventory, state, ["a2"], progress.Console(progress.Reporter(out)), connect, wait_s=2)
    assert "a2: still Ready in the cluster; waiting up to 2s" in out.getvalue()
    with pytest.raises(UsageError, match="no node named zz"):
        forget_replaced_keys(inventory, state, ["zz"], progress.Console(progress.Reporter(io.StringIO())), connect)
    assert state.known_hosts.read_text() == before
    assert hostkeys.known_hosts_entry("10.0.0.3", 22) in before


def test_replace_waits_for_a_machine_lost_moments_ago_to_go_not_ready(lab):
    """Killed and replaced within the node controller's grace period: the old Node still
    says Ready, so --replace waits until it does not, then forgets the key."""
    import time

    inventory, state, connect, a2 = lab
    a2.stop()
    out = io.StringIO()
    started = time.monotonic()
    forget_replaced_keys(inventory, state, ["a2"], progress.Console(progress.Reporter(out)), connect, wait_s=30)
    assert time.monotonic() - started < 30
    assert "a2: still Ready in the cluster; waiting" in out.getvalue()
    assert "a2: forgot the pinned host key of the replaced machine" in out.getvalue()
    assert "10.0.0.3 " not in state.known_hosts.read_text()
