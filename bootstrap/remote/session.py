"""A pyinfra session over the inventory's hosts: parallel connect, per-host failures as data.

pyinfra is driven through its public Python API (State, connect_all, get_facts,
Host.run_shell_command); what needs bytes on its connections goes through
bootstrap.remote.pyinfra_link, the one module that reaches under it. A host that cannot be
reached, refuses its pinned key or cannot sudo gets one clear line; the other hosts carry on.
HostSession implements bootstrap.remote.interface.Hosts, what flows need of the hosts.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor  # greenlets: bootstrap.cli patched threading
from pathlib import Path

# This module loads only when hosts are opened (bootstrap.remote.connections), after bootstrap.cli
# patched gevent: `--help` and the offline commands never load pyinfra.
import gevent
from pyinfra.api import BaseStateCallback, Config, Inventory as PyInventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.facts import get_facts
from pyinfra.api.state import StateStage

from bootstrap.console_text import PrintableFormatter
from bootstrap.errors import BootstrapError
from bootstrap.remote import channels, executor, hostkeys, pyinfra_link, sshlink
from bootstrap.remote.interface import HostFailure
from bootstrap.remote.remote_output import read_command, run_command, sh_command
from bootstrap.inventory.model import Inventory, Node
from bootstrap.progress import Reporter, command_finished
from bootstrap.remote_data import RemoteDataError
from bootstrap.state.secrets import resolve, ssh_password
from bootstrap.state.folder import StateDir


# A file the tool reads back as root (k3s.yaml, the server token) is a few KiB.
MAX_ROOT_FILE_BYTES = 1024 * 1024
# run_each: what one host's answer may be (the reachability check's parser refuses half of
# this: a bigger answer is cut here, read no further) and how long it may take unless told.
MAX_EACH_BYTES = 8 << 20
EACH_TIMEOUT_S = 600


def explain_connect_error(node: Node, address: str, port: int, error: str, inventory: Inventory) -> HostFailure:
    """Turn pyinfra's connect errors into a line that says what to do."""
    text = str(error)
    seconds = inventory.ssh_for(node).connect_timeout
    if "host key" in text.lower():
        return HostFailure(
            node.name,
            f"SSH host key of {hostkeys.known_hosts_entry(address, port)} changed since it was pinned; refusing to connect",
            f"if {node.name} was replaced by a new machine, run: bootstrap rebuild {inventory.source} --replace "
            f"{node.name} (or first: bootstrap forget-host {inventory.source} {node.name})",
            machine_answers=True,
        )
    if "Authentication" in text:
        return HostFailure(node.name, f"SSH authentication failed ({text.split('(', 1)[-1].rstrip(')')})",
                           "check ssh.user and ssh.key in the inventory", machine_answers=True)
    if "resolve" in text:
        return HostFailure(node.name, f"cannot resolve host name {address}")
    if sshlink.is_silent(text):
        return HostFailure(node.name, sshlink.no_answer(address, port, seconds),
                           "is the machine up, and does a firewall drop the SSH port?")
    if "refused" in text.lower() or "Could not connect" in text:
        return HostFailure(node.name, f"cannot connect to SSH at {address}:{port} ({_reason(text)})",
                           "is the machine running and sshd up?")
    return HostFailure(node.name, f"SSH error: {_reason(text)}")


def _reason(text: str) -> str:
    # pyinfra wraps errors as "Could not connect (…)"; keep the innermost reason.
    return text.strip().splitlines()[-1] if text.strip() else "unknown error"


def host_data(inventory: Inventory, state: StateDir, node: Node, known_hosts: Path | None = None) -> dict:
    """pyinfra host data for one node, public keys only. sudo is always `sudo -n`: preflight
    requires passwordless sudo, and pyinfra would put a sudo password in the command's
    environment, on the host's process list. The SSH password is for logging in only."""
    ssh = inventory.ssh_for(node)
    data: dict = {
        "ssh_hostname": node.address,
        "ssh_port": ssh.port,
        "ssh_user": ssh.user,
        "ssh_known_hosts_file": str(known_hosts or state.known_hosts),
        "ssh_strict_host_key_checking": "accept-new",
        # a retry would cost a silent host the time-out again (and a jump channel is spent)
        "ssh_connect_retries": 0,
        "ssh_allow_agent": True,
        "ssh_paramiko_connect_kwargs": sshlink.timeout_kwargs(ssh.connect_timeout),
        "_sudo": ssh.use_sudo,
    }
    key = sshlink.key_file(inventory, node)
    if key:
        data["ssh_key"] = str(key)
    password = ssh_password(inventory, node)  # this node's own, never another's
    if password:
        data["ssh_password"] = password
    passphrase = resolve(ssh.key_passphrase, f"ssh key passphrase for {node.name}")
    if passphrase:
        data["ssh_key_password"] = passphrase
    return data


