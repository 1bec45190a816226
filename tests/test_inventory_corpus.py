"""Every broken inventory in tests/inventories/broken exits 2 with file:line and the field named.

Each file's first line says what must be reported: `# expect: LINE PATH` (PATH `<syntax>`
for a YAML syntax error, `<root>` for a file that is not a mapping).
"""

import re
from pathlib import Path

import pytest
from clirun import run_bootstrap

from bootstrap.errors import InvalidInput
from bootstrap.inventory.loader import load_inventory

BROKEN = sorted((Path(__file__).parent / "inventories" / "broken").glob("*.yaml"))


def expectation(path: Path) -> tuple[int, str]:
    match = re.match(r"# expect: (\d+) (\S+)", path.read_text().splitlines()[0])
    assert match, f"{path.name} lacks its '# expect: LINE PATH' header"
    return int(match.group(1)), match.group(2)


def test_corpus_is_large_enough():
    assert len(BROKEN) >= 25


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
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


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_cli_exits_2_without_traceback(path):
    line, field = expectation(path)
    result = run_bootstrap("check", str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert f"{path}:{line}:" in result.stderr
    if not field.startswith("<"):
        assert f"{field}:" in result.stderr
    assert "nothing was changed on any host" in result.stderr
