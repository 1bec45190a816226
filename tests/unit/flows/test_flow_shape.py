"""The flows stay readable, and host failures have one reporter.

A flow is a list of named phases (bootstrap.flows.run); a function in bootstrap/flows/
longer than MAX_LINES is a phase that should be split. A `FAILED` line is written only by
bootstrap.progress.report_host_failures: a second writer would put it on another channel,
or in other words."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from repo_paths import ROOT

from bootstrap.flows import diagnose, gpu_health, host_phase, inspection, repair, scale_down

PACKAGE = ROOT / "bootstrap"
MAX_LINES = 50
REPORTER = PACKAGE / "progress.py"


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_in_the_flows_is_longer_than_a_phase():
    long = [f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
            for path in sorted((PACKAGE / "flows").glob("*.py")) for fn in functions(path)
            if fn.end_lineno - fn.lineno + 1 > MAX_LINES]
    assert not long, "split these into named phases: " + ", ".join(long)


def starts_a_failed_line(node: ast.AST) -> bool:
    """A string (or the first part of an f-string) that begins with FAILED."""
    if isinstance(node, ast.JoinedStr):
        node = node.values[0] if node.values else None
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("FAILED")


def test_only_the_reporter_writes_failed_lines():
    writers = sorted({f"{path.relative_to(ROOT)}:{node.lineno}" for path in PACKAGE.rglob("*.py")
                      if path != REPORTER for node in ast.walk(ast.parse(path.read_text(), str(path)))
                      if starts_a_failed_line(node)})
    assert not writers, "FAILED lines go through bootstrap.progress.report_host_failures: " + ", ".join(writers)


def test_the_reporter_check_sees_an_f_string():
    assert starts_a_failed_line(ast.parse('f"FAILED {x}"', mode="eval").body)
    assert not starts_a_failed_line(ast.parse('f"UPGRADE FAILED {x}"', mode="eval").body)


def test_every_flow_takes_its_edges_as_the_others_do():
    """No test seam object in product code (issue 24, item 7: `repair.Edges`): each command's
    flow takes the hosts (`open_session`) and the cluster (`connect`) as keyword arguments
    with the real ones as defaults, as `up` does; tests pass fakes the same way."""
    flows = [host_phase.bring_up, repair.repair, scale_down.scale_down, gpu_health.check_health,
             inspection.cluster_status, inspection.planned_changes, diagnose.diagnose]
    for flow in flows:
        parameters = inspect.signature(flow).parameters
        assert {"open_session", "connect"} <= set(parameters), flow.__qualname__
        assert parameters["open_session"].default is not inspect.Parameter.empty, flow.__qualname__
    assert not hasattr(repair, "Edges")
