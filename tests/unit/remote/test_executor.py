"""The step executor on real greenlets, with commands that run here: a join waits for the
first server it joins only while that server is fine in this run."""

import io
from types import SimpleNamespace

from pyinfra.api import FunctionCommand

from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.host.plan.steps import Step, converge_steps
from bootstrap.remote import executor
from bootstrap.remote.session import HostFailure
from bootstrap.inventory.loader import parse_inventory
from bootstrap.progress import JsonReporter

INV = parse_inventory("cluster: t\nnodes: [{name: cp-1, address: 10.0.0.1, role: server},"
                      " {name: cp-2, address: 10.0.0.2, role: server}, {name: cp-3, address: 10.0.0.3, role: server},"
                      " {name: a-1, address: 10.0.0.4}]\n")


class Session:
    def __init__(self, names):
        hosts = {n: SimpleNamespace(name=n, data={}) for n in names}
        self.pyinfra_state = SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.__getitem__))
        self.reporter = JsonReporter(io.StringIO())
        self.names, self.failures = names, {}

    def active_nodes(self):
        return [SimpleNamespace(name=n) for n in self.names]

    def fail(self, name, message, hint=None):
        self.failures.setdefault(name, HostFailure(name, message, hint))


def test_joins_are_refused_at_once_when_the_first_server_failed_to_start():
    """An SSH connection cut while the first server started: the joins used to run, each
    waiting out its start time-out (20 s in the lab, minutes on real hosts) against a server
    that was not running, and the run named four k3s failures instead of one cause."""
    ran = []

    def works(state, host):
        ran.append(host.name)
        return True

    def connection_lost(state, host):
        raise OSError("[Errno 103] Software caused connection abort")

    session = Session(["cp-1", "cp-2", "a-1"])
    steps = [Step("start server cp-1", {"cp-1": [FunctionCommand(connection_lost, (), {})]}),
             Step("join server cp-2", {"cp-2": [FunctionCommand(works, (), {})]}, needs="cp-1"),
             Step("join agents", {"a-1": [FunctionCommand(works, (), {})]}, needs="cp-1")]
    results = executor.execute(session, steps)
    assert ran == []
    assert results["cp-2"]["join server cp-2"].error == "not run: cp-1, which it joins, failed"
    assert results["a-1"]["join agents"].status == "failed"
    assert set(session.failures) == {"cp-1", "cp-2", "a-1"}
    assert "Software caused connection abort" in session.failures["cp-1"].render()
    # a first server that is fine lets them run
    session = Session(["cp-1", "cp-2", "a-1"])
    steps[0] = Step("start server cp-1", {"cp-1": [FunctionCommand(works, (), {})]})
    executor.execute(session, steps)
    assert ran == ["cp-1", "cp-2", "a-1"] and not session.failures


def test_the_joins_need_the_first_server_only_when_this_run_starts_it():
    def plans(first_service):
        return {n.name: HostPlan(node=n, unit="k3s" if n.role == "server" else "k3s-agent",
                                 service=first_service if n.name == "cp-1" else "start") for n in INV.nodes}

    steps = {s.name: s for s in converge_steps(INV, plans("start"), set())}
    assert steps["start server cp-1"].needs is None
    assert steps["join server cp-2"].needs == steps["join server cp-3"].needs == steps["join agents"].needs == "cp-1"
    # restarted (it runs now, with other servers beside it): the others are not held back
    steps = {s.name: s for s in converge_steps(INV, plans("restart"), set())}
    assert steps["join server cp-2"].needs is None and steps["join agents"].needs is None
