"""The operator's view: live rows on a terminal, plain lines elsewhere, JSON events with --json."""

import io
import json
import os
import re

import pytest

from bootstrap import progress
from bootstrap.console_text import cells, cut_to_cells
from bootstrap.progress import HostRow, render_row

ANSI = re.compile(r"\033\[[0-9;]*[A-Za-z]")


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_a_row_shows_finished_steps_with_times_and_the_running_one_with_its_elapsed_time():
    row = HostRow("gpu-1", done=[("prepare host", True, 0.42)], current="start agents", since=100.0)
    assert render_row(row, 103.5, 6, 200, color=False) == "gpu-1   ✓ prepare host 0.4s  ▸ start agents 3.5s"


def test_a_failed_row_is_red_with_the_first_line_of_the_reason():
    row = HostRow("gpu-2", done=[("prepare host", True, 0.4), ("start agents", False, 1.2)],
                  error="k3s-agent.service did not become active")
    line = render_row(row, 0, 5, 200, color=True)
    assert "\033[31m✗ start agents 1.2s: k3s-agent.service did not become active\033[0m" in line
    assert ANSI.sub("", line).startswith("gpu-2  ✓ prepare host")


def test_a_long_row_keeps_the_newest_steps_and_fits_the_terminal():
    row = HostRow("gpu-1", done=[(f"step number {i}", True, 1.0) for i in range(20)], current="last", since=0)
    line = render_row(row, 2.0, 5, 60, color=False)
    assert len(line) <= 59
    assert line.endswith("▸ last 2.0s") and "…" in line
    assert "step number 0 " not in line


def test_terminal_cells_count_wide_characters_twice_and_combining_marks_not_at_all():
    assert cells("gpu-1") == 5 and cells("节点一") == 6 and cells("ｇｐｕ") == 6 and cells("e\u0301") == 1
    assert cut_to_cells("节点一", 3) == "节" and cut_to_cells("节点一", 4) == "节点" and cut_to_cells("ab", 9) == "ab"
    assert cut_to_cells("e\u0301x", 1) == "e\u0301"


@pytest.mark.parametrize("columns", [40, 60, 101])
def test_a_row_of_wide_characters_fits_the_terminals_cells(columns):
    """A host's wide characters take two cells: counted as characters, the row wrapped and
    the redraw moved the cursor up too few lines."""
    rows = [HostRow("节点一", done=[(f"准备主机第{i}步", True, 1.0) for i in range(12)], current="启动代理", since=0),
            HostRow("gpu-1", done=[("准备", False, 1.0)], error="磁盘已满" * 40),
            HostRow("节" * 80, current="x", since=0)]
    for row in rows:
        line = render_row(row, 2.0, 6, columns, color=False)
        assert cells(line) <= columns - 1, line
    first = render_row(rows[0], 2.0, 6, columns, color=False)
    assert first.startswith("节点一  ") and first.endswith("▸ 启动代理 2.0s")
    # Names line up by cells: the step column starts at the same cell for every host.
    assert cells(render_row(rows[1], 2.0, 6, columns, color=False).split("✗")[0]) == cells(first.split("…")[0])


def test_the_live_view_moves_up_exactly_the_rows_it_drew_with_wide_characters(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr(progress.shutil, "get_terminal_size", lambda fallback: os.terminal_size((40, 24)))
    term = FakeTerminal()
    reporter = progress.make_console(stream=term).reporter
    reporter.run_started(["节点一", "gpu-2"])
    for step in ("准备主机", "安装组件", "启动代理"):
        reporter.step_started("节点一", step)
        reporter.step_finished("节点一", step, "ok", 1.0)
    reporter.step_finished("gpu-2", "准备", "failed", 1.0, "磁盘已满" * 20)
    reporter.run_finished()
    drawn = ANSI.sub("", term.getvalue().split("\033[2F")[-1]).splitlines()
    assert len(drawn) == 2 and all(cells(line) <= 39 for line in drawn), drawn


def test_the_live_view_redraws_its_rows_in_place(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    term = FakeTerminal()
    reporter = progress.make_console(stream=term).reporter
    assert isinstance(reporter, progress.LiveReporter)
    reporter.run_started(["a", "b"])
    reporter.step_started("a", "prepare host")
    reporter.step_finished("a", "prepare host", "ok", 0.5)
    reporter.step_started("b", "prepare host")
    reporter.step_finished("b", "prepare host", "failed", 0.7, "disk full")
    reporter.run_finished()
    text = term.getvalue()
    assert "\033[2F" in text  # moved up over the two rows it drew before
    final = ANSI.sub("", text.split("\033[2F")[-1]).splitlines()
    assert final == ["a  ✓ prepare host 0.5s", "b  ✗ prepare host 0.7s: disk full"]


def test_plain_lines_when_not_on_a_terminal():
    out = io.StringIO()
    reporter = progress.make_console(stream=out).reporter
    assert type(reporter) is progress.Reporter
    reporter.step_finished("a", "start agents", "ok", 2.25)
    reporter.step_finished("b", "start agents", "failed", 1.0, "timed out")
    assert out.getvalue().splitlines() == ["✓ a              start agents 2.2s",
                                           "✗ b              start agents 1.0s: timed out"]


def test_json_mode_turns_what_a_command_says_into_events_and_leaves_stdout_alone():
    import sys

    stdout = sys.stdout
    out = io.StringIO()
    console = progress.make_console(json_events=True, stream=out)
    reporter = console.reporter
    reporter.step_started("a", "prepare host")
    reporter.step_finished("a", "prepare host", "ok", 0.5)
    console.say("hosts: no change\ndone in 0.1s")
    reporter.event("exit", code=0)
    assert sys.stdout is stdout  # nothing is redirected: flows are given the console
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["step_start", "step_end", "message", "message", "exit"]
    assert events[1]["status"] == "ok" and events[1]["seconds"] == 0.5
    assert [events[2]["text"], events[3]["text"]] == ["hosts: no change", "done in 0.1s"]
    assert all(isinstance(e["time"], float) for e in events)
    plain = io.StringIO()
    progress.make_console(stream=plain).say("hosts: no change")
    assert plain.getvalue() == "hosts: no change\n"


def test_down_asks_on_stderr_and_needs_the_cluster_name(monkeypatch, capsys):
    import sys

    from bootstrap.commands.down import confirm
    from bootstrap.errors import UsageError
    from bootstrap.inventory.loader import parse_inventory

    inv = parse_inventory("cluster: lab\nnodes: [{name: a, address: 10.0.0.1, role: server}]\n")

    class Typed(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Typed("lab\n"))
    confirm(inv, assume_yes=False)
    captured = capsys.readouterr()
    assert "Type the cluster name" in captured.err and captured.out == ""  # stdout stays for --json events
    monkeypatch.setattr(sys, "stdin", Typed("yes\n"))
    with pytest.raises(UsageError, match="not confirmed"):
        confirm(inv, assume_yes=False)
