"""The scale-down flow in-process: the sandboxed stand-in API (tests/sandbox.py: a first
server, a second server joined to it, an agent) and a fake host session. k3s rejoins its
cluster whenever it starts, so a node leaves in this order: drained, k3s stopped on its
host, removed from the cluster (etcd member, Node), uninstalled; a host whose k3s did not
stop keeps its node."""

import contextlib
import io

import pytest
import yaml
from fakes import FakeSession
from sandbox import TOKEN, Cluster, Proc, free_port, k3s, wait  # noqa: F401  (k3s: the built stand-in)

from bootstrap import progress
from bootstrap.cluster.client import Cluster as ApiCluster
from bootstrap.errors import HostsFailed, UsageError
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.flows.scale_down import STOP_STEP, ScaleDownOptions, scale_down
from bootstrap.host.parts import k3s_service
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

REMOVED = "etcd.k3s.cattle.io/removed-node-name"


def joined_server(lab: Cluster, name: str) -> Proc:
    root = lab.base / name
    (root / "etc/rancher/k3s").mkdir(parents=True)
    (root / "etc/rancher/k3s/config.yaml").write_text(yaml.safe_dump(
        {"server": f"https://127.0.0.1:{lab.port}", "token": TOKEN}))
    proc = Proc(lab.k3s, ["server", "--https-listen-port", str(free_port()), "--bind-address", "127.0.0.1",
                          "--node-name", name], root)
    lab.procs.append(proc)
    return proc


@pytest.fixture
def lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    processes = {"cp-2": joined_server(sandbox, "cp-2"), "a1": sandbox.agent("a1")}
    sandbox.wait_ready("cp-1", "cp-2", "a1")
    etcd = sandbox.node("cp-2").metadata.labels.get("node-role.kubernetes.io/etcd")
    assert etcd == "true", "the joined server is an etcd member"
    yield sandbox, processes
    sandbox.stop()


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp-1", "address": "10.0.0.1", "role": "server"},
        {"name": "cp-2", "address": "10.0.0.2", "role": "server"},
        {"name": "cp-3", "address": "10.0.0.3", "role": "server"},
        {"name": "a1", "address": "10.0.0.4"}]}))
    inventory = load_inventory(path)
    state = StateDir(inventory)
    k3s_units = K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", "active")])
    ours = HostFacts(manifest={"cluster_id": state.cluster_id, "files": []}, k3s=k3s_units)
    return inventory, state, {n.name: ours for n in inventory.nodes}


class Hosts(FakeSession):
    """Records, for each step on each host, where its node stood in the cluster just then;
    the stop step stops that host's stand-in k3s, as `systemctl stop` does."""

    def __init__(self, inventory, facts, lab, processes, **kw):
        super().__init__(inventory, facts, **kw)
        self.lab, self.processes, self.seen, self.commands = lab, processes, [], {}

    def standing(self, name):
        status, text = self.lab.raw("GET", f"/api/v1/nodes/{name}")
        if status == 404:
            return "gone"
        return "member removed" if REMOVED in yaml.safe_load(text)["metadata"].get("annotations", {}) else "in cluster"

    def execute(self, steps, after=None):
        for step in steps:
            for name, commands in step.commands.items():
                if name in self.failures:
                    continue
                self.seen.append((step.name, name, self.standing(name)))
                self.commands[(step.name, name)] = [c.bits[0] if hasattr(c, "bits") else str(c) for c in commands]
                if step.name == STOP_STEP and name not in self.failing:
                    self.processes[name].stop()
        return super().execute(steps, after)


def run(inventory, state, session, lab, *names):
    through = []

    @contextlib.contextmanager
    def connect(inv, st):
        through.append([n.name for n in inv.servers])
        yield ApiCluster(lab.api, state.path / "kubeconfig")

    scale_down(inventory, state, ScaleDownOptions(nodes=list(names)), progress.Console(progress.Reporter()),
               connect=connect, open_session=lambda *a: contextlib.nullcontext(session))
    return through


def test_k3s_stops_before_the_member_and_node_go_and_the_uninstall_comes_last(lab, cluster, capsys):
    sandbox, processes = lab
    inventory, state, facts = cluster
    session = Hosts(inventory, facts, sandbox, processes)
    through = run(inventory, state, session, sandbox, "cp-2", "a1")
    assert session.seen == [
        (STOP_STEP, "cp-2", "in cluster"), (STOP_STEP, "a1", "in cluster"),  # still members when k3s stops
        ("remove agent", "a1", "gone"), ("remove server", "cp-2", "gone")]   # uninstalled once removed
    assert session.commands[(STOP_STEP, "cp-2")] == ["\n".join(k3s_service.stop_service(check=True))]
    assert through == [["cp-1", "cp-3"]]  # the API through a server that stays up
    out = capsys.readouterr().out
    assert "cp-2: k3s stopped; removed from the cluster" in out
    assert "now remove from" in out and "the node named cp-2, the node named a1" in out
    assert [n.metadata.name for n in sandbox.core.list_node().items] == ["cp-1"]


