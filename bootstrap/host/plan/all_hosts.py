"""Every host's plan at once: desired state per node from the inventory and the facts,
compared with what each host holds. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from bootstrap.host.release import K3sArtifacts
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import k3s_service
from bootstrap.host.plan.desired import desired_state
from bootstrap.host.plan.drivers import driver_packages
from bootstrap.host.plan.host_plan import HostPlan, plan_host
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.host.plan.rollout import plan_rollout
from bootstrap.inventory.model import Inventory
from bootstrap.topology import resolve_topology
from bootstrap.remote_data import RemoteDataError
from bootstrap.checks.node_addresses import with_node_ips


@dataclass
class Plans:
    plans: dict[str, HostPlan]
    gpu_nodes: set[str]
    target_version: str | None = None  # the k3s release being installed
    # Hosts whose facts could not be planned from (bootstrap.remote_data): node -> why.
    failures: dict[str, str] = field(default_factory=dict)
    tokens: JoinTokens | None = None  # what the plans' config.yaml files carry
    replan: Callable[..., "Plans"] | None = None  # make_plans with the same facts: replan(tokens=...)

    def rollout(self, inventory: Inventory, facts: dict[str, HostFacts], max_unavailable: int = 1):
        """The rolling upgrade these plans imply (running nodes whose binary changes), or None."""
        return plan_rollout(inventory, facts, self.plans, self.target_version, max_unavailable)


def make_plans(inventory: Inventory, facts: dict[str, HostFacts], tokens: JoinTokens,
               artifacts: dict[str, K3sArtifacts], cluster_id: str, join_via=None, topology=None) -> Plans:
    """`topology`: the run's (bootstrap.topology), with `inventory` already resolved with it
    (node-ips chosen: bootstrap.flows.run.Run.resolve_inventory); made here when not given."""
    if topology is None:
        # node-ip is one of each host's own addresses (the public one is often only a NAT).
        inventory = with_node_ips(inventory, facts)
        topology = resolve_topology(inventory, facts)
    join_via = inventory.node(join_via.name) if join_via is not None else None
    plans, failures = {}, {}
    gpu_names = set(topology.gpu_nodes)
    mirror = topology.embedded_mirror
    for node in inventory.nodes:
        host = facts.get(node.name)
        if host is None:
            continue
        gpu = node.name in gpu_names
        packages = driver_packages(inventory, host) if gpu else []
        config_now = host.files.get(k3s_service.CONFIG)  # the gate leaves a pre-gate config.yaml as it is
        want = desired_state(inventory, node, tokens, artifacts[host.arch], gpu, packages, join_via,
                               embedded_mirror=mirror, os_release=(host.os_id, host.os_version_id),
                               current_config_sha=config_now.sha256 if config_now else None)
        try:
            plans[node.name] = plan_host(node, want, host, cluster_id, inventory.cluster)
        except RemoteDataError as exc:  # one host's answer: its failure, never the others'
            failures[node.name] = str(exc)
    return Plans(plans, gpu_names, failures=failures)
