"""Run prepared steps on hosts and report each host's result per step.

Steps run in order; within a step all hosts run in parallel (one greenlet each, on the
connections the session opened). A host that fails a step is reported with the last line
of its error and takes no further step; the others go on.

Commands are pyinfra's own (StringCommand, FunctionCommand), run with
their public `execute(state, host, arguments)` on pyinfra's connected hosts: no operation
queue, so a session can execute step lists one after another (a rolling upgrade runs node
by node) without touching pyinfra's operation-ordering internals.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

import gevent
from pyinfra.api import StringCommand

from bootstrap.host.plan.steps import Step
from bootstrap.remote.archive import RemoteCommandFailed
from bootstrap.remote.remote_output import CHANGE_DEADLINE_S
from bootstrap.remote_data import RemoteDataError
from bootstrap.progress import command_finished


class StepSession(Protocol):
    """What the executor needs of the session that calls it (bootstrap.remote.session.HostSession):
    the session imports this module, never the other way round."""

    pyinfra_state: object  # a connected pyinfra State
    reporter: object  # bootstrap.progress.Reporter
    failures: dict

    def active_nodes(self) -> list: ...

    def fail(self, name: str, message: str, hint: str | None = None, *, bad_answer: bool = False) -> None: ...


logger = logging.getLogger("pyinfra.bootstrap")  # the run log (see HostSession._configure_logging)
NO_OUTPUT = "command failed (connection lost?)"


@dataclass
class StepResult:
    status: str  # changed | no change | failed | not run
    seconds: float = 0.0
    error: str | None = None


def last_error_line(output) -> str:
    """The line that says why: the last non-empty stderr line, else stdout's."""
    try:
        lines = [l.strip() for l in output.stderr_lines if l.strip()] or \
                [l.strip() for l in output.stdout_lines if l.strip()]
    except AttributeError:  # no output recorded (an upload, a dropped connection)
        lines = []
    return lines[-1] if lines else NO_OUTPUT


def run_commands(state, host, commands: list, reporter=None, deadline_s: float = CHANGE_DEADLINE_S) -> str | None:
    """Run one host's commands of a step in order; None when all succeed, else the error.
    Each command is a `command` event on `reporter` (the benchmark's per-host trace); each
    has `deadline_s` seconds (a FunctionCommand's own: bootstrap.remote.remote_output)."""
    base = {"_sudo": bool(host.data.get("_sudo", False))}
    for command in commands:
        arguments = {**base, **command.connector_arguments}
        started = time.time()
        try:
            result = _execute(command, state, host, arguments, deadline_s)
        except RemoteCommandFailed as failed:  # a command with files on its stdin
            for line in failed.stdout_lines + failed.stderr_lines:
                logger.error("%s: %s", host.name, line)
            return failed.line
        except (CommandLate, RemoteDataError) as reason:  # late (its channel kept open), or no channel
            logger.error("%s: %s", host.name, reason)
            return str(reason)
        except Exception as exc:  # a dropped connection, a timeout: this host's failure only
            logger.error("%s: %s failed: %s", host.name, type(command).__name__, exc)
            return f"{type(exc).__name__}: {exc}" if str(exc) else NO_OUTPUT
        finally:
            if reporter is not None:
                command_finished(reporter, host.name, command_label(command), started)
        if isinstance(command, StringCommand):
            ok, output = result
            if not ok:
                for line in getattr(output, "combined_lines", []):
                    logger.error("%s: %s", host.name, line.line)
                return last_error_line(output)
        elif result is False:
            return NO_OUTPUT
    return None


class CommandLate(Exception):
    """A host's StringCommand that had not ended by its deadline (its message says so)."""


