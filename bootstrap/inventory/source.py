"""Read a YAML file into plain data while remembering where every value and key sits.

PyYAML's safe loader forgets positions and silently keeps the last of two duplicate
keys; both matter for telling a user exactly which line to fix.

The inventory is hostile input, so the data is built straight from the parser's events,
never by PyYAML's composer or constructor:
- anchors and aliases are refused (an inventory has no use for them, and an alias is
  what a "billion laughs" bomb or a recursive structure is made of): nothing is ever
  expanded, so no alias can cost memory;
- explicit tags (`!!python/...`, `!foo`, even `!!str`) are refused, so only the core
  schema's plain types (text, numbers, true/false, null) can come out;
- nesting deeper than MAX_DEPTH stops the read (no recursion beyond it);
- `<<` merge keys, a second document, and keys that are not plain words are refused;
- NaN, infinities and numbers too long to convert are refused wherever they appear;
- more than MAX_EVENTS values stops the read.
With the file capped at MAX_BYTES, that bounds time and memory whatever the file holds.
libyaml's parser is used where PyYAML has it (twenty times faster than the pure-Python one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml
import yaml.reader
from yaml.constructor import SafeConstructor
from yaml.events import (AliasEvent, CollectionStartEvent, MappingEndEvent,
                         ScalarEvent, SequenceEndEvent, SequenceStartEvent,
                         StreamEndEvent)

from bootstrap.errors import Problem, escape

Path = tuple  # of str keys and int list indices

MAX_BYTES = 1 << 20  # 1 MiB; a large real inventory is a few KiB
MAX_DEPTH = 16  # collections inside collections; the deepest real path is 6 (nodes[i].gpu.sharing.mig.profiles)
MAX_EVENTS = 50_000  # keys, values and lists; a 1000-node inventory has about 20,000
UNSUPPORTED = "unsupported YAML syntax"  # refused YAML features read as syntax errors
_TAG = "tag:yaml.org,2002:"


@dataclass(frozen=True)
class Mark:
    line: int  # 1-based, as editors show it
    column: int


@dataclass
class Located:
    """Plain data plus the position of each value (`values`) and mapping key (`keys`)."""

    file: str
    data: object
    values: dict[Path, Mark] = field(default_factory=dict)
    keys: dict[Path, Mark] = field(default_factory=dict)

    def mark(self, path: Path, *, key: bool = False) -> Mark:
        """The closest known position to `path` (walks up to the parent if needed)."""
        table = self.keys if key else self.values
        while path:
            if path in table:
                return table[path]
            if path in self.values:
                return self.values[path]
            path = path[:-1]
        return self.values.get((), Mark(1, 1))


def format_path(path: Path) -> str:
    """`nodes[0].labels.pool`, with anything unprintable in a key escaped."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return escape(text)


def _mark(event) -> Mark:
    return Mark(event.start_mark.line + 1, event.start_mark.column + 1)


