"""The `bootstrap` command line. Parsing only: each command, in bootstrap.commands.<module>,
gives its summary (SUMMARY), its flags (add_arguments) and what it does (run). Building the
parser imports every command module, so their top level imports only argparse-level things
and `bootstrap --help` stays fast; what a command runs is imported when it runs."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from types import ModuleType

from bootstrap import __version__
from bootstrap.console_text import PrintableFormatter, PrintableStream
from bootstrap.errors import EXIT_USAGE, run_command

# name -> its module in bootstrap.commands, in the order `bootstrap --help` lists them
COMMANDS: dict[str, str] = {
    "check": "check",
    "facts": "facts",
    "up": "up",
    "validate": "validate",
    "rebuild": "rebuild",
    "scale-down": "scale_down",
    "snapshot": "snapshot",
    "status": "status",
    "health": "health",
    "plan": "plan",
    "down": "down",
    "kubeconfig": "kubeconfig",
    "forget-host": "forget_host",
    "diagnose": "diagnose",
}


OFFLINE = {"check", "forget-host"}  # never touch a host: keep them fast
# Paramiko only, no pyinfra: real threads, so `kubeconfig --tunnel` ends on Ctrl-C.
NO_GEVENT = OFFLINE | {"kubeconfig"}


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"bootstrap.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bootstrap",
        description="Turn rented GPU VMs into a validated GPU k3s cluster, over SSH.",
        epilog="Exit codes: 0 success, 1 a host or check failed, 2 bad input or usage.",
    )
    parser.add_argument("--version", action="version", version=f"bootstrap {__version__}")
    parser.add_argument("-v", "--debug", action="store_true", help="show tracebacks and debug detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = command_module(name)
        cmd = sub.add_parser(name, help=module.SUMMARY, description=module.SUMMARY)
        cmd.add_argument("inventory", metavar="INVENTORY", help="the cluster's YAML inventory")
        module.add_arguments(cmd)
    return parser


def report_failed_greenlets_printable() -> None:
    """gevent writes a greenlet's uncaught exception (a host's words in it, maybe) to stderr
    itself: through the console's rule too."""
    # imported here: startup time, and only after main's gevent patch (commands that need no gevent never load it)
    from gevent import get_hub

    get_hub().exception_stream = PrintableStream()


def main(argv: list[str] | None = None) -> int:
    # A library's warning with no handler of its own (paramiko quoting an SSH server's
    # banner) goes to stderr through logging's last resort: printable too.
    logging.lastResort.setFormatter(PrintableFormatter())
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command not in NO_GEVENT or getattr(args, "hosts", False):
        # pyinfra runs on gevent: patch before paramiko, sockets or threads are first used.
        # imported here: only commands that reach hosts through pyinfra load gevent (startup time)
        from gevent import monkey

        monkey.patch_all()
        report_failed_greenlets_printable()
    module = command_module(args.command)
    # --json on a command whose progress is a stream of events: one JSON event per line
    json_events = getattr(module, "JSON_EVENTS", False) and args.json
    # imported here: startup time (--help makes no console; progress loads json, shutil and more)
    from bootstrap import progress

    console = progress.make_console(json_events=json_events)
    code = run_command(module.run, args, console, debug=args.debug)
    console.event("exit", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
