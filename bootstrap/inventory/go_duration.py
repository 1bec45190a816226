"""A duration as Go's time.ParseDuration reads it (golang/go src/time/format.go, ParseDuration):
k3s hands a component argument such as node-monitor-grace-period=1m30s to the component's
flag parser, which reads it so. Pure; one pass over the text."""

from __future__ import annotations

import re
from fractions import Fraction

# ParseDuration's unitMap, in nanoseconds; µs is both U+00B5 and U+03BC.
_UNIT_NS = {"ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000,
            "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
# One "[digits][.digits]unit" part: the unit is every character up to the next digit or '.'.
# Each character belongs to exactly one group, so the match never backtracks.
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_MAX_NS = (1 << 63) - 1  # a time.Duration is an int64 of nanoseconds


def seconds(text: str) -> Fraction | None:
    """`text` in seconds, or None where Go refuses it (no unit, an unknown unit, overflow)."""
    sign, body = (-1, text[1:]) if text[:1] == "-" else (1, text[1:] if text[:1] == "+" else text)
    if body == "0":
        return Fraction(0)
    if not body:
        return None
    total, pos = Fraction(0), 0
    while pos < len(body):
        part = _PART.match(body, pos)
        whole, fraction, unit = part.group(1), part.group(2), part.group(3)
        if not (whole or fraction) or unit not in _UNIT_NS:
            return None
        total += (int(whole or "0") + Fraction(int(fraction or "0"), 10 ** len(fraction or ""))) * _UNIT_NS[unit]
        if total > _MAX_NS + (sign < 0):
            return None
        pos = part.end()
    return sign * total / 1_000_000_000
