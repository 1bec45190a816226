"""Text made safe to print: the one rule for what reaches the operator's terminal.

A rented host controls every byte it answers: command output, os-release, error lines, the
cluster's objects and pod logs. Printed as they are, a few of those bytes set the
operator's clipboard (OSC 52), clear the screen, move the cursor or print a fake line of
output ("✓ all hosts converged"), and bidi overrides make a line read other than it is.

So every line the tool writes for people passes through `printable`: a character a
terminal could act on (C0 and C1 controls, DEL, line and paragraph separators, bidi
overrides and isolates, zero-width and other format characters, surrogates, private-use
and unassigned code points) is written as a visible Python escape (`\\x1b`, `\\u202e`),
and a line longer than MAX_LINE_BYTES is cut with a count of what was left out, so one host
cannot flood the terminal. The console (bootstrap.progress) applies it to everything it
writes; `write_text` is the same writer for the few lines written before a console exists.
JSON output needs none of this: json.dumps writes every control and non-ASCII character as
a \\u escape, so the text inside stays exact.
"""

from __future__ import annotations

import logging
import sys
import unicodedata

MAX_LINE_BYTES = 4096

_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """`text` as one line a terminal only displays: every character it could act on,
    line breaks included, as an escape; cut at MAX_LINE_BYTES. For a value from a host put
    into a line: it cannot start a line of its own."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escaped(c) for c in text)
    return _capped(text)


def printable_lines(text: object) -> str:
    """The tool's own text: its line breaks are layout and stay; each line is `printable`."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def write_text(stream, text: object, end: str = "\n") -> None:
    """Write the tool's own text (line breaks kept, each line printable) and flush."""
    stream.write(printable_lines(text) + end)
    stream.flush()


def cells(text: str) -> int:
    """How many terminal columns printable `text` takes: a wide or full-width East Asian
    character two, a combining mark none (it joins the character before), the rest one."""
    if text.isascii():
        return len(text)
    return sum(map(_cell_width, text))


def cut_to_cells(text: str, width: int) -> str:
    """The longest start of printable `text` that fits in `width` columns (never half a wide
    character; combining marks stay with their base)."""
    if text.isascii():
        return text[:max(width, 0)]
    used = 0
    for index, char in enumerate(text):
        used += _cell_width(char)
        if used > width:
            return text[:index]
    return text


def _cell_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


class PrintableStream:
    """Stderr for what others write there (gevent's report of a greenlet that failed, which
    quotes its exception): every chunk printable on its way, line breaks kept."""

    def write(self, text: str) -> int:
        sys.stderr.write(printable_lines(text))
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()


class PrintableFormatter(logging.Formatter):
    """A log file's records made printable: the run log quotes hosts' output too."""

    def format(self, record: logging.LogRecord) -> str:
        return printable_lines(super().format(record))


def _escaped(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _capped(line: str) -> str:
    """At most MAX_LINE_BYTES, the mark included, so a line cut once is never cut again."""
    if len(line) <= MAX_LINE_BYTES // 4:  # no UTF-8 character is longer than 4 bytes
        return line
    data = line.encode()
    if len(data) <= MAX_LINE_BYTES:
        return line
    kept = data[:MAX_LINE_BYTES - _MARK_ROOM].decode(errors="ignore")  # never half a character
    return f"{kept}…({len(data) - len(kept.encode())} more bytes)"


_MARK_ROOM = len("…( more bytes)".encode()) + 20  # room for the mark and any count
