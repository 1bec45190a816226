"""Preflight as one entry: `examine(run)` returns every finding (the host checks, who owns
each host, the k3s versions, reachability between the hosts, GPU health); `enforce(run,
report)` is the flow's part: print them, leave blocked hosts out, stop when one is an error.
The checks themselves are pure (bootstrap.checks.preflight, bootstrap.host.plan.rollout); what is
I/O here is the reachability probe and resolving the k3s release (online for a channel)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.host.release import k3s_artifacts
from bootstrap.errors import BootstrapError
from bootstrap.flows.run import Run
from bootstrap.host.plan.rollout import version_findings
from bootstrap.remote import reachability
from bootstrap.inventory.model import Inventory
from bootstrap.checks.preflight import Finding, blocked_nodes, ownership_findings, preflight
from bootstrap.progress import report_host_failures


class PreflightFailed(BootstrapError):
    pass


@dataclass
class PreflightReport:
    findings: list[Finding] = field(default_factory=list)
    reachability_lines: list[str] = field(default_factory=list)  # its summary (and matrix) for people
    unreachable: bool = False  # a host did not answer, and the run cannot go on without it

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


def stops_the_run(failures: dict, inventory: Inventory) -> bool:
    """An unreachable host stops the run (nothing is changed until every host answers); an
    agent that answered with what cannot be used is only left out: one host's answers never
    stop the others. A server is needed whole, however it failed."""
    servers = {n.name for n in inventory.servers}
    return any(not f.bad_answer or f.node in servers for f in failures.values())


def examine(run: Run, tolerate_unreachable: bool = False) -> PreflightReport:
    """Every finding, and the k3s release per architecture on `run.topology` once nothing
    stands in the way. `tolerate_unreachable`: `rebuild` goes on without the lost hosts."""
    inventory, facts = run.inventory, run.facts
    report = PreflightReport(preflight(inventory, facts, run.topology)
                             + ownership_findings(inventory, facts, run.state.cluster_id))
    report.unreachable = stops_the_run(run.failures, inventory) and not tolerate_unreachable
    if report.unreachable:
        return report  # the host that does not answer is the problem to name first
    if not report.errors:
        releases = k3s_artifacts(inventory, {f.arch for f in facts.values()})
        run.topology = run.topology.with_releases(releases)
        report.findings += version_findings(inventory, facts, run.topology.target_version,
                                            {a: x.binary_sha256 for a, x in releases.items()})
    # Provider firewalls, before any change; also beside other problems, so one run names
    # everything to fix on machines that cost money by the second.
    with run.console.phase("reachability"):
        found = reachability.check(run.session, inventory, facts, run.topology.embedded_mirror,
                                   run.topology.gpu_nodes)
    report.findings += found.findings
    report.reachability_lines = found.lines
    return report


def enforce(run: Run, report: PreflightReport) -> None:
    """Print the findings; a host that must stay out (gpu.health strict, answers that
    cannot be used) fails alone; an error anywhere, or a host that does not answer, stops
    the run before any host is changed."""
    run.console.say_lines(report.reachability_lines)
    for finding in sorted(report.findings, key=lambda f: (f.node, f.severity != "error")):
        run.console.say(finding.render())
    for name, bad in blocked_nodes(report.findings).items():
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        if bad[0].severity == "host-error":
            run.fail(name, bad[0].message + more, bad[0].fix)
        else:
            run.fail(name, f"GPU health: {bad[0].message}" + more,
                     "replace the machine (ask the provider for another), or set gpu.health: warn to use it anyway")
    if report.errors or report.unreachable:
        report_host_failures(run.console, run.failures)
        problems = len(report.errors) + len(run.failures)
        raise PreflightFailed(f"preflight found {problems} problem(s); no host was changed",
                              "fix the problems above and run the command again")

