"""The one place the tool needs more of pyinfra's SSH connection than pyinfra's public API gives.

Everything else goes through the public API (State, connect_all, get_facts, Host.run_shell_command,
StringCommand / FunctionCommand.execute). That API is text both ways: a command's `_stdin` is
written as lines of text (pyinfra/connectors/util.py `write_stdin`: each item gets a newline and
is encoded; bytes raise), and its output comes back as lines paramiko decoded. Some of what the
tool sends and reads is bytes:

- the converge's files, one tar stream on a root script's stdin (bootstrap.remote.archive): a
  k3s binary is ~70 MB, as base64 text lines a million strings per host in memory;
- what a rented host answers and the tool parses (the facts probe, root files), read as capped,
  untrusted bytes with a deadline (bootstrap.remote.remote_output);
- the API tunnel's and the snapshot's channels, which reuse the connection instead of paying for
  another (TCP, key exchange, authentication).

So `ssh_client` reaches the paramiko client under pyinfra's SSH connector (`host.connector.client`),
and `shell_command` says a script as pyinfra's `_sudo` runs it. tests/unit/remote/test_pyinfra_link.py
pins both against the installed pyinfra, so an upgrade that changes them fails a test.

A process-wide setting pyinfra has no option for is here too (`never_prompt_for_sudo`), pinned
by a test; paramiko's text decoding under pyinfra's reads is bootstrap.remote.sshlink's
`decode_remote_output_leniently`.
"""

from __future__ import annotations

import logging
import shlex

from pyinfra.connectors import util

from bootstrap.remote import sshlink


def ssh_client(host):
    """The paramiko client of pyinfra's connection to `host` (a pyinfra Host), or None when it
    has no open one (not connected, disconnected, not an SSH connector)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    return client if sshlink.is_open(client) else None


def uses_sudo(host) -> bool:
    """The host's `_sudo` (bootstrap.remote.session.host_data: the inventory's ssh.use_sudo)."""
    return bool(host.data.get("_sudo", False))


def shell_command(host, script: str) -> str:
    """`script` run by sh, as root when the host uses sudo: the command line pyinfra makes for
    a StringCommand with `_sudo` (never a password: `sudo -n`, see never_prompt_for_sudo)."""
    return f"{'sudo -H -n ' if uses_sudo(host) else ''}sh -c {shlex.quote(script)}"


def _no_sudo_password(prompt: str = "") -> str:
    logging.getLogger("pyinfra").warning("sudo asked for a password (%s); bootstrap uses sudo -n only", prompt.strip())
    return ""


def never_prompt_for_sudo() -> None:
    """When a command prints "sudo: a password is required", pyinfra asks the operator for
    one (getpass) and re-runs the command with the password in its environment, visible in
    the host's `ps`. A rented host controls what its commands print: it could make the tool
    ask the operator for a password and receive it. With sudoers rules that allow only some
    commands without a password, preflight's `sudo -n` check can also pass and a later
    command still ask. An empty answer makes the re-run fail like the first try: the step
    fails with sudo's message, and no password is asked for or sent. (pyinfra has no setting
    for this; its prompt is `getpass` in pyinfra/connectors/util.py.)"""
    util.getpass = _no_sudo_password