class _TooDeep(Exception):
    """The read stops here: nesting or size beyond any real inventory."""


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Builder:
    """Plain data from a stream of parser events (see the module docstring for what is refused)."""

    def __init__(self, loader, located: Located, problems: list[Problem]):
        self.loader = loader
        self.located = located
        self.problems = problems
        self.events = 0

    def next_event(self):
        event = self.loader.get_event()
        self.events += 1
        if self.events > MAX_EVENTS:
            self._problem(event, (), f"{UNSUPPORTED}: more than {MAX_EVENTS} values in one file",
                          "an inventory of a thousand nodes has about 20,000")
            raise _TooDeep
        return event

    def stream(self) -> object:
        self.loader.get_event()  # StreamStart
        if self.loader.check_event(StreamEndEvent):
            return {}
        self.loader.get_event()  # DocumentStart
        data = self.value((), 1)
        self.loader.get_event()  # DocumentEnd
        if not self.loader.check_event(StreamEndEvent):
            self._problem(self.loader.peek_event(), (), f"{UNSUPPORTED}: a second document in the file",
                          "one inventory per file, without a second '---'")
        return data

    def value(self, path: Path, depth: int) -> object:
        event = self.next_event()
        self.located.values[path] = _mark(event)
        if isinstance(event, AliasEvent):
            self._problem(event, path, f"{UNSUPPORTED}: alias *{event.anchor}", _NO_ALIASES)
            return None
        self._refuse_anchor_and_tag(event, path)
        if isinstance(event, ScalarEvent):
            return self.scalar(event, path)
        if depth > MAX_DEPTH:
            self._problem(event, path, f"{UNSUPPORTED}: nested more than {MAX_DEPTH} levels deep",
                          "an inventory is a few levels of keys and lists")
            raise _TooDeep
        if isinstance(event, SequenceStartEvent):
            return self.sequence(path, depth)
        return self.mapping(event, path, depth)

    def sequence(self, path: Path, depth: int) -> list:
        items = []
        while not self.loader.check_event(SequenceEndEvent):
            items.append(self.value(path + (len(items),), depth + 1))
        self.next_event()
        return items

    def mapping(self, start, path: Path, depth: int) -> dict:
        result: dict = {}
        while not self.loader.check_event(MappingEndEvent):
            key_event = self.loader.peek_event()
            key = self.key(path, depth)
            if key is None:
                self.skip()  # the value of a key that was refused
                continue
            child = path + (key,)
            if key in result:
                first = self.located.keys[child]
                self._problem(key_event, child, f"duplicate key {key!r} (first set on line {first.line})",
                              "keep one of them")
                self.skip()
                continue
            self.located.keys[child] = _mark(key_event)
            result[key] = self.value(child, depth + 1)
        self.next_event()
        return result

    def key(self, path: Path, depth: int) -> str | None:
        """A mapping key as written (`yes` stays 'yes', `1` stays '1'); None when refused."""
        event = self.loader.peek_event()
        if not isinstance(event, ScalarEvent):
            self._problem(event, path, f"{UNSUPPORTED}: a key must be a plain word, not a list, mapping or alias",
                          "write key: value")
            self.skip()
            return None
        self.next_event()
        self._refuse_anchor_and_tag(event, path)
        if event.value == "<<" and not event.style:  # plain: None from PyYAML, '' from libyaml
            self._problem(event, path, f"{UNSUPPORTED}: merge keys (<<)", "write the values out in full")
            return None
        return event.value

    def scalar(self, event: ScalarEvent, path: Path) -> object:
        tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _TAG + "merge":
            self._problem(event, path, f"{UNSUPPORTED}: merge keys (<<)", "quote it if you mean the text '<<'")
            return None
        construct = _CONSTRUCTORS.get(tag)
        if construct is None:  # str, and timestamps, '=' and the like: kept as the text written
            return event.value
        try:
            value = construct(self.loader, yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark))
        except ValueError:  # Python refuses to convert integers of more than 4300 digits
            self._problem(event, path, f"the number is {len(event.value)} characters long", "write a short number")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self._problem(event, path, f"{event.value} is not a finite number (NaN and infinity are refused)",
                          "write an ordinary number")
            return None
        return value

    def skip(self) -> None:
        """Consume one whole node (a scalar, an alias, or a collection with everything in it)."""
        depth = 0
        while True:
            event = self.next_event()
            if isinstance(event, CollectionStartEvent):
                depth += 1
            elif isinstance(event, (SequenceEndEvent, MappingEndEvent)):
                depth -= 1
            if depth == 0:
                return
            if depth > MAX_DEPTH:
                self._problem(event, (), f"{UNSUPPORTED}: nested more than {MAX_DEPTH} levels deep")
                raise _TooDeep

    def _refuse_anchor_and_tag(self, event, path: Path) -> None:
        if event.anchor is not None:
            self._problem(event, path, f"{UNSUPPORTED}: anchor &{event.anchor}", _NO_ALIASES)
        if event.tag is not None:
            self._problem(event, path, f"{UNSUPPORTED}: tag {event.tag}",
                          "remove the tag; quote a value to make it text")

    def _problem(self, event, path: Path, message: str, hint: str | None = None) -> None:
        mark = _mark(event)
        self.problems.append(Problem(self.located.file, mark.line, mark.column, format_path(path), message, hint))


_NO_ALIASES = "anchors (&name) and aliases (*name) are refused in an inventory: write the values out in full"

# The core schema's types, built by PyYAML's own scalar functions, chosen here by tag: no
# other constructor is ever reachable.
_CONSTRUCTORS = {
    _TAG + "null": lambda loader, node: None,
    _TAG + "bool": SafeConstructor.construct_yaml_bool,
    _TAG + "int": SafeConstructor.construct_yaml_int,
    _TAG + "float": SafeConstructor.construct_yaml_float,
}


def size_problem(file: str, size: int) -> Problem | None:
    if size <= MAX_BYTES:
        return None
    return Problem(file, 1, 1, "", f"the file is larger than {MAX_BYTES // 1024} KiB ({size} bytes or more); "
                   "an inventory is a few KiB", "is this the right file?")


def load_located(text: str, file: str) -> tuple[Located, list[Problem]]:
    """Parse `text`; syntax errors, refused YAML features and duplicate keys come back as problems."""
    located = Located(file=file, data=None)
    too_big = size_problem(file, len(text.encode("utf-8", "surrogatepass")))
    if too_big:
        return located, [too_big]
    unprintable = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if unprintable:
        line, column = _line_column(text, unprintable.start())
        return located, [Problem(file, line, column, "", f"YAML syntax error: the character "
                                 f"U+{ord(unprintable.group()):04X} is not allowed in a YAML file",
                                 "write it as an escape inside double quotes, or remove it")]
    problems: list[Problem] = []
    loader = None
    try:
        loader = _Loader(text)
        located.data = _Builder(loader, located, problems).stream()
    except _TooDeep:
        located.data = None
    except yaml.MarkedYAMLError as exc:
        problems.append(_syntax_problem(exc, text, file))
    except yaml.YAMLError as exc:
        problems.append(Problem(file, 1, 1, "", f"YAML syntax error: {exc}"))
    finally:
        if loader is not None:
            loader.dispose()
    return located, problems


def _syntax_problem(exc: yaml.MarkedYAMLError, text: str, file: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    if exc.context_mark and (mark is None or mark.index >= len(text.rstrip())):
        # "got <stream end>": the unclosed bracket or quote that started it is the place to fix.
        mark = exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    reason = exc.problem or "invalid YAML"
    if exc.context:
        reason = f"{exc.context}: {reason}"
    return Problem(file, line, column, "", f"YAML syntax error: {reason}",
                   "check the indentation and quoting around this line")


def _line_column(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1