def _execute(command, state, host, arguments: dict, deadline_s: float):
    """`command.execute`, for a StringCommand within `deadline_s`: pyinfra waits for its exit
    status without a time-out (pyinfra 3.10, pyinfra/connectors/ssh.py, run_shell_command:
    recv_exit_status after the output; its `_timeout` covers only the output), so a host
    whose sshd keeps the channel open held the step, and `up` with the cluster's lock, for
    ever. The run is on gevent (bootstrap.cli patches before paramiko is used), so paramiko's
    waits are greenlet waits a gevent.Timeout ends; the channel pyinfra opened is left to the
    session's close. A FunctionCommand (files on a root script's stdin) keeps the deadline of
    its own channel (remote_output.run_with_input), which grows with the files it sends."""
    if not isinstance(command, StringCommand):
        return command.execute(state, host, arguments)
    timer = gevent.Timeout(deadline_s)
    try:
        with timer:
            return command.execute(state, host, arguments)
    except gevent.Timeout as caught:
        if caught is not timer:
            raise
        raise CommandLate(f"the command had not ended after {deadline_s:.0f} s (the host kept its channel "
                          "open): given up on this host") from None


def command_label(command) -> str:
    function = getattr(command, "function", None)
    return function.__name__ if function is not None else type(command).__name__


def execute(session: StepSession, steps: list[Step], after: dict | None = None, *,
            deadline_s: float = CHANGE_DEADLINE_S) -> dict[str, dict[str, StepResult]]:
    """`after`: {step name: function} to start (in the background) once that step has ended,
    while the next steps run (the kubeconfig is read while the agents join); each has
    finished when this returns. `deadline_s`: what each host's command of a step may take
    (run_commands); a host past it fails that step, the others go on."""
    state = session.pyinfra_state
    reporter = session.reporter
    alive = [n.name for n in session.active_nodes()]
    results: dict[str, dict[str, StepResult]] = {name: {} for name in alive}
    reporter.run_started([n for n in alive if any(step.commands.get(n) for step in steps)])
    background: list = []
    try:
        for step in steps:
            working = [n for n in alive if n not in session.failures and step.commands.get(n)]
            for name in alive:
                if name in session.failures:
                    results[name][step.name] = StepResult("not run")
                elif name not in working:
                    results[name][step.name] = StepResult("no change")
            if step.needs in session.failures:
                working = _refuse_all(session, step, working, results)
            jobs = {name: gevent.spawn(_run_step, state, name, step, reporter, deadline_s) for name in working}
            gevent.joinall(list(jobs.values()))
            for name, job in jobs.items():
                result = job.value or StepResult("failed", error=NO_OUTPUT)
                results[name][step.name] = result
                if result.status == "failed":
                    session.fail(name, f"{step.name}: {result.error}")
            if after and step.name in after:
                background.append(gevent.spawn(after[step.name]))
    finally:
        gevent.joinall(background)
        reporter.run_finished()
    for job in background:
        job.get()  # its exception, if it raised one
    return results


def _refuse_all(session: StepSession, step: Step, working: list[str], results: dict) -> list[str]:
    """The step's hosts when the host it needs failed earlier in this run: each is failed at
    once with that reason (a join would only wait out its start time-out), none is run."""
    error = f"not run: {step.needs}, which it joins, failed"
    for name in working:
        session.reporter.step_started(name, step.name)
        session.reporter.step_finished(name, step.name, "failed", 0.0, error)
        results[name][step.name] = StepResult("failed", 0.0, error)
        session.fail(name, f"{step.name}: {error}")
    return []


def _run_step(state, name: str, step: Step, reporter, deadline_s: float) -> StepResult:
    host = state.inventory.get_host(name)
    started = time.monotonic()
    label = step.label(name)  # its own words when it does more than the step
    reporter.step_started(name, label)
    error = run_commands(state, host, step.commands[name], reporter, deadline_s)
    elapsed = time.monotonic() - started
    reporter.step_finished(name, label, "failed" if error else "ok", elapsed, error)
    return StepResult("failed", elapsed, error) if error else StepResult("changed", elapsed)
