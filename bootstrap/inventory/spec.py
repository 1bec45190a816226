"""A small declarative checker: each spec converts one YAML value or reports why it can't.

Problems are collected, not raised, so one pass reports everything wrong in a file.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from bootstrap.errors import Problem
from bootstrap.inventory.source import Located, Path, format_path

INVALID = object()  # a value that failed its check; its parent skips it

# Words that name a secret. Written as a key, they mean a secret sits inline in the file.
SECRET_WORDS = ("password", "passphrase", "token", "secret", "secret_key", "access_key", "key_passphrase")


class Checker:
    """Collects problems against a located YAML document."""

    def __init__(self, located: Located):
        self.located = located
        self.problems: list[Problem] = []

    def problem(self, path: Path, message: str, hint: str | None = None, *, key: bool = False) -> None:
        mark = self.located.mark(path, key=key)
        self.problems.append(Problem(self.located.file, mark.line, mark.column, format_path(path), message, hint))


def describe_type(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"true/false ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"text ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def example_hint(example: str | None) -> str | None:
    return f"write it like: {example}" if example else None


class Spec:
    expected = "a value"
    example: str | None = None

    def check(self, value: Any, path: Path, ck: Checker) -> Any:
        raise NotImplementedError

    def wrong_type(self, value: Any, path: Path, ck: Checker) -> object:
        ck.problem(path, f"expected {self.expected}, got {describe_type(value)}", example_hint(self.example))
        return INVALID


class AnyValue(Spec):
    """Passed through as written; checked elsewhere (e.g. k3s flags against k3s's own list)."""

    def check(self, value, path, ck):
        return value


@dataclass
class Str(Spec):
    pattern: str | None = None
    expected: str = "text"
    example: str | None = None
    validator: Callable[[str], str | None] | None = None  # returns an error message or None

    def check(self, value, path, ck):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return self.wrong_type(value, path, ck)
        if not isinstance(value, str):
            # A bare number where text is expected (a version like 12.4) loses precision; insist on quotes.
            return self.wrong_type(value, path, ck) if self.pattern or self.validator else str(value)
        if self.pattern and not re.fullmatch(self.pattern, value):
            ck.problem(path, f"{value!r} is not {self.expected}", example_hint(self.example))
            return INVALID
        if self.validator:
            error = self.validator(value)
            if error:
                ck.problem(path, error, example_hint(self.example))
                return INVALID
        return value


@dataclass
class Int(Spec):
    min: int | None = None
    max: int | None = None
    expected: str = "a whole number"
    example: str | None = None

    def check(self, value, path, ck):
        if isinstance(value, bool) or not isinstance(value, int):
            return self.wrong_type(value, path, ck)
        if self.min is not None and value < self.min:
            ck.problem(path, f"{value} is below the minimum of {self.min}", f"write a number of at least {self.min}")
            return INVALID
        if self.max is not None and value > self.max:
            ck.problem(path, f"{value} is above the maximum of {self.max}", f"write a number of at most {self.max}")
            return INVALID
        return value


@dataclass
class Number(Spec):
    min: float | None = None
    expected: str = "a number"

    def check(self, value, path, ck):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.wrong_type(value, path, ck)
        if self.min is not None and value < self.min:
            ck.problem(path, f"{value} is below the minimum of {self.min}")
            return INVALID
        return float(value)


class Bool(Spec):
    expected = "true or false"
    example = "true or false"

    def check(self, value, path, ck):
        if not isinstance(value, bool):
            return self.wrong_type(value, path, ck)
        return value


@dataclass
class Enum(Spec):
    choices: tuple[str, ...]
    what: str = "value"

    def check(self, value, path, ck):
        if not isinstance(value, str) or value not in self.choices:
            shown = repr(value) if isinstance(value, str) else describe_type(value)
            ck.problem(path, f"{shown} is not a valid {self.what}", did_you_mean(value, self.choices))
            return INVALID
        return value


@dataclass
class ListOf(Spec):
    item: Spec
    min_items: int = 0
    scalar_ok: bool = False  # accept a single item where a list is expected

    @property
    def expected(self):  # type: ignore[override]
        return "a list"

    def check(self, value, path, ck):
        if self.scalar_ok and not isinstance(value, list) and value is not None:
            value = [value]
        if not isinstance(value, list):
            ck.problem(path, f"expected a list, got {describe_type(value)}", "write a YAML list: [a, b] or '- a' lines")
            return INVALID
        if len(value) < self.min_items:
            ck.problem(path, f"needs at least {self.min_items} item{'s' if self.min_items > 1 else ''}")
            return INVALID
        items = [self.item.check(v, path + (i,), ck) for i, v in enumerate(value)]
        return INVALID if any(i is INVALID for i in items) else tuple(items)


@dataclass
class MapOf(Spec):
    """A free-form mapping (labels, mirrors): any key that passes `key`, values that pass `value`."""

    key: Spec
    value: Spec

    def check(self, value, path, ck):
        if not isinstance(value, dict):
            ck.problem(path, f"expected a mapping, got {describe_type(value)}", "write key: value lines under it")
            return INVALID
        result = {}
        for k, v in value.items():
            checked_key = self.key.check(k, path + (k,), ck)
            checked_value = self.value.check(v, path + (k,), ck)
            if checked_key is not INVALID and checked_value is not INVALID:
                result[checked_key] = checked_value
        return result


@dataclass
class Field:
    spec: Spec
    required: bool = False
    attr: str | None = None  # dataclass attribute name when it differs from the YAML key


@dataclass
class Record(Spec):
    """A mapping with known keys, built into `build` (a dataclass or any callable)."""

    fields: dict[str, Field]
    build: Callable[..., Any] = dict
    what: str = "section"
    shorthand: Callable[[Any], dict | None] | None = None  # e.g. `sharing: none`
    checks: list[Callable[[dict, Path, Checker], None]] = field(default_factory=list)

    def check(self, value, path, ck):
        if self.shorthand and not isinstance(value, dict):
            expanded = self.shorthand(value)
            if expanded is not None:
                value = expanded
        if not isinstance(value, dict):
            ck.problem(path, f"expected a mapping, got {describe_type(value)}", "write key: value lines under it")
            return INVALID
        values: dict[str, Any] = {}
        failed = False
        for key, raw in value.items():
            child = path + (key,)
            spec_field = self.fields.get(key)
            if spec_field is None:
                report_unknown_key(key, raw, child, self.fields, ck)
                failed = True
                continue
            checked = spec_field.spec.check(raw, child, ck)
            if checked is INVALID:
                failed = True
            else:
                values[spec_field.attr or key] = checked
        for key, spec_field in self.fields.items():
            if spec_field.required and key not in value:
                example = f" (for example {key}: {spec_field.spec.example})" if spec_field.spec.example else ""
                ck.problem(path + (key,), f"missing required key '{key}'", f"add {key}:{example}")
                failed = True
        if failed:
            return INVALID
        for extra_check in self.checks:
            before = len(ck.problems)
            extra_check(values, path, ck)
            if len(ck.problems) > before:
                return INVALID
        return self.build(**values)


def report_unknown_key(key, raw, path: Path, fields: dict, ck: Checker) -> None:
    """An unknown key: a misspelling gets a suggestion; an inline secret gets the right form."""
    if isinstance(key, str) and key.lower() in SECRET_WORDS:
        ck.problem(path, f"'{key}' is a secret written inline in the inventory; secrets come by reference only",
                   f"write {key}_env: VARIABLE_NAME (read from the environment) or {key}_file: /path/to/file",
                   key=True)
        return
    ck.problem(path, f"unknown key '{key}'", did_you_mean(key, fields), key=True)


def did_you_mean(word: Any, choices) -> str:
    choices = list(choices)
    if isinstance(word, str):
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        if not close:
            lowered = {c.lower().replace("-", "_"): c for c in choices}
            close = [lowered[word.lower().replace("-", "_")]] if word.lower().replace("-", "_") in lowered else []
        if close:
            return f"did you mean '{close[0]}'? (valid: {', '.join(choices)})"
    return f"write one of: {', '.join(choices)}"


# ---- reusable value checks -------------------------------------------------------------------

DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
DNS_NAME = rf"{DNS_LABEL}(\.{DNS_LABEL})*"


def ip_error(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not a valid IP address"
    return None


def address_error(value: str) -> str | None:
    """An SSH address: an IP, or a DNS name; something that looks like a broken IP is neither."""
    if re.fullmatch(r"[0-9.]+", value) or ":" in value:
        return ip_error(value)
    if not re.fullmatch(DNS_NAME, value.lower()):
        return f"{value!r} is neither an IP address nor a host name"
    return None


def cidr_error(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        return f"{value!r} is not a valid network in CIDR form ({exc})"
    return None


def san_error(value: str) -> str | None:
    return address_error(value)
