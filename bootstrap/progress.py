"""What the operator sees while hosts are worked on.

Three reporters share one interface: a live view on a terminal (one row per host, the
current step and its elapsed time, finished steps with their times, failures in red and
redrawn in place), plain lines in logs and pipes, and with `--json` one JSON event per line
on stdout (a command's own lines, said through its `Console`, become `message` events, so
stdout stays machine-readable). The CLI picks one per run with `make_console`.

Everything the reporters and the console write for people is made printable on the way out
(bootstrap.console_text): host names, step errors and whatever a command says may quote a
host or the cluster, so no call site has to remember to escape. The live view's own colour
and cursor codes are the only control characters it writes; JSON events carry the text
exactly, JSON-escaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from bootstrap.console_text import cells, cut_to_cells, printable, write_text
from bootstrap.errors import HostsFailed

RED, GREEN, RESET = "\033[31m", "\033[32m", "\033[0m"


class Reporter:
    """Plain lines: one per finished step that did something on a host."""

    def __init__(self, stream=None):
        self.stream = stream

    @property
    def out(self):
        return self.stream or sys.stdout

    def run_started(self, hosts: list[str]) -> None:
        pass

    def step_started(self, host: str, step: str) -> None:
        pass

    def step_finished(self, host: str, step: str, status: str, seconds: float, error: str | None = None) -> None:
        """`status`: ok or failed. (Hosts with nothing to do in a step are not reported.)"""
        write_text(self.out, step_line(host, step, status == "ok", seconds, error))

    def run_finished(self) -> None:
        pass

    def event(self, kind: str, **fields) -> None:
        """A structured event only `--json` shows; the other reporters print their own text."""

    def error(self, text: str, code: int) -> None:
        pass


def step_line(host: str, step: str, ok: bool, seconds: float, error: str | None = None) -> str:
    """One line, whatever the host's error line holds (a line break in it is escaped too)."""
    line = f"{'✓' if ok else '✗'} {printable(host):<14} {printable(step)} {seconds:.1f}s"
    return f"{line}: {printable(error)}" if error else line


@dataclass
class HostRow:
    host: str
    done: list[tuple[str, bool, float]] = field(default_factory=list)  # (step, ok, seconds)
    current: str | None = None
    since: float = 0.0
    error: str | None = None


