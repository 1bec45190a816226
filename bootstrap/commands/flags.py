"""Flags more than one command takes, defined once so their words stay the same. Each command
module adds its own flags (`add_arguments`); this module, like the command modules' top level,
imports only argparse: `bootstrap --help` imports every command to build the parser."""

from __future__ import annotations

import argparse


def add_json_document(parser: argparse.ArgumentParser) -> None:
    """The command prints one JSON document at its end instead of text."""
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def add_json_events(parser: argparse.ArgumentParser) -> None:
    """The command's progress as JSON lines while it runs (the module sets JSON_EVENTS)."""
    parser.add_argument("--json", action="store_true",
                        help="one JSON event per line on stdout (steps, messages, the exit code) for scripts and CI")


def add_max_unavailable(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-unavailable", type=positive_nodes, default=1, metavar="N",
                        help="k3s upgrades: agents upgraded at once (cordoned and drained), default 1")


def add_no_validate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-validate", action="store_true", help="skip the checks at the end")


def add_replace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replace", action="append", metavar="NODE", default=[],
                        help="NODE's machine was replaced (NotReady or gone in the cluster): forget its pinned "
                             "host key and pin the new machine's (repeatable)")


def positive_nodes(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of nodes of at least 1")
    return int(text)