_interrupt_handler = None


def interrupt_quietly() -> None:
    """Ctrl-C ends the run in its main greenlet, wherever it lands. Python raised
    KeyboardInterrupt in whichever greenlet ran at that instant: a host's step (gevent's hub
    printed that greenlet's traceback), or paramiko's transport "thread", a greenlet under
    pyinfra's monkey-patching (threading printed the traceback, the API tunnel died and `up`
    went on to exit 0). gevent's own handler runs in its loop instead and throws it into the
    main greenlet, where bootstrap.errors says "interrupted" and exits 130."""
    global _interrupt_handler
    if _interrupt_handler is None:
        main = gevent.get_hub().parent
        _interrupt_handler = gevent.signal_handler(signal.SIGINT, main.throw, KeyboardInterrupt)


def user_errors_quietly() -> None:
    """A BootstrapError raised in a greenlet (a host's step, the kubeconfig read while the
    agents join) is a message the main greenlet says, via bootstrap.errors, when it joins
    that greenlet; gevent's hub printed it first as a traceback on stderr. For the hub it is
    not an error (gevent's Hub.NOT_ERROR, a per-instance setting)."""
    hub = gevent.get_hub()
    if not issubclass(BootstrapError, hub.NOT_ERROR):
        hub.NOT_ERROR = (*hub.NOT_ERROR, BootstrapError)


