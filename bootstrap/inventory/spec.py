"""A small declarative checker: each spec converts one YAML value or reports why it can't.

Problems are collected, not raised, so one pass reports everything wrong in a file.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable

from bootstrap.errors import MAX_PROBLEMS_SHOWN, Problem
from bootstrap.inventory.source import Located, Path, format_path

INVALID = object()  # a value that failed its check; its parent skips it

# Words that name a secret. Written as a key, they mean a secret sits inline in the file.
SECRET_WORDS = ("password", "passphrase", "token", "secret", "secret_key", "access_key", "key_passphrase")


class TooManyProblems(Exception):
    """Raised by Checker once it holds MAX_PROBLEMS_SHOWN problems: a file that wrong is not
    worth checking further, and stopping bounds the time a hostile file can take."""


class Checker:
    """Collects problems against a located YAML document."""

    def __init__(self, located: Located):
        self.located = located
        self.problems: list[Problem] = []

    def problem(self, path: Path, message: str, hint: str | None = None, *, key: bool = False) -> None:
        mark = self.located.mark(path, key=key)
        self.problems.append(Problem(self.located.file, mark.line, mark.column, format_path(path), message, hint))
        if len(self.problems) >= MAX_PROBLEMS_SHOWN:
            raise TooManyProblems


def shown(value: Any) -> str:
    """A value as a message quotes it: non-ASCII escaped, so a Cyrillic 'а' does not pass for
    a Latin 'a' in the very message that refuses it."""
    return ascii(value)


def describe_type(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"true/false ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"text ({shown(value)})"
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


def character_error(value: str, *, unicode: bool = False) -> str | None:
    """Every one-line text field refuses control characters (a line break in a value becomes
    a second line in whatever file it lands in), line separators, bidi overrides and other
    invisible format characters; and, unless `unicode`, anything outside ASCII (look-alike
    letters and digits: Cyrillic 'о', fullwidth '２', Arabic-Indic '٣')."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return f"{shown(value)} contains the control or invisible character U+{ord(char):04X}"
        if not unicode and not char.isascii():
            name = unicodedata.name(char, "unnamed")
            return f"{shown(value)} contains the non-ASCII character U+{ord(char):04X} ({name}); only ASCII is accepted"
    return None


@dataclass
class Str(Spec):
    pattern: str | None = None  # matched with re.ASCII, so that a class like backslash-d means ASCII only
    expected: str = "text"
    example: str | None = None
    validator: Callable[[str], str | None] | None = None  # returns an error message or None
    unicode: bool = False  # local file paths may hold any printable character
    max_length: int = 4096  # no one-line value is longer; also bounds the work of every pattern

    def check(self, value, path, ck):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return self.wrong_type(value, path, ck)
        if not isinstance(value, str):
            # A bare number where text is expected (a version like 12.4) loses precision; insist on quotes.
            return self.wrong_type(value, path, ck) if self.pattern or self.validator else str(value)
        if len(value) > self.max_length:
            ck.problem(path, f"{len(value)} characters is too long for {self.expected}")
            return INVALID
        bad_character = character_error(value, unicode=self.unicode)
        if bad_character:
            ck.problem(path, bad_character, example_hint(self.example))
            return INVALID
        if self.pattern and not re.fullmatch(self.pattern, value, re.ASCII):
            ck.problem(path, f"{shown(value)} is not {self.expected}", example_hint(self.example))
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
    min_reason: str | None = None  # why the minimum is what it is, said with a value below it

    def check(self, value, path, ck):
        if isinstance(value, bool) or not isinstance(value, int):
            return self.wrong_type(value, path, ck)
        if self.min is not None and value < self.min:
            reason = f": {self.min_reason}" if self.min_reason else ""
            ck.problem(path, f"{value} is below the minimum of {self.min}{reason}", f"write a number of at least {self.min}")
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
            what = shown(value) if isinstance(value, str) else describe_type(value)
            ck.problem(path, f"{what} is not a valid {self.what}", did_you_mean(value, self.choices))
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
        ck.problem(path, f"{shown(key)} is a secret written inline in the inventory; secrets come by reference only",
                   f"write {key}_env: VARIABLE_NAME (read from the environment) or {key}_file: /path/to/file",
                   key=True)
        return
    ck.problem(path, f"unknown key {shown(key)}", did_you_mean(key, fields), key=True)


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

def cidr_error(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        return f"{shown(value)} is not a valid network in CIDR form ({exc})"
    return None
