"""Which running nodes a version change upgrades, in which order, and what k3s would refuse.

Pure. A node is upgraded when it runs k3s now (its unit is active) and its plan replaces
the k3s binary. Servers go one at a time (etcd keeps quorum, each back before the next),
then agents in batches of `max_unavailable`; nodes that are new or only reconfigured
converge as usual, between the two (so they never run a newer k3s than the servers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import k3s_binary
from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.inventory.model import Inventory, Role
from bootstrap.checks.preflight import Finding
from bootstrap.checks.k3s_versions import upgrade_problem


@dataclass
class Rollout:
    target: str | None
    installed: dict[str, str | None] = field(default_factory=dict)  # node -> version it runs now
    servers: list[str] = field(default_factory=list)
    agent_batches: list[list[str]] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        return self.servers + [n for batch in self.agent_batches for n in batch]

    def describe(self) -> list[str]:
        """The order, for `plan` and for `up` before it starts."""
        lines = [f"k3s rolling upgrade to {self.target or 'the k3s.airgap binary'}, in this order:"]
        step = 0
        for name in self.servers:
            step += 1
            lines.append(f"  {step}. server {name} ({self.installed.get(name) or '?'}): replace the binary, "
                         "restart, wait Ready")
        for batch in self.agent_batches:
            step += 1
            names = ", ".join(f"{n} ({self.installed.get(n) or '?'})" for n in batch)
            lines.append(f"  {step}. agent{'s' if len(batch) > 1 else ''} {names}: cordon, drain, replace the "
                         "binary, restart, wait Ready, uncordon")
        return lines


def running(plan: HostPlan, host: HostFacts) -> bool:
    unit = host.k3s.unit(f"{plan.unit}.service") if host.k3s else None
    return bool(unit and unit.active)


def plan_rollout(inventory: Inventory, facts: dict[str, HostFacts], plans: dict[str, HostPlan],
                 target: str | None, max_unavailable: int = 1) -> Rollout | None:
    rollout = Rollout(target)
    agents = []
    for node in inventory.nodes:
        plan, host = plans.get(node.name), facts.get(node.name)
        if plan is None or host is None or not (plan.replaces_binary and running(plan, host)):
            continue
        rollout.installed[node.name] = host.k3s.version
        (rollout.servers if node.role == Role.SERVER else agents).append(node.name)
    size = max(1, max_unavailable)
    rollout.agent_batches = [agents[i:i + size] for i in range(0, len(agents), size)]
    return rollout if rollout.nodes else None


def version_findings(inventory: Inventory, facts: dict[str, HostFacts], target: str | None,
                     airgap_sha: dict[str, str | None]) -> list[Finding]:
    """What k3s would refuse, found before any host changes. `airgap_sha`: per arch, the
    air-gap binary's sha256 (None when downloading)."""
    findings = []
    for node in inventory.nodes:
        host = facts.get(node.name)
        if host is None or not (host.k3s and host.k3s.version):
            continue
        installed = host.k3s.version
        if target:
            problem = upgrade_problem(installed, target)
            if problem:
                findings.append(Finding(node.name, "k3s version", problem[0], problem[1]))
            continue
        binary = host.files.get(k3s_binary.PATH)
        wanted = airgap_sha.get(host.arch)
        if wanted and binary is not None and binary.sha256 != wanted:
            findings.append(Finding(
                node.name, "k3s version",
                f"runs k3s {installed}, and the k3s.airgap binary is a different build whose version is not known",
                "set k3s.version to the release in the k3s.airgap folder, so the upgrade can be checked and rolled"))
    return findings
