"""Five-field cron schedules as k3s reads etcd-snapshot-schedule-cron.

Pure. k3s parses the schedule with robfig/cron v3's standard parser, so these are its
rules: per field `*`, `?` (day fields), `N`, `N-M`, with `/STEP`, comma lists, month and
weekday names, and the @hourly-style descriptors. Field bounds are robfig/cron's spec.go
(commit 07cfef33b1936922cbe72131d09ddfe4a1b7f2a1): day of week is 0-6 (7 is refused).
"""

from __future__ import annotations

import re

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (what, lowest, highest, names: the name of `lowest`, then the next, ...)
FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 6, WEEKDAYS),
)
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_PART = re.compile(r"(\*|\?|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)(?:/([0-9]+))?", re.ASCII)


def schedule_error(text: str) -> str | None:
    if text in DESCRIPTORS:
        return None
    fields = text.split(" ")
    if len(fields) != len(FIELDS) or "" in fields:
        return f"{text!a} is not five fields (minute hour day-of-month month day-of-week) separated by single spaces"
    for value, spec in zip(fields, FIELDS):
        error = _field_error(value, *spec)
        if error:
            return f"{text!a}: {error}"
    return None


def _field_error(value: str, what: str, low: int, high: int, names: tuple) -> str | None:
    for part in value.split(","):
        match = _PART.fullmatch(part)
        if not match:
            return f"the {what} field {value!a} is not *, N, N-M, */STEP or a list of those"
        span, step = match.groups()
        if span == "?" and what not in ("day of month", "day of week"):
            return f"'?' is only for the day fields, not the {what}"
        if step is not None and int(step) < 1:
            return f"the {what} step must be at least 1"
        ends = [] if span in ("*", "?") else span.split("-")
        numbers = [_number(end, low, names) for end in ends]
        if None in numbers or any(not low <= n <= high for n in numbers):
            named = f" or {names[0]}-{names[-1]}" if names else ""
            return f"the {what} field {value!a} must be within {low}-{high}{named}"
        if len(numbers) == 2 and numbers[0] > numbers[1]:
            return f"the {what} range {span!a} runs backwards"
    return None


def _number(text: str, low: int, names: tuple) -> int | None:
    if re.fullmatch(r"[0-9]{1,2}", text):
        return int(text)
    lowered = text.lower()
    return low + names.index(lowered) if lowered in names else None
