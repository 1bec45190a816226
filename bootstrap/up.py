"""`bootstrap up`, host side: facts, preflight, then converge every host in parallel.

Order: prepare all hosts (files, packages, kernel settings) -> the first server ->
the other servers one at a time (etcd joins one member at a time) -> all agents ->
check the NVIDIA runtime on GPU nodes -> fetch the kubeconfig.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from bootstrap import artifacts as art
from bootstrap.errors import BootstrapError, HostsFailed
from bootstrap.facts.model import HostFacts
from bootstrap.hostplan import desired as d
from bootstrap.hostplan.plan import HostPlan, plan_host
from bootstrap.hostplan.drivers import driver_packages
from bootstrap.inventory.model import Inventory
from bootstrap.preflight import Finding, is_gpu_node, preflight
from bootstrap.statedir import StateDir


class PreflightFailed(BootstrapError):
    pass


def load_or_create_token(state: StateDir, facts: dict[str, HostFacts], inventory: Inventory) -> str:
    """The join token: generated once by the tool, kept 0600 in the state folder."""
    path = state.path / "token"
    if path.exists():
        return path.read_text().strip()
    existing = [n.name for n in inventory.servers if d.CONFIG in facts.get(n.name, HostFacts()).files]
    if existing:
        raise BootstrapError(
            f"server {existing[0]} already runs a k3s configured by bootstrap, but the join token is not "
            f"in the state folder {state.path}",
            "restore the state folder (token, known_hosts) from where `up` ran before, or set "
            "state_dir in the inventory to it")
    token = secrets.token_hex(24)
    state.write_secret("token", token + "\n")
    return token


def managed_paths(inventory: Inventory, artifacts: dict[str, art.K3sArtifacts]) -> list[str]:
    paths = {d.MODULES_FILE, d.SYSCTL_FILE, d.CONFIG, d.REGISTRIES, d.K3S_BINARY, d.TOOLKIT_SOURCE,
             d.MANIFEST, d.KUBECONFIG, "/etc/systemd/system/k3s.service", "/etc/systemd/system/k3s-agent.service"}
    for item in artifacts.values():
        if item.images:
            paths.add(f"{d.IMAGES_DIR}/{item.images.path.name}")
    return sorted(paths)


def local_images_candidates(inventory: Inventory) -> list[str]:
    if not inventory.k3s.airgap:
        return []
    folder = Path(inventory.k3s.airgap).expanduser()
    if not folder.is_absolute():
        folder = (Path(inventory.source).parent / folder).resolve()
    return [f"{d.IMAGES_DIR}/{p.name}" for p in folder.glob("k3s-airgap-images-*.tar*")]


@dataclass
class Plans:
    plans: dict[str, HostPlan]
    gpu_nodes: set[str]


def make_plans(inventory: Inventory, facts: dict[str, HostFacts], token: str,
               artifacts: dict[str, art.K3sArtifacts]) -> Plans:
    plans, gpu_nodes = {}, set()
    for node in inventory.nodes:
        host = facts.get(node.name)
        if host is None:
            continue
        gpu = is_gpu_node(inventory, node, host)
        if gpu:
            gpu_nodes.add(node.name)
        packages = driver_packages(inventory, host) if gpu else []
        want = d.desired_state(inventory, node, token, artifacts[host.arch], gpu, packages)
        plans[node.name] = plan_host(node, want, host)
    return Plans(plans, gpu_nodes)


def print_findings(findings: list[Finding], out=sys.stdout) -> None:
    for finding in sorted(findings, key=lambda f: (f.node, f.severity != "error")):
        print(finding.render(), file=out)


def converge_steps(inventory: Inventory, plans: dict[str, HostPlan], failed: set[str]):
    from bootstrap.deploys import converge as c
    from bootstrap.hosts.executor import Step

    prepare = Step("prepare host", {n: c.placement_commands(p) for n, p in plans.items()})
    steps = [prepare]
    first = inventory.servers[0].name
    for server in inventory.servers:
        plan = plans.get(server.name)
        step = Step(f"{'start' if server.name == first else 'join'} server {server.name}")
        if plan and plan.service:
            if server.name != first and first in failed:
                step.commands[server.name] = [c.refuse(f"not joining: the first server {first} failed")]
            else:
                step.commands[server.name] = [c.wait_for_service(plan.unit, plan.service)]
        steps.append(step)
    agents = Step("join agents")
    for agent in inventory.agents:
        plan = plans.get(agent.name)
        if plan and plan.service:
            agents.commands[agent.name] = [c.wait_for_service(plan.unit, plan.service)]
    steps.append(agents)
    steps.append(Step("check nvidia runtime", {n: [c.verify_nvidia_runtime_command()]
                                                for n, p in plans.items() if p.verify_nvidia_runtime}))
    return steps
