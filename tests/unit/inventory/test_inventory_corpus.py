"""Every broken or hostile inventory in tests/inventories/{broken,hostile} exits 2 with
file:line and the field named, quickly and without a traceback.

Each file's first line says what must be reported: `# expect: LINE PATH` (PATH `<syntax>`
for a YAML syntax error or a refused YAML feature, `<root>` for a problem with the file as
a whole). PATH is written as the tool prints it, with non-printable characters escaped.
"""

import re
import time
from pathlib import Path

import pytest
from clirun import run_bootstrap

from bootstrap.errors import InvalidInput
from bootstrap.inventory.loader import load_inventory
from repo_paths import TESTS

CORPUS = TESTS / "inventories"
BROKEN = sorted((CORPUS / "broken").glob("*.yaml"))
HOSTILE = sorted((CORPUS / "hostile").glob("*.yaml"))
ALL = BROKEN + HOSTILE
# What a terminal would act on: C0 controls (but the newline between problems), DEL, C1
# controls, and the Unicode line separators and bidi overrides.
TERMINAL_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def expectation(path: Path) -> tuple[int, str]:
    match = re.match(r"# expect: ([0-9]+) (\S+)", path.read_text(encoding="utf-8").splitlines()[0])
    assert match, f"{path.name} lacks its '# expect: LINE PATH' header"
    return int(match.group(1)), match.group(2)


def test_corpus_is_large_enough():
    assert len(BROKEN) >= 25
    assert len(HOSTILE) >= 60


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_broken_inventory_is_located(path):
    line, field = expectation(path)
    with pytest.raises(InvalidInput) as caught:
        load_inventory(path)
    problems = caught.value.problems
    assert problems, "no problem reported"
    if field == "<syntax>":
        wanted = [p for p in problems if "syntax" in p.message]
    elif field == "<root>":
        wanted = [p for p in problems if p.path == ""]
    else:
        wanted = [p for p in problems if p.path == field]
    assert wanted, f"no problem on {field}: {[p.render() for p in problems]}"
    assert wanted[0].line == line, wanted[0].render()
    assert wanted[0].file == str(path)
    assert wanted[0].column >= 1


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_cli_exits_2_without_traceback(path):
    line, field = expectation(path)
    started = time.monotonic()
    result = run_bootstrap("check", str(path), timeout=30)
    assert time.monotonic() - started < 5
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "internal error" not in result.stderr
    assert f"{path}:{line}:" in result.stderr
    if not field.startswith("<"):
        assert f"{field}:" in result.stderr
    assert "nothing was changed on any host" in result.stderr
    assert not TERMINAL_CONTROL.search(result.stderr + result.stdout), "a control character reached the terminal"
