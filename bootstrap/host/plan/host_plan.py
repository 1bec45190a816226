"""Compare what a host should hold with what its facts say it holds: the changes to make.

Pure. The result says, per host, which files to write, what to run as root to prepare the
host, and whether k3s must start or restart, so `up` on a converged host does nothing and
`plan` can show the same answer without changing anything. Each host part adds its own
actions (bootstrap.host.parts), in the order the root script runs them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import k3s_binary, k3s_images, k3s_service, kernel, manifest, packages
from bootstrap.host.parts.base import Action, Draft, FileSpec
from bootstrap.host.plan.desired import Desired, needs_host_toolkit_runtime
from bootstrap.inventory.model import Node


@dataclass
class HostPlan:
    node: Node
    unit: str
    uploads: list[FileSpec] = field(default_factory=list)
    prepare: list[str] = field(default_factory=list)  # shell lines run as root after files are placed
    service: str | None = None  # None | "start" | "restart"
    changes: list[str] = field(default_factory=list)  # for people: what will change (no secrets)
    verify_nvidia_runtime: bool = False
    prepull: list[str] = field(default_factory=list)  # images to pull once k3s runs
    pull_after_start: list[str] = field(default_factory=list)  # shell lines starting them, after a (re)start
    start_timeout: int = 300  # seconds a (re)start may take: k3s imports its image archives first
    actions: set[Action] = field(default_factory=set)  # for code: what the plan does (see Action)

    @property
    def changed(self) -> bool:
        return bool(self.uploads or self.prepare or self.service or self.prepull)

    @property
    def replaces_binary(self) -> bool:
        return Action.REPLACE_BINARY in self.actions


def plan_host(node: Node, desired: Desired, facts: HostFacts, cluster_id: str, cluster: str) -> HostPlan:
    """`cluster_id`/`cluster`: recorded in the host's manifest, so a later `down` or another
    cluster's `up` knows whose host this is."""
    draft = Draft(HostPlan(node=node, unit=k3s_service.unit_name(node.role)),
                  manifest.record(facts.manifest, cluster_id, cluster))
    place_files(draft, desired.files, facts)
    k3s_binary.plan(draft, desired.k3s_download, facts)
    kernel.plan(draft, facts, desired.sysctls)
    packages.plan(draft, desired.packages, desired.toolkit_source, facts)
    k3s_service.plan(draft, facts)
    k3s_images.plan_import(draft, facts.k3s.version if facts.k3s else None,
                           [f for f in desired.files if f.image_archive])
    manifest.plan(draft, desired.paths(), facts.manifest)
    running = facts.k3s.version if facts.k3s else None
    k3s_images.plan_prepull(draft, desired.prepull, facts,
                            (desired.k3s_version or running) if draft.plan.service else running)
    plan = draft.plan
    if desired.gpu and needs_host_toolkit_runtime(desired):
        runtimes = facts.containerd.runtimes if facts.containerd else []
        plan.verify_nvidia_runtime = plan.service is not None or "nvidia" not in runtimes
    return plan


def place_files(draft: Draft, files: list[FileSpec], facts: HostFacts) -> None:
    """Upload what is missing or different; fix only the mode where the content is right."""
    plan = draft.plan
    for spec in files:
        current = facts.files.get(spec.path)
        if current is None or current.sha256 != spec.sha256:
            plan.uploads.append(spec)
            plan.changes.append(f"{'create' if current is None else 'update'} {spec.path}")
            draft.restart |= spec.restarts_k3s
        elif current.mode != spec.mode:
            plan.prepare.append(f"chmod {spec.mode:o} {shlex.quote(spec.path)}")
            plan.changes.append(f"chmod {spec.mode:o} {spec.path}")
        else:
            continue
        plan.actions.add(Action.PLACE_FILES)


def before_the_ca(plan: HostPlan) -> HostPlan:
    """A joining node's plan without its config.yaml, its unit's enabling and its start:
    what it can do while the first server of a new cluster starts (its config names the CA
    that server makes). Not enabled yet: a host that reboots now (a spot VM, a crash) must
    not boot into k3s without its config (bootstrap.host.parts.k3s_service.enable_line)."""
    enable = k3s_service.enable_line(plan.unit)
    return replace(plan, uploads=[u for u in plan.uploads if u.path != k3s_service.CONFIG], service=None,
                   prepare=[line for line in plan.prepare if line != enable],
                   prepull=[], pull_after_start=[], verify_nvidia_runtime=False)


def after_the_ca(plan: HostPlan) -> HostPlan:
    """The rest of it, from its plan made with the CA's hash: the config.yaml, the unit's
    enabling, the start and what follows a start."""
    enable = k3s_service.enable_line(plan.unit)
    return replace(plan, uploads=[u for u in plan.uploads if u.path == k3s_service.CONFIG],
                   prepare=[line for line in plan.prepare if line == enable])
