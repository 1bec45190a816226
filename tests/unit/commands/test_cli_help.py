"""`bootstrap --help` and every `bootstrap <command> --help` are pinned, word for word, with
the defaults each command's parsed arguments carry: moving a flag's definition must not
change what the operator reads or what the command receives. After an intended change:
BOOTSTRAP_UPDATE_CLI_HELP=1 python -m pytest tests/unit/commands/test_cli_help.py, then review the diff."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.cli import COMMANDS, build_parser, main
from repo_paths import TESTS

PINNED = TESTS / "fixtures" / "cli_help"
UPDATE = os.environ.get("BOOTSTRAP_UPDATE_CLI_HELP") == "1"
# argparse wraps help text to the terminal's width: one fixed width for every run.
WIDTH = "100"


def _check(name: str, text: str) -> None:
    path = PINNED / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; see tests/fixtures/cli_help/{name}"


def _help_of(argv, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", WIDTH)
    assert main(argv) == 0
    return capsys.readouterr().out


def test_top_level_help_is_pinned(capsys, monkeypatch):
    _check("bootstrap.txt", _help_of(["--help"], capsys, monkeypatch))


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_help_is_pinned(command, capsys, monkeypatch):
    _check(f"{command}.txt", _help_of([command, "--help"], capsys, monkeypatch))


def test_every_command_has_its_pinned_help():
    pinned = {p.stem for p in PINNED.glob("*.txt")} - {"bootstrap", "defaults"}
    assert pinned == set(COMMANDS)


def test_parsed_defaults_are_pinned():
    """What each command's run() receives when no flag is given (and the order of the flags)."""
    parser = build_parser()
    extra = {"forget-host": ["node-1"]}
    lines = [f"{name}: {json.dumps(vars(parser.parse_args([name, 'inv.yaml', *extra.get(name, [])])))}\n"
             for name in COMMANDS]
    _check("defaults.txt", "".join(lines))


def test_help_loads_no_flow_and_no_remote_library():
    """`bootstrap --help` builds the parser from every command module: their top level must stay
    argparse-level, or --help slows (pyinfra, paramiko, the flows take seconds on a slow disk) and
    sockets or ssl load before main's gevent patch."""
    probe = ("import sys\nfrom bootstrap.cli import build_parser\nbuild_parser()\n"
             "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    heavy = ("yaml", "jinja2", "pyinfra", "paramiko", "gevent", "ssl", "socket", "bootstrap.flows",
             "bootstrap.remote", "bootstrap.cluster", "bootstrap.inventory", "bootstrap.state.folder")
    assert [m for m in loaded if m.startswith(heavy)] == []
    assert {f"bootstrap.commands.{module}" for module in COMMANDS.values()} <= set(loaded)
