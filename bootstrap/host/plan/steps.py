"""The steps `up` and `rebuild` run, in order, from the hosts' plans: prepare every host,
the first server, the other servers one at a time (etcd joins one member at a time), all
agents, the NVIDIA runtime check on GPU nodes. A GPU node's image pulls start in the
background as soon as its k3s runs (with its start, or with its other changes when k3s
already runs: bootstrap.host.parts.k3s_images), so no step waits for a download. Pure: it
decides the commands (bootstrap.deploys.converge); bootstrap.remote.executor runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.deploys import converge
from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.inventory.model import Inventory


@dataclass
class Step:
    name: str
    commands: dict[str, list] = field(default_factory=dict)  # node name -> pyinfra commands
    # A host this step cannot work without: when it failed an earlier step of the same run,
    # this step's hosts are refused at once instead of waiting out their start time-outs.
    needs: str | None = None
    # What a host's line says for this step when it does more than the step's name (the
    # first server started in the step that prepares the others).
    labels: dict[str, str] = field(default_factory=dict)

    def label(self, host: str) -> str:
        return self.labels.get(host, self.name)


def first_server_step(inventory: Inventory) -> str:
    """The step that starts the first server: after it, its kubeconfig exists."""
    return f"start server {inventory.servers[0].name}"


def converge_steps(inventory: Inventory, plans: dict[str, HostPlan], failed: set[str],
                   restore: tuple[str, Path] | None = None, place_with_start: bool = False,
                   first_server_early: bool = False):
    """`restore`: (server name, local snapshot) to restore the control plane from before
    that server first starts (`rebuild` after the control plane was lost). Then, as k3s's
    restore procedure says (bootstrap.host.plan.restore), every other server is stopped and
    loses its old etcd data before the restore, and starts again after the restored one.
    `place_with_start`: a node that (re)starts gets its files in its start's command, not
    in a "prepare host" step before it (the joins after a new cluster's CA exists: their
    config.yaml is all they place, and a step less is a round trip less).
    `first_server_early`: the first server is placed and (re)started in the "prepare host"
    step, while the others are prepared (nothing it runs needs them, and they join only in
    later steps): its start is off the critical path's preparation round trip."""
    first = inventory.servers[0].name
    starting = {n for n, p in plans.items() if p.service} if place_with_start and not restore else set()
    early = first if first_server_early and not restore and plans.get(first) and plans[first].service else None
    prepare = Step("prepare host", {n: converge.placement_commands(p) for n, p in plans.items()
                                    if n not in starting and n != early})
    if early:
        prepare.commands[early] = converge.placed_and_started(plans[early], plans[early].service)
        prepare.labels[early] = f"prepare host, {first_server_step(inventory)}"
    steps = [prepare]
    peers: set[str] = set()
    if restore:
        peers = {s.name for s in inventory.servers if s.name != restore[0] and s.name in plans and s.name not in failed}
        steps.append(Step("clear etcd data on the other servers", {n: converge.clear_peer_commands() for n in peers}))
        s3 = inventory.k3s.snapshots.s3 is not None
        steps.append(Step(f"restore etcd snapshot on {restore[0]}",
                          {restore[0]: converge.restore_commands(restore[1], s3_configured=s3)}))
    # Started by this run (it was not running): nothing can join it until it runs.
    first_starts = plans.get(first) is not None and plans[first].service == "start"
    needs = first if first_starts else None
    for server in inventory.servers:
        plan = plans.get(server.name)
        step = Step(first_server_step(inventory) if server.name == first else f"join server {server.name}",
                    needs=None if server.name == first else needs)
        if server.name == early:
            pass  # started with the preparation
        elif plan and server.name in peers:
            # Stopped for the restore: it starts whatever its plan said.
            step.commands[server.name] = [start_command(plan, "start")]
        elif plan and plan.service:
            if server.name != first and first in failed:
                step.commands[server.name] = [converge.refuse(f"not joining: the first server {first} failed")]
            else:
                step.commands[server.name] = start_commands(plan, plan.service, server.name in starting)
        steps.append(step)
    agents = Step("join agents", needs=needs)
    for agent in inventory.agents:
        plan = plans.get(agent.name)
        if plan and plan.service:
            agents.commands[agent.name] = start_commands(plan, plan.service, agent.name in starting)
    steps.append(agents)
    steps.append(Step("check nvidia runtime", {n: [converge.verify_nvidia_runtime_command()]
                                                for n, p in plans.items() if p.verify_nvidia_runtime}))
    return steps


def start_commands(plan: HostPlan, action: str, placed_here: bool) -> list:
    """The start's command; with the node's files placed first in it when `placed_here`."""
    return converge.placed_and_started(plan, action) if placed_here else [start_command(plan, action)]


def start_command(plan: HostPlan, action: str):
    """(Re)start k3s and wait for it; then, in the same command, start the node's image pulls."""
    return converge.wait_for_service(plan.unit, action, plan.start_timeout, then=plan.pull_after_start)
