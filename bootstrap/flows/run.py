"""One run of a command: everything its phases share, in one place.

A flow makes one `Run` and hands it from phase to phase: the inventory (as loaded, then
once the probe answered and preflight passed, resolved once: each node's node-ip and the
secrets that go into host files; the planners and the cluster side read that same one),
the state folder, the console, the hosts' session, the cluster link, the topology
(bootstrap.topology, resolved once after the probe) and per host ONE `HostRecord`: its
facts, its plan, its failure and what its steps did.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gevent

from bootstrap.cluster.client import connect as connect_to_cluster, reusing_ssh
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory, Node
from bootstrap.progress import Console
from bootstrap.checks.node_addresses import with_node_ips
from bootstrap.state.secrets import with_secret_values
from bootstrap.state.folder import StateDir
from bootstrap.topology import Topology, resolve_topology


@dataclass
class HostRecord:
    """What the run knows of one host. `failure` is read from the session's book of
    failures (the session records them as its steps fail): there is no second copy."""

    node: Node
    facts: HostFacts | None = None
    plan: object = None  # its HostPlan, once planned
    result: dict = field(default_factory=dict)  # step name -> StepResult, over every batch
    replaced: bool = False  # a new machine under this node's name (flows.replaced_machines)
    replaced_member: bool = False  # replaced, and its old machine was an etcd member: it leaves etcd first
    failures: dict = field(default_factory=dict, repr=False)  # the session's book (shared, not copied)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def failure(self):
        return self.failures.get(self.node.name)

    def merge_result(self, steps: dict) -> None:
        """One executed batch of steps: a step a host had nothing to do in does not hide
        what an earlier batch did in it."""
        for step, outcome in steps.items():
            if step not in self.result or outcome.status != "no change":
                self.result[step] = outcome


@dataclass
class Run:
    inventory: Inventory
    state: StateDir
    console: Console
    connect: Callable = connect_to_cluster  # (inventory, state) -> context manager of a Cluster
    take_snapshot: Callable | None = None  # (inventory, state) -> path; None: bootstrap.state.snapshots.take
    session: object = None
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    topology: Topology | None = None
    tokens: object = None  # the JoinTokens the plans carry
    replan: Callable | None = None  # make the plans again with other tokens: replan(tokens=...)
    join_via: Node | None = None  # the healthy server to join when the first server's machine was replaced
    resolved: bool = False  # the inventory holds node-ips and secret values
    started: float = field(default_factory=time.monotonic)
    _reprobe: object = field(default=None, repr=False)
    # The API connection made ahead of the cluster side (bootstrap.cluster.early_connection),
    # and whether it was made after the first server's k3s (re)started in this run.
    early_cluster: object = None
    early_after_start: bool = False

    def __post_init__(self):
        for node in self.inventory.nodes:
            self.hosts.setdefault(node.name, HostRecord(node))

    # --- the hosts -------------------------------------------------------------------------

    def open_hosts(self, stack: contextlib.ExitStack, open_session, nodes, command: str):
        """The hosts' session for the rest of the run; the cluster link reuses its SSH
        connections (the API tunnel goes over the first server's, not a new one)."""
        with self.console.phase("connect"):
            self.session = stack.enter_context(open_session(self.inventory, list(nodes), command, self.console))
        self.connect = reusing_ssh(self.connect, self.session)
        self.attach(self.session)
        return self.session

    def attach(self, session) -> None:
        """Use `session` (already open) for the hosts."""
        self.session = session
        for record in self.hosts.values():
            record.failures = session.failures

    @property
    def failures(self) -> dict:
        return self.session.failures if self.session is not None else {}

    def fail(self, name: str, message: str, hint: str | None = None) -> None:
        self.session.fail(name, message, hint)

    def failed(self, name: str) -> bool:
        return name in self.failures

    # --- facts -----------------------------------------------------------------------------

    @property
    def facts(self) -> dict[str, HostFacts]:
        """{node: facts} of every host that answered, in inventory order."""
        return {n: r.facts for n, r in self.hosts.items() if r.facts is not None}

    def set_facts(self, facts: dict[str, HostFacts]) -> None:
        """A probe's answer (a host missing from it did not answer); the first one also
        resolves the topology, which later probes leave as it is."""
        for name, record in self.hosts.items():
            record.facts = facts.get(name)
        if self.topology is None:
            self.topology = resolve_topology(self.inventory, self.facts)

    def forget_facts(self, name: str) -> None:
        self.hosts[name].facts = None

    def reprobe_in_background(self, probe: Callable[[], dict]) -> None:
        """Read the facts again while the cluster side waits for the nodes (they are needed
        only after that); `settled_facts()` waits for the answer. Ended with the run."""
        self._reprobe = gevent.spawn(probe)

    @property
    def reprobing(self) -> bool:
        return self._reprobe is not None

    def settled_facts(self) -> dict[str, HostFacts]:
        """The facts, after the background probe (if one runs) has answered."""
        if self._reprobe is not None:
            again, self._reprobe = self._reprobe.get(), None
            self.set_facts(again)
        return self.facts

    def stop_reprobe(self) -> None:
        if self._reprobe is not None:
            self._reprobe.kill()

    # --- plans -----------------------------------------------------------------------------

    def resolve_inventory(self) -> Inventory:
        """Once, after preflight: each node's chosen node-ip, and the secrets that go into
        host files read (the planners stay pure). The planners and the cluster side read it."""
        if not self.resolved:
            self.inventory = with_secret_values(with_node_ips(self.inventory, self.facts, self.topology.addresses))
            self.resolved = True
        return self.inventory

    @property
    def plans(self) -> dict:
        return {n: r.plan for n, r in self.hosts.items() if r.plan is not None}

    def set_plans(self, plans: dict) -> None:
        for name, plan in plans.items():
            self.hosts[name].plan = plan

    @property
    def changed(self) -> bool:
        return any(p.changed for p in self.plans.values())

    @property
    def results(self) -> dict:
        return {n: r.result for n, r in self.hosts.items() if r.result}

    def merge_results(self, more: dict) -> None:
        for name, steps in more.items():
            self.hosts[name].merge_result(steps)

    def elapsed(self) -> float:
        return time.monotonic() - self.started
