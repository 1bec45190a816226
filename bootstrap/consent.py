"""Asking before a command does something that cannot be undone: the operator types the
cluster's name. The question goes to stderr (under --json stdout carries only events); with
no terminal to ask, the command is refused unless --yes said so beforehand."""

from __future__ import annotations

import sys

from bootstrap.console_text import write_text
from bootstrap.errors import UsageError


def ask_for_cluster_name(inventory, question: str, refused: str, assume_yes: bool,
                         hint: str = "add --yes to confirm") -> None:
    """`question` is asked; `refused`: what is not done when nobody can answer."""
    if assume_yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(refused, hint)
    write_text(sys.stderr, f"{question} Type the cluster name to confirm: ", end="")
    if sys.stdin.readline().strip() != inventory.cluster:
        raise UsageError("not confirmed; nothing was changed")