def render_row(row: HostRow, now: float, name_width: int, columns: int, color: bool) -> str:
    """One host's line, cut to the terminal's width (a wrapped line would break the redraw):
    the newest steps are kept, older ones become '…'. Widths are terminal cells, not
    characters (a host's wide characters take two each: counted as one, the row wrapped and
    the redraw's cursor moved up too few lines). Every part is made printable before the
    row's own colour codes are added: the only control characters in it are those."""
    parts = [(f"{'✓' if ok else '✗'} {printable(step)} {secs:.1f}s", ok) for step, ok, secs in row.done]
    if row.current:
        parts.append((f"▸ {printable(row.current)} {now - row.since:.1f}s", True))
    if row.error:
        parts[-1] = (f"{parts[-1][0]}: {printable(row.error)}", False)
    if not parts:
        parts = [("waiting", True)]
    name = printable(row.host)
    if cells(name) > columns // 2:  # a long name leaves the row room for its steps
        name = cut_to_cells(name, columns // 2 - 1) + "…"
    head = name + " " * max(name_width - cells(name), 0) + "  "
    room = max(columns - 1 - cells(head), 10)
    shown: list[tuple[str, bool]] = []
    used = 0
    for index in range(len(parts) - 1, -1, -1):
        text, ok = parts[index]
        need = cells(text) + (2 if shown else 0)
        older = 3 if index else 0  # room for the '…  ' that stands for older parts
        if used + need + older > room:
            if not shown:  # the newest part alone, cut when even it is too long
                shown.append((text if need <= room else cut_to_cells(text, room - 1) + "…", ok))
            else:
                shown.append(("…", True))
            break
        shown.append((text, ok))
        used += need
    shown.reverse()
    if color:
        body = "  ".join(f"{RED}{t}{RESET}" if not ok else f"{GREEN}{t[:1]}{RESET}{t[1:]}" if t[:1] == "✓" else t
                         for t, ok in shown)
    else:
        body = "  ".join(t for t, _ in shown)
    return head + body


class LiveReporter(Reporter):
    """One row per host, redrawn in place a few times a second while steps run."""

    interval = 0.25

    def __init__(self, stream=None):
        super().__init__(stream)
        self.rows: dict[str, HostRow] = {}
        self.drawn = 0
        self._ticker = None

    def run_started(self, hosts):
        self.rows = {h: HostRow(h) for h in hosts}
        self.drawn = 0
        self.redraw()
        # imported here: startup time (every command makes a console; only those that reach hosts
        # load gevent, pyinfra's scheduler: the ticker runs between its greenlets)
        import gevent

        def tick():
            while True:
                gevent.sleep(self.interval)
                self.redraw()

        self._ticker = gevent.spawn(tick)

    def step_started(self, host, step):
        row = self.rows.get(host)  # hosts with nothing to do in this run have no row
        if row is not None:
            row.current, row.since = step, time.monotonic()

    def step_finished(self, host, step, status, seconds, error=None):
        row = self.rows.get(host)
        if row is None:
            return
        row.current = None
        row.done.append((step, status == "ok", seconds))
        row.error = error

    def run_finished(self):
        if self._ticker is not None:
            self._ticker.kill()
            self._ticker = None
        self.redraw()

    def redraw(self):
        columns = shutil.get_terminal_size((100, 24)).columns
        width = min(max((cells(printable(h)) for h in self.rows), default=0), columns // 2)
        now = time.monotonic()
        lines = [render_row(r, now, width, columns, color=True) for r in self.rows.values()]
        text = f"\033[{self.drawn}F" if self.drawn else ""
        text += "".join(f"\033[2K{line}\n" for line in lines)
        self.out.write(text)
        self.out.flush()
        self.drawn = len(lines)


class JsonReporter(Reporter):
    """One JSON object per line: {"event": ..., "time": ..., ...}."""

    def __init__(self, stream):
        super().__init__(stream)

    def _emit(self, kind, **fields):
        # ensure_ascii: every control character in a host's text is a \u escape, never a raw byte.
        self.stream.write(json.dumps({"event": kind, "time": round(time.time(), 3), **fields},
                                     ensure_ascii=True) + "\n")
        self.stream.flush()

    def run_started(self, hosts):
        self._emit("run_start", hosts=hosts)

    def step_started(self, host, step):
        self._emit("step_start", host=host, step=step)

    def step_finished(self, host, step, status, seconds, error=None):
        self._emit("step_end", host=host, step=step, status=status,
                   seconds=round(seconds, 3), **({"error": error} if error else {}))

    def run_finished(self):
        self._emit("run_end")

    def event(self, kind, **fields):
        self._emit(kind, **fields)

    def error(self, text, code):
        self._emit("error", message=text, exit_code=code)


class Console:
    """Where a command's own lines go: stdout, or under --json `message` events, so that
    stdout stays one JSON object per line; warnings, failures and questions go to stderr.
    Flows are given one; nothing replaces sys.stdout. Every line it writes for people is
    made printable (bootstrap.console_text): the tool's own line breaks are kept, anything
    a terminal would act on is shown escaped."""

    def __init__(self, reporter: Reporter, err=None):
        self.reporter = reporter
        self.err_stream = err

    @property
    def err(self):
        return self.err_stream or sys.stderr

    @property
    def json(self) -> bool:
        return isinstance(self.reporter, JsonReporter)

    def say(self, text: str = "") -> None:
        """The tool's own text: its line breaks are layout (a value from a host that may
        hold one goes through `printable` where it is put in, or through `say_lines`)."""
        self.say_lines(str(text).split("\n"))

    def say_lines(self, lines) -> None:
        """Each item is exactly one line: a line break inside one is shown escaped."""
        if self.json:
            for line in lines:
                self.reporter.event("message", text=line)
        else:
            for line in lines:
                write_text(self.reporter.out, printable(line))

    def warn(self, text: str) -> None:
        """A warning, failure or error line on stderr (under --json too: stdout is events)."""
        write_text(self.err, text)

    def ask(self, question: str) -> None:
        """A question on stderr; the answer is typed on the same line."""
        write_text(self.err, question, end="")

    def document(self, data, **options) -> None:
        """A command's --json answer: one JSON document on stdout, written as json.dumps
        makes it (every control and non-ASCII character a \\u escape, so nothing to escape
        and nothing cut: a cut line would break the document)."""
        out = self.reporter.out
        out.write(json.dumps(data, indent=2, ensure_ascii=True, **options) + "\n")
        out.flush()

    def event(self, kind: str, **fields) -> None:
        self.reporter.event(kind, **fields)

    def phase(self, name: str, **fields):
        return phase(self.reporter, name, **fields)


# --- the one reporter of host failures and of a run's end --------------------------------

def report_host_failures(console: Console, failures) -> None:
    """Each failed host (`failures`: {node: HostFailure}), one `FAILED` line each, sorted,
    on stderr: the only place such a line is written (tests/unit/flows/test_flow_shape.py)."""
    for failure in sorted(failures.values(), key=lambda f: f.node):
        console.warn(f"FAILED {failure.render()}")


def end_run(console: Console, failures) -> None:
    """The end of a run that changed hosts: its failed hosts reported, and an error when
    there is one (exit 1)."""
    report_host_failures(console, failures)
    if failures:
        raise HostsFailed(f"{len(failures)} host{'s' if len(failures) > 1 else ''} failed: "
                          f"{', '.join(sorted(failures))}")


def command_finished(reporter: Reporter, host: str, what: str, started: float) -> None:
    """A `command` event: one remote command of a host, from `started` (time.time()) to now."""
    reporter.event("command", host=host, what=what, start=round(started, 3), seconds=round(time.time() - started, 3))


@contextlib.contextmanager
def phase(reporter: Reporter, name: str, **fields):
    """A `phase` event (only --json shows it) with when a part of a run began and how long it
    took: the benchmark's per-step trace (connect, probe, reachability, each step, the
    kubeconfig, the cluster side's tunnel, requests and releases, the snapshot)."""
    started = time.time()
    try:
        yield
    finally:
        reporter.event("phase", name=name, start=round(started, 3), seconds=round(time.time() - started, 3), **fields)


def make_console(*, json_events: bool = False, stream=None) -> Console:
    """The console for one run, chosen at the command line's edge and handed down: the
    command gives it to its flow, the flow to the hosts' session (whose step executor
    reports to its reporter), and the error mapper reports through it."""
    stream = stream or sys.stdout
    if json_events:
        return Console(JsonReporter(stream))
    if is_live_terminal(stream):
        return Console(LiveReporter(stream))
    return Console(Reporter(stream))


def is_live_terminal(stream) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM", "") not in ("", "dumb")
