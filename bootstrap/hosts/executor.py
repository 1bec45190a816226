"""Run prepared steps on hosts through pyinfra and report each host's result per step.

Steps run in order; within a step all hosts run in parallel. A host that fails a step
is reported with the first line of its error and takes no further step; the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bootstrap import progress
from bootstrap.hosts.session import HostFailure, HostSession


@dataclass
class StepResult:
    status: str  # changed | no change | failed | not run
    seconds: float = 0.0
    error: str | None = None


@dataclass
class Step:
    name: str
    commands: dict[str, list] = field(default_factory=dict)  # node name -> pyinfra commands


def _first_error_line(meta) -> str:
    try:
        lines = [l.strip() for l in meta.stderr_lines if l.strip()] or [l.strip() for l in meta.stdout_lines if l.strip()]
    except Exception:  # output not recorded (e.g. a connection drop)
        lines = []
    return lines[-1] if lines else "command failed (connection lost?)"


def execute(session: HostSession, steps: list[Step]) -> dict[str, dict[str, StepResult]]:
    import gevent
    from pyinfra.api import BaseStateCallback
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage

    from bootstrap.deploys.converge import run

    state = session.pyinfra_state
    hosts = [h for h in state.inventory if h.name not in session.failures]
    results: dict[str, dict[str, StepResult]] = {h.name: {} for h in hosts}
    metas: list[tuple[Step, dict]] = []
    # One session may execute several times (a rolling upgrade runs node by node): ops
    # added now are queued, not run at once, and only they run below.
    state.is_executing = False
    if state.current_stage < StateStage.Prepare:
        state.set_stage(StateStage.Prepare)
    earlier = {h: list(h.op_hash_order) for h in state.inventory}
    for step in steps:
        per_host = {}
        for host in hosts:
            per_host.update(add_op(state, run, name=step.name, commands=step.commands.get(host.name, []), host=host))
        metas.append((step, per_host))

    started: dict[tuple[str, str], float] = {}
    step_of = {}
    working = set()  # (host, op): the host has commands in that step; the others are not reported
    for step, per_host in metas:
        for host, meta in per_host.items():
            step_of[meta._hash] = step.name
            if step.commands.get(host.name):
                working.add((host.name, meta._hash))

    reporter = progress.current()

    class Progress(BaseStateCallback):
        # Steps are added for every host (pyinfra matches ops by position); where a host
        # had nothing to do in one, nothing ran and there is nothing to show.
        def operation_host_start(self, state, host, op_hash):
            started[(host.name, op_hash)] = time.monotonic()
            if (host.name, op_hash) in working:
                reporter.step_started(host.name, step_of.get(op_hash, "?"))

        def operation_host_success(self, state, host, op_hash, retry_count=0):
            if (host.name, op_hash) not in working:
                return
            elapsed = time.monotonic() - started.get((host.name, op_hash), time.monotonic())
            reporter.step_finished(host.name, step_of.get(op_hash, "?"), "ok", elapsed)

        def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
            elapsed = time.monotonic() - started.get((host.name, op_hash), time.monotonic())
            meta = state.get_op_data_for_host(host, op_hash).operation_meta

            def report():  # pyinfra records the output just after this callback returns
                reporter.step_finished(host.name, step_of.get(op_hash, "?"), "failed", elapsed,
                                       _first_error_line(meta))

            pending.append(gevent.spawn(report))

    pending: list = []
    handler = Progress()
    state.add_callback_handler(handler)
    if state.current_stage < StateStage.Execute:
        state.set_stage(StateStage.Execute)
    queued = {h: h.op_hash_order[len(earlier[h]):] for h in state.inventory}
    for host in state.inventory:
        host.op_hash_order = queued[host]
    reporter.run_started([h.name for h in hosts if any(step.commands.get(h.name) for step in steps)])
    try:
        run_ops(state)
    except PyinfraError:
        pass  # every host failed: each already has its result
    finally:
        for host in state.inventory:  # keep the whole history: new op hashes stay unique
            host.op_hash_order = earlier[host] + queued[host]
        state.callback_handlers.remove(handler)
        gevent.joinall(pending)
        reporter.run_finished()
    for step, per_host in metas:
        for host, meta in per_host.items():
            if not meta.is_complete():
                result = StepResult("not run")
            elif meta.did_error():
                result = StepResult("failed", error=_first_error_line(meta))
                session.failures.setdefault(host.name, HostFailure(host.name, f"{step.name}: {result.error}"))
            else:
                result = StepResult("changed" if meta.did_change() else "no change")
            results[host.name][step.name] = result
    return results