@pytest.mark.parametrize("how", ["k3s did not stop", "host unreachable"])
def test_a_host_whose_k3s_may_still_run_keeps_its_node_and_member(lab, cluster, how, capsys):
    sandbox, processes = lab
    inventory, state, facts = cluster
    session = Hosts(inventory, facts, sandbox, processes, failing=["cp-2"] if how == "k3s did not stop" else (),
                    unreachable=["cp-2"] if how == "host unreachable" else ())
    with pytest.raises(HostsFailed, match="cp-2"):
        run(inventory, state, session, sandbox, "cp-2")
    assert ("remove server", "cp-2") not in session.executed
    node = sandbox.node("cp-2")
    assert node.spec.unschedulable and REMOVED not in (node.metadata.annotations or {})
    assert "cp-2: k3s was not stopped there, so it stays in the cluster, cordoned" in capsys.readouterr().out


@pytest.fixture
def gpu_lab(k3s, tmp_path):  # noqa: F811
    sandbox = Cluster(k3s, tmp_path / "hosts")
    sandbox.server(name="cp-1")
    sandbox.agent("g1", gpus=1)
    sandbox.wait_ready("cp-1", "g1")
    wait("g1's GPU labels", lambda: sandbox.node("g1").metadata.labels.get("nvidia.com/gpu.present") == "true")
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp-1", "address": "10.0.0.1", "role": "server"}, {"name": "g1", "address": "10.0.0.2"}]}))
    inventory = load_inventory(path)
    yield sandbox, inventory, StateDir(inventory)
    sandbox.stop()


class Stop(Exception):
    """Raised where the hosts would be opened: the flow got that far."""


def idle(lab, inventory, state, **options):
    @contextlib.contextmanager
    def connect(*_):
        yield ApiCluster(lab.api, lab.base / "kubeconfig")

    def hosts(*_):
        raise Stop

    scale_down(inventory, state, ScaleDownOptions(idle=True, drain_timeout=5, **options),
               progress.Console(progress.Reporter()), connect=connect, open_session=hosts)


def test_idle_gpu_nodes_stay_while_gpu_pods_wait_for_capacity(gpu_lab):
    lab, inventory, state = gpu_lab
    lab.core.create_namespaced_pod("default", {"metadata": {"name": "train"}, "spec": {"containers": [
        {"name": "main", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})
    wait("train pending", lambda: lab.core.read_namespaced_pod("train", "default").status.phase == "Pending")
    with pytest.raises(UsageError, match=r"1 GPU pod\(s\) wait for a GPU \(default/train\); nothing was changed"):
        idle(lab, inventory, state, assume_yes=True)
    assert not lab.node("g1").spec.unschedulable


def test_idle_removal_asks_first(gpu_lab, monkeypatch):
    lab, inventory, state = gpu_lab
    monkeypatch.setattr("sys.stdin", open("/dev/null"))  # not a terminal: no one to ask
    with pytest.raises(UsageError, match="refusing to remove the idle GPU nodes g1 without confirmation"):
        idle(lab, inventory, state)
    assert not lab.node("g1").spec.unschedulable
    with pytest.raises(Stop):  # confirmed: drained, then on to the hosts
        idle(lab, inventory, state, assume_yes=True)
    assert lab.node("g1").spec.unschedulable


def test_idle_keep_leaves_that_many_idle_gpu_nodes(gpu_lab):
    lab, inventory, state = gpu_lab
    out = io.StringIO()

    @contextlib.contextmanager
    def connect(*_):
        yield ApiCluster(lab.api, lab.base / "kubeconfig")

    scale_down(inventory, state, ScaleDownOptions(idle=True, keep=1, assume_yes=True),
               progress.Console(progress.Reporter(out)), connect=connect, open_session=lambda *a: pytest.fail("opened"))
    assert "keeping 1 idle GPU node(s) (--keep 1): g1" in out.getvalue()
    assert "nothing to remove: every idle GPU node is kept" in out.getvalue()
    assert not lab.node("g1").spec.unschedulable
