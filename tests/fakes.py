"""A stand-in for a HostSession in in-process flow tests: what flows use of one (facts,
failures, execute), with hosts that do not answer and hosts whose steps fail. It implements
bootstrap.remote.interface.Hosts, as the real session does (tests/unit/remote/test_hosts_interface.py
checks both against it, signatures included)."""

from bootstrap.remote.interface import HostFailure


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

    def gather(self, fact_cls, **fact_kwargs):
        return {n: f for n, f in self.facts.items() if n not in self.failures}

    def run_each(self, commands, what="command", stdin=None, timeout=None):
        """No host runs a command here: each reports nothing (the reachability probes say
        "not tested")."""
        return {}

    def read_root_file(self, name, path):
        """No host file can be read here (subclasses answer the ones a test needs)."""
        return None

    def ssh_client(self, name):
        """No SSH connection to reuse: the tunnel and the snapshot (a test's stand-ins) open their own."""
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


class LocalShellClient:
    """A paramiko client's shape over this machine's `sh`: what the byte-channel code of
    bootstrap.remote (archive, remote_output) runs on, so its real scripts and streams are
    tested through a real shell and GNU tar without a host."""

    def get_transport(self):
        return self

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout=None):
        return LocalShellChannel()


class LocalShellChannel:
    def exec_command(self, command: str) -> None:
        import subprocess

        self.process = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)

    def settimeout(self, seconds) -> None:
        pass  # pipes block: this machine's sh is no host that keeps a channel open

    def send(self, data) -> int:
        self.process.stdin.write(data)
        return len(data)

    def sendall(self, data: bytes) -> None:
        self.process.stdin.write(data)

    @property
    def status_event(self):
        """paramiko's Event set when the exit status came: here, when sh has exited."""
        process = self.process

        class Exited:
            def wait(self, timeout=None) -> bool:
                import subprocess

                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    return False
                return True

        return Exited()

    def shutdown_write(self) -> None:
        self.process.stdin.close()

    def recv(self, size: int) -> bytes:
        return self.process.stdout.read1(size)

    def recv_stderr(self, size: int) -> bytes:
        return self.process.stderr.read1(size)

    def recv_exit_status(self) -> int:
        return self.process.wait()

    def close(self) -> None:
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()


class PyinfraHost:
    """A connected pyinfra Host's shape as bootstrap.remote.pyinfra_link reads it."""

    def __init__(self, client, sudo: bool = False, name: str = "cp-1"):
        self.name, self.data = name, {"_sudo": sudo}
        self.connector = type("Connector", (), {"client": client})()


def run_here(script: str, sources: list) -> bool:
    """bootstrap.remote.archive.run_with_archive on this machine (see LocalShellClient)."""
    from bootstrap.remote import archive

    return archive.run_with_archive(None, PyinfraHost(LocalShellClient()), script, sources)
