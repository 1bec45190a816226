"""A stand-in for a HostSession in in-process flow tests: what flows use of one (facts,
failures, execute), with hosts that do not answer and hosts whose steps fail."""

from bootstrap.hosts.session import HostFailure


class FakeSession:
    def __init__(self, inventory, facts: dict, unreachable=(), failing=(),
                 why_unreachable: str = "no SSH answer", bad_answers=()):
        self.nodes = list(inventory.nodes)
        self.facts, self.failing = facts, set(failing)
        self.failures = {n: HostFailure(n, why_unreachable) for n in unreachable}
        # Hosts whose facts probe answered with what cannot be used (the real session's
        # _gather_untrusted: too much, too slow, unparsable).
        self.failures.update({n: HostFailure(n, "the facts probe: too much output", bad_answer=True)
                              for n in bad_answers})
        self.executed: list[tuple[str, str]] = []  # (step, host) in the order they ran

    def gather(self, fact_cls, **kwargs):
        return {n: f for n, f in self.facts.items() if n not in self.failures}

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        """No host runs a command here: each reports nothing (the reachability probes say
        "not tested")."""
        return {}

    def read_root_file(self, name, path):
        """No host file can be read here (subclasses answer the ones a test needs)."""
        return None

    def fail(self, name, message, hint=None, *, bad_answer=False):
        self.failures.setdefault(name, HostFailure(name, message, hint, bad_answer=bad_answer))

    def execute(self, steps, after=None):
        for step in steps:
            for name in step.commands:
                if name in self.failures:
                    continue
                self.executed.append((step.name, name))
                if name in self.failing:
                    self.fail(name, f"{step.name}: failed")
            if after and step.name in after:
                after[step.name]()
        return {}
