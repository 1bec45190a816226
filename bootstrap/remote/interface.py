"""What flows need of the hosts' connections, as a type: `Hosts`.

The real session (bootstrap.remote.session.HostSession) and the test fake (tests/fakes.py)
both implement it; tests/unit/remote/test_hosts_interface.py compares their members and
signatures with this one, so neither can drift from what flows call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from bootstrap.console_text import printable
from bootstrap.inventory.model import Node


@dataclass(frozen=True)
class HostFailure:
    node: str
    message: str
    hint: str | None = None
    machine_answers: bool = False  # something answered at the address (a new host key, a refused login)
    # It answered, but with what cannot be used (too much, too slow, unparsable): the host
    # is left out of the run like a node that fails a check, and does not stop the others.
    bad_answer: bool = False

    def render(self) -> str:
        # The message quotes the host (its error line): one printable line, whatever it holds.
        return printable(f"{self.node}: {self.message}" + (f" ({self.hint})" if self.hint else ""))


@runtime_checkable
class Hosts(Protocol):
    """The hosts of one command, connected: a failed host is in `failures` and runs nothing more."""

    nodes: list[Node]  # the hosts this session was opened for (a flow may narrow it)
    failures: dict[str, HostFailure]  # {node name: why it is out of this run}

    def fail(self, name: str, message: str, hint: str | None = None, *, bad_answer: bool = False) -> None:
        """Record a failure for one host and stop running anything more on it."""

    def gather(self, fact_cls: type, **fact_kwargs: Any) -> dict[str, Any]:
        """One fact on every active host in parallel: {node name: value}."""

    def execute(self, steps: list, after: dict[str, Callable[[], Any]] | None = None) -> dict[str, dict]:
        """Prepared steps (bootstrap.host.plan.steps.Step) on the active hosts: {node: {step: StepResult}}."""

    def run_each(self, commands: dict[str, str], what: str = "command", stdin: dict[str, str] | None = None,
                 timeout: float | None = None) -> dict[str, str | None]:
        """One shell command per host, in parallel, as the login user: {node: stdout or None}."""

    def read_root_file(self, name: str, path: str) -> str | None:
        """A root-only file's text from one host, or None when it cannot be read."""

    def ssh_client(self, name: str) -> Any | None:
        """This session's open SSH connection to `name` (a paramiko client) for the API tunnel
        and the snapshot to reuse, or None: then they open their own."""