class HostSession:
    """Connect once, run facts and deploys, disconnect. Use as a context manager."""

    def __init__(self, inventory: Inventory, state: StateDir, nodes: list[Node] | None = None,
                 log_file: Path | None = None, reporter=None):
        """`reporter`: where step progress goes (bootstrap.progress); plain lines if none."""
        self.inventory = inventory
        self.reporter = reporter or Reporter()
        self.state_dir = state
        self.nodes = list(nodes if nodes is not None else inventory.nodes)
        self.failures: dict[str, HostFailure] = {}
        self.log_file = log_file
        self._state = None
        self._jumps = sshlink.Jumps(state.known_hosts)

    def __enter__(self) -> "HostSession":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        self.state_dir.ensure()
        self._configure_logging()
        pyinfra_link.never_prompt_for_sudo()
        sshlink.decode_remote_output_leniently()
        interrupt_quietly()
        user_errors_quietly()
        # pyinfra appends first-contact keys to the file it is given, in place and in
        # parallel: give it a private copy and merge what it learnt afterwards, atomically.
        scratch = self._scratch_known_hosts()
        try:
            socks = self._open_jumps()
            names = [(node.name, self._pyinfra_data(node, scratch, socks)) for node in self.nodes
                     if node.name not in self.failures]
            if not names:
                return  # every host failed at its bastion: nothing for pyinfra to connect to
            timeout = max(self.inventory.ssh_for(n).connect_timeout for n in self.nodes)
            config = Config(PARALLEL=min(len(names), 100), CONNECT_TIMEOUT=timeout, FAIL_PERCENT=None)
            state = State(PyInventory((names, {})), config)
            state.add_callback_handler(self._connect_callbacks(BaseStateCallback))
            state.set_stage(StateStage.Connect)
            try:
                connect_all(state)
            except PyinfraError:
                pass  # "No hosts remaining!": every host is already in self.failures
            hostkeys.merge(self.state_dir.known_hosts, scratch.read_text())
        finally:
            scratch.unlink(missing_ok=True)
        self._state = state
        for host in state.inventory:
            client = pyinfra_link.ssh_client(host)
            if client is not None:
                sshlink.detect_dead_peer(client.get_transport().sock)
            else:
                self.fail(host.name, "could not connect")  # (a host already failed keeps its reason)
        for transport in self._jumps.transports():
            sshlink.detect_dead_peer(transport.sock)

    def _scratch_known_hosts(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self.state_dir.path, prefix=".known_hosts.session.")  # 0600
        known = self.state_dir.known_hosts
        with os.fdopen(fd, "w") as handle:
            handle.write(known.read_text() if known.exists() else "")
        return Path(name)

    def _open_jumps(self) -> dict:
        """A channel through its bastion for each node with ssh.jump, opened in parallel (one
        bastion connection each, shared); a node whose bastion fails is a failure here and
        is never contacted directly."""
        jumped = [n for n in self.nodes if self.inventory.ssh_for(n).jump]
        if not jumped:
            return {}
        for node in jumped:  # one bastion connection per bastion, before the channels
            try:
                self._jumps.bastion(self.inventory, node)
            except sshlink.SshUnreachable:
                pass  # the channel below reports it for each of its nodes

        def channel(node):
            try:
                return node.name, self._jumps.channel(self.inventory, node)
            except sshlink.SshUnreachable as exc:
                self.failures[node.name] = HostFailure(node.name, exc.message, exc.hint)
                return node.name, None

        with ThreadPoolExecutor(max_workers=min(len(jumped), 32)) as pool:
            return {name: sock for name, sock in pool.map(channel, jumped) if sock is not None}

    def _pyinfra_data(self, node: Node, known_hosts: Path, socks: dict) -> dict:
        data = host_data(self.inventory, self.state_dir, node, known_hosts)
        if node.name in socks:
            data["ssh_paramiko_connect_kwargs"] = {**data["ssh_paramiko_connect_kwargs"], "sock": socks[node.name]}
        return data

    def _connect_callbacks(self, base):
        session = self

        class Callbacks(base):
            def host_connect(self, state, host):
                # Its first command's channel opens while the other hosts still connect.
                client = pyinfra_link.ssh_client(host)
                if client is not None:
                    channels.open_ahead(client.get_transport())

            def host_connect_error(self, state, host, error):
                node = session.inventory.node(host.name)
                ssh = session.inventory.ssh_for(node)
                session.failures[host.name] = explain_connect_error(node, node.address, ssh.port, error,
                                                                    session.inventory)

        return Callbacks()

    def close(self) -> None:
        if self._state is not None:
            disconnect_all(self._state)
            self._state = None
        self._jumps.close()

    def _configure_logging(self) -> None:
        """pyinfra and paramiko log to the run log only, at INFO: pyinfra's DEBUG lines include
        connection kwargs, and paramiko prints tracebacks for errors we report in one line."""
        handler: logging.Handler = logging.NullHandler()
        if self.log_file:
            self.log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            handler = logging.FileHandler(self.log_file)
            # The run log quotes hosts' output and is read with `cat` or `less`: printable too.
            handler.setFormatter(PrintableFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        for name in ("pyinfra", "paramiko"):
            logger = logging.getLogger(name)
            logger.propagate = False
            logger.setLevel(logging.INFO)
            for old in list(logger.handlers):
                logger.removeHandler(old)
            logger.addHandler(handler)

    # -- what callers use ---------------------------------------------------------------------
    @property
    def pyinfra_state(self):
        return self._state

    def active_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.name not in self.failures]

    def ssh_client(self, name: str):
        """The paramiko client of this session's connection to `name` (None when it has
        none: not connected, failed, or not SSH): the API tunnel and the snapshot reuse it
        instead of paying for a second connection (TCP, key exchange, authentication)."""
        if self._state is None or name in self.failures:
            return None
        host = self._state.inventory.get_host(name, None)  # (None: a node pyinfra never had, failed at its bastion)
        return pyinfra_link.ssh_client(host) if host is not None else None

    def fail(self, name: str, message: str, hint: str | None = None, *, bad_answer: bool = False) -> None:
        """Record a failure for one host and stop running anything more on it."""
        self.failures.setdefault(name, HostFailure(name, message, hint, bad_answer=bad_answer))
        host = self._state.inventory.get_host(name, None) if self._state is not None else None
        if host is None:
            return
        try:
            self._state.fail_hosts({host})
        except PyinfraError:
            pass  # "No hosts remaining!": the caller still reports every host's line, then decides

    def execute(self, steps: list, after: dict | None = None) -> dict:
        """Run prepared steps (bootstrap.host.plan.steps.Step) on the active hosts: the one
        way flows change hosts. {node: {step: StepResult}}; `after`: see executor.execute."""
        return executor.execute(self, steps, after)

    def read_root_file(self, name: str, path: str) -> str | None:
        """A root-only file's text from one host (never logged), or None when it cannot be read.
        Read as bytes over the session's connection (bootstrap.remote.remote_output): at most
        MAX_ROOT_FILE_BYTES, within a minute; bytes that are not UTF-8 are replaced."""
        client = self.ssh_client(name)
        if client is None:
            return None
        host = self._state.inventory.get_host(name)
        # As pyinfra's _sudo runs it; sudo's own messages are not the file's text.
        sudo = "sudo -H -n " if pyinfra_link.uses_sudo(host) else ""
        try:
            status, data = run_command(client, f"{sudo}cat {shlex.quote(path)} 2>/dev/null",
                                       max_bytes=MAX_ROOT_FILE_BYTES, timeout=60, what=path)
        except (RemoteDataError, *sshlink.SSH_ERRORS):
            return None
        return data.decode("utf-8", "replace") if status == 0 else None

    def run_each(self, commands: dict[str, str], what: str = "command", stdin: dict[str, str] | None = None,
                 timeout: float | None = None) -> dict[str, str | None]:
        """One shell command per host (its own), all in parallel, as the login user:
        {node: stdout, or None when it failed, could not run, printed more than
        MAX_EACH_BYTES or took longer than `timeout` seconds}. `stdin`: {node: text} for the
        command's stdin, where secrets go (argv and the environment are readable by every
        local user of the host); never logged. `what`: its name in the trace (a `command`
        event per host). Read as bytes with a cap and a deadline (bootstrap.remote.remote_output,
        on the channel opened ahead for it): what a host prints is untrusted. Its stderr is
        not part of the answer."""
        def run(name: str, command: str) -> str | None:
            client = self.ssh_client(name)
            if client is None:
                return None
            started = time.time()
            try:
                status, output = run_command(
                    client, f"{sh_command(command)} 2>/dev/null", max_bytes=MAX_EACH_BYTES,
                    timeout=timeout or EACH_TIMEOUT_S, what=what,
                    stdin=stdin[name].encode() if stdin and name in stdin else b"")
            except (RemoteDataError, *sshlink.SSH_ERRORS) as exc:  # this host's answer is missing
                logging.getLogger(__name__).error("%s: %s failed: %s", name, what, type(exc).__name__)
                return None
            finally:
                command_finished(self.reporter, name, what, started)
            return output.decode("utf-8", "replace") if status == 0 else None

        jobs = {name: gevent.spawn(run, name, command) for name, command in commands.items()
                if name not in self.failures}
        gevent.joinall(list(jobs.values()))
        return {name: job.value for name, job in jobs.items()}

    def gather(self, fact_cls, **fact_kwargs) -> dict:
        """Run one fact on every active host in parallel: {node name: value}."""
        if self._state is None or not self._state.active_hosts:
            return {}
        if getattr(fact_cls, "untrusted_output", False):
            return self._gather_untrusted(fact_cls(), fact_kwargs)
        results = get_facts(self._state, fact_cls, kwargs={"_sudo": False, **fact_kwargs})
        return {host.name: value for host, value in results.items() if host.name not in self.failures}

    def _gather_untrusted(self, fact, fact_kwargs: dict) -> dict:
        """A fact parsed from its output's bytes (fact.process_bytes), read by
        bootstrap.remote.remote_output on every active host in parallel. A host whose output is
        refused (too much, too slow) or whose connection fails is that host's failure."""
        command = sh_command(str(fact.command(**fact_kwargs)))
        what = "the facts probe"

        def run(name: str):
            client = self.ssh_client(name)
            if client is None:
                self.fail(name, f"{what}: no SSH connection to run it on")
                return None
            try:
                output = read_command(client, command, max_bytes=fact.max_output_bytes, timeout=fact.timeout_s,
                                      what=what)
            except RemoteDataError as exc:
                self.fail(name, str(exc), bad_answer=True)
                return None
            except sshlink.SSH_ERRORS as exc:
                self.fail(name, f"{what}: SSH error: {_reason(str(exc))}")
                return None
            try:
                return fact.process_bytes(output)
            except Exception:  # a parser's bug: this host's failure, never the others' (the trace goes to the log)
                logging.getLogger("pyinfra.bootstrap").exception("%s: %s output could not be parsed", name, what)
                self.fail(name, f"{what}: its output could not be parsed (the run log has the details)",
                          bad_answer=True)
                return None

        jobs = {node.name: gevent.spawn(run, node.name) for node in self.active_nodes()}
        gevent.joinall(list(jobs.values()))
        return {name: job.value for name, job in jobs.items() if job.value is not None and name not in self.failures}
