"""Error types and the one place that maps them to exit codes and messages.

Every command returns through `run_command`, so a user error prints one clear block
(and never a traceback unless --debug), while an unexpected bug still says where the
full traceback went.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from bootstrap.console_text import printable, printable_lines

EXIT_OK = 0
EXIT_FAILED = 1  # a host or a check failed
EXIT_USAGE = 2  # bad input or usage: nothing was touched
# An inventory with thousands of problems is not a list anyone reads; the first ones say it.
MAX_PROBLEMS_SHOWN = 100


# Anything read from an input file or a host is printed through these (bootstrap.console_text):
# a hostile value can neither clear the screen nor fake a line of output.
escape = printable
escape_lines = printable_lines


class BootstrapError(Exception):
    """An error we expected and can explain; `hint` says what to do about it."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The block stderr shows: messages quote remote output (Helm's and the API's words, a
        host's error line) and input values, so each line is printable, and a line after the
        first of the message or hint is indented: only the tool's own `error:` and `hint:`
        start at the left edge."""
        lines = _labelled("error: ", self.message)
        return "\n".join(lines + (_labelled("hint: ", self.hint) if self.hint else []))

    def text(self) -> str:
        """The message and hint as they are, for JSON (which escapes them itself)."""
        return f"error: {self.message}" + (f"\nhint: {self.hint}" if self.hint else "")


def _labelled(label: str, text: str) -> list[str]:
    first, *rest = printable_lines(text).split("\n")
    return [label + first] + ["  " + line for line in rest]


class UsageError(BootstrapError):
    """Bad command-line usage or input files; raised before any host is touched."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One thing wrong in an input file, located precisely enough to fix it blind."""

    file: str
    line: int
    column: int
    path: str
    message: str
    hint: str | None = None

    def render(self) -> str:
        where = f"{escape(self.file)}:{self.line}:{self.column}"
        subject = f"{escape(self.path)}: " if self.path else ""
        text = f"{where}: {subject}{escape(self.message)}"
        if self.hint:
            text += f"\n    {escape(self.hint)}"
        return text


@dataclass
class InvalidInput(UsageError):
    """All the problems found in an input file, reported together."""

    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        count = len(self.problems)
        UsageError.__init__(self, f"{count} problem{'s' if count != 1 else ''} in the inventory")

    def render(self) -> str:
        lines = [p.render() for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if len(self.problems) > MAX_PROBLEMS_SHOWN:
            lines.append(f"... and {len(self.problems) - MAX_PROBLEMS_SHOWN} more")
        lines.append(f"error: {self.message}; nothing was changed on any host")
        return "\n".join(lines)

    def text(self) -> str:
        return self.render()  # each problem is escaped field by field already


class HostsFailed(BootstrapError):
    """Some hosts failed; each has already been reported on its own line."""

    exit_code = EXIT_FAILED


def run_command(func, args, console, *, debug: bool = False) -> int:
    """Run one CLI command, `func(args, console)`, and turn whatever it raises into an exit
    code; the message goes to stderr through the console (escaped, as everything it writes),
    and under --json also into its event stream."""
    try:
        result = func(args, console)
        return EXIT_OK if result is None else int(result)
    except BootstrapError as exc:
        if debug:
            console.warn(debug_traceback(exc))
        console.warn(exc.render())
        console.reporter.error(exc.text(), exc.exit_code)
        return exc.exit_code
    except KeyboardInterrupt:
        console.warn("error: interrupted; a re-run converges from wherever this stopped")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception as exc:  # a bug: say so, keep the details out of the user's way
        # Its text may quote a host's answer: one line, whatever it holds.
        line = f"error: internal error: {type(exc).__name__}: {printable(exc)}"
        if debug:
            console.warn(debug_traceback(exc) + "\n" + line)
        else:
            console.warn(line + "\nhint: re-run with --debug for the traceback, and report it")
        console.reporter.error(f"internal error: {type(exc).__name__}: {exc}", EXIT_FAILED)
        return EXIT_FAILED


def debug_traceback(exc: BaseException) -> str:
    """The traceback --debug shows, for the console (which makes each line printable): the
    frames as Python writes them (the tool's own files and code), and each exception's message
    on one line of its own, escaped, since it may quote a host (Python's own printer, on stderr
    past the console, wrote a host's escapes and line breaks as they were)."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    lines: list[str] = []
    for earlier, later in zip([None, *reversed(chain)], reversed(chain)):
        if earlier is not None:
            lines += ["", "The above exception was the direct cause of the following exception:"
                      if later.__cause__ is earlier else
                      "During handling of the above exception, another exception occurred:", ""]
        frames = "".join(traceback.format_tb(later.__traceback__)).rstrip("\n")
        lines += ["Traceback (most recent call last):", *frames.split("\n")] if frames else []
        lines.append(f"{type(later).__qualname__}: {printable(later)}")
    return "\n".join(lines)
