"""Read a YAML file into plain data while remembering where every value and key sits.

PyYAML's safe loader forgets positions and silently keeps the last of two duplicate
keys; both matter for telling a user exactly which line to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from bootstrap.errors import Problem

Path = tuple  # of str keys and int list indices


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
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _mark(node: yaml.Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    def __init__(self, located: Located, problems: list[Problem]):
        self.located = located
        self.problems = problems
        self.constructor = yaml.SafeLoader("")  # only for scalar type resolution

    def build(self, node: yaml.Node, path: Path) -> object:
        self.located.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            result: dict = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self._problem(key_node, path, "a key must be a plain word")
                    continue
                key = self.constructor.construct_object(key_node)
                if not isinstance(key, str):
                    key = str(key)
                if key == "<<":
                    self._problem(key_node, path, "YAML merge keys (<<) are not supported",
                                  "write the values out in full")
                    continue
                child = path + (key,)
                if key in result:
                    first = self.located.keys[child]
                    self._problem(key_node, child, f"duplicate key '{key}' (first set on line {first.line})",
                                  "keep one of them")
                    continue
                self.located.keys[child] = _mark(key_node)
                result[key] = self.build(value_node, child)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.constructor.construct_object(node)

    def _problem(self, node: yaml.Node, path: Path, message: str, hint: str | None = None) -> None:
        mark = _mark(node)
        self.problems.append(Problem(self.located.file, mark.line, mark.column, format_path(path), message, hint))


def load_located(text: str, file: str) -> tuple[Located, list[Problem]]:
    """Parse `text`; syntax errors and duplicate keys come back as problems."""
    located = Located(file=file, data=None)
    problems: list[Problem] = []
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if exc.context_mark and (mark is None or mark.index >= len(text.rstrip())):
            # "got <stream end>": the unclosed bracket or quote that started it is the place to fix.
            mark = exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        reason = exc.problem or "invalid YAML"
        if exc.context:
            reason = f"{exc.context}: {reason}"
        problems.append(Problem(file, line, column, "", f"YAML syntax error: {reason}",
                                "check the indentation and quoting around this line"))
        return located, problems
    except yaml.YAMLError as exc:
        problems.append(Problem(file, 1, 1, "", f"YAML error: {exc}"))
        return located, problems
    if node is None:
        located.data = {}
        return located, problems
    located.data = _Builder(located, problems).build(node, ())
    return located, problems
