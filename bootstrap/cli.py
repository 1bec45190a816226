"""The `bootstrap` command line. Parsing only: each command lives in bootstrap.commands.*
and is imported when it runs, so `bootstrap --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from bootstrap import __version__
from bootstrap.console_text import PrintableFormatter, PrintableStream
from bootstrap.errors import EXIT_USAGE, run_command

# name -> (module in bootstrap.commands, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "validate an inventory offline; touches no host (--hosts: also check the hosts, changing nothing)"),
    "facts": ("facts", "show what each host has: OS, GPUs, driver, MIG profiles, RDMA, k3s"),
    "up": ("up", "check every host, then build or converge the cluster"),
    "validate": ("validate", "prove the cluster works: GPU pods, capacity, RDMA, a PVC, a gang job"),
    "rebuild": ("rebuild", "after spot loss: remove lost nodes, join replacements, restore a lost control plane"),
    "scale-down": ("scale_down", "drain, delete and uninstall nodes (--node NAME..., or --idle GPU nodes)"),
    "snapshot": ("snapshot", "take an etcd snapshot now and copy it (with its token) to the state folder"),
    "status": ("status", "nodes, GPUs, advertised resources, components and snapshots at a glance"),
    "health": ("health", "check every GPU node's health (ECC, remaps, PCIe, NVLink, slowdown, Xid); --cordon the bad ones"),
    "plan": ("plan", "show what `up` would change on each host, changing nothing"),
    "down": ("down", "tear the cluster down and give the hosts back as they were"),
    "kubeconfig": ("kubeconfig", "fetch the cluster's kubeconfig (0600); --merge adds it to ~/.kube/config"),
    "forget-host": ("forget_host", "forget the pinned SSH host key of a replaced machine"),
    "diagnose": ("diagnose", "collect a support bundle (.tar.gz, secrets redacted) of every host and the cluster"),
}


OFFLINE = {"check", "forget-host"}  # never touch a host: keep them fast
# Paramiko only, no pyinfra: real threads, so `kubeconfig --tunnel` ends on Ctrl-C.
NO_GEVENT = OFFLINE | {"kubeconfig"}
EVENT_STREAMS = {"up", "rebuild", "scale-down", "down"}  # --json: one event per line while they run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bootstrap",
        description="Turn rented GPU VMs into a validated GPU k3s cluster, over SSH.",
        epilog="Exit codes: 0 success, 1 a host or check failed, 2 bad input or usage.",
    )
    parser.add_argument("--version", action="version", version=f"bootstrap {__version__}")
    parser.add_argument("-v", "--debug", action="store_true", help="show tracebacks and debug detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        cmd = sub.add_parser(name, help=summary, description=summary)
        cmd.add_argument("inventory", metavar="INVENTORY", help="the cluster's YAML inventory")
        _add_options(name, cmd)
    return parser


def _add_options(name: str, cmd: argparse.ArgumentParser) -> None:
    if name == "up":
        cmd.add_argument("--hosts-only", action="store_true", help="converge the hosts, skip the cluster side")
        cmd.add_argument("--no-validate", action="store_true", help="skip the checks at the end")
    if name in ("up", "plan"):
        cmd.add_argument("--max-unavailable", type=_positive, default=1, metavar="N",
                         help="k3s upgrades: agents upgraded at once (cordoned and drained), default 1")
    if name == "up":
        cmd.add_argument("--drain-timeout", type=int, default=300, metavar="S",
                         help="k3s upgrades: seconds to wait for a node's pods to be evicted (default 300)")
        cmd.add_argument("--force", action="store_true",
                         help="k3s upgrades: delete pods a PodDisruptionBudget still protects after the time-out")
    if name == "scale-down":
        cmd.add_argument("--node", action="append", metavar="NAME", help="a node to remove (repeatable)")
        cmd.add_argument("--idle", action="store_true", help="every GPU agent with no GPU pods")
        cmd.add_argument("--timeout", type=int, default=300, help="seconds to wait for evictions (default 300)")
        cmd.add_argument("--force", action="store_true", help="delete pods still blocked after the time-out")
        cmd.add_argument("--purge-drivers", action="store_true", help="also remove drivers the tool installed")
        cmd.add_argument("--yes", "-y", action="store_true",
                         help="with --idle: do not ask before removing the idle GPU nodes it found")
        cmd.add_argument("--keep", type=int, default=0, metavar="N",
                         help="with --idle: leave N idle GPU nodes (the first in the inventory) in the cluster")
    if name in ("up", "rebuild"):
        cmd.add_argument("--replace", action="append", metavar="NODE", default=[],
                         help="NODE's machine was replaced (NotReady or gone in the cluster): forget its pinned "
                              "host key and pin the new machine's (repeatable)")
    if name == "rebuild":
        cmd.add_argument("--no-validate", action="store_true", help="skip the checks at the end")
        cmd.add_argument("--restore", action="store_true",
                         help="when no server's k3s answers: restore the control plane from the newest snapshot "
                              "in the state folder (or --snapshot NAME); says what is lost and asks first")
        cmd.add_argument("--snapshot", metavar="NAME", help="with --restore: the snapshot to restore")
        cmd.add_argument("--yes", "-y", action="store_true", help="do not ask before restoring")
    if name in ("validate", "status", "health"):
        cmd.add_argument("--json", action="store_true", help="print JSON for scripts")
    if name == "health":
        cmd.add_argument("--cordon", action="store_true",
                         help="cordon a node with a health error and label it with why (the scheduler stops "
                              "placing work there)")
        cmd.add_argument("--burn-in", type=_seconds, metavar="SECONDS",
                         help="also stress each GPU node's GPUs for about SECONDS through a pod, and compare "
                              "each GPU's throughput with its siblings'")
    if name in EVENT_STREAMS:
        cmd.add_argument("--json", action="store_true",
                         help="one JSON event per line on stdout (steps, messages, the exit code) for scripts and CI")
    if name == "kubeconfig":
        cmd.add_argument("--tunnel", action="store_true",
                         help="hold an SSH tunnel to the API open for kubectl until Ctrl-C (when only SSH is open)")
        cmd.add_argument("--port", type=int, default=6443, metavar="N",
                         help="with --tunnel: the local port (default 6443)")
    if name == "facts":
        cmd.add_argument("--json", action="store_true", help="print JSON for scripts")
        cmd.add_argument("--node", action="append", metavar="NAME", help="only these nodes (repeatable)")
    if name == "check":
        cmd.add_argument("--quiet", "-q", action="store_true", help="print nothing when the inventory is valid")
        cmd.add_argument("--hosts", action="store_true",
                         help="also run every check `up` makes on the hosts (preflight, reachability between "
                              "the nodes), changing nothing")
    if name == "down":
        cmd.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
        cmd.add_argument("--purge-drivers", action="store_true",
                         help="also remove NVIDIA driver packages the tool installed")
        cmd.add_argument("--force", action="store_true",
                         help="also wipe k3s from hosts this cluster did not set up (another cluster's, or "
                              "installed by hand)")
    if name == "kubeconfig":
        cmd.add_argument("--merge", action="store_true",
                         help="add it to ~/.kube/config (or $KUBECONFIG) as context bootstrap-<cluster>")
    if name == "forget-host":
        cmd.add_argument("node", metavar="NODE", nargs="+", help="node name(s) whose machine was replaced")
    if name == "diagnose":
        importlib.import_module("bootstrap.commands.diagnose").add_arguments(cmd)




def _seconds(text: str) -> int:
    if not text.isdigit() or not 10 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds from 10 to 3600")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of nodes of at least 1")
    return int(text)


def report_failed_greenlets_printable() -> None:
    """gevent writes a greenlet's uncaught exception (a host's words in it, maybe) to stderr
    itself: through the console's rule too."""
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
        from gevent import monkey

        monkey.patch_all()
        report_failed_greenlets_printable()
    from bootstrap import progress

    console = progress.make_console(json_events=args.command in EVENT_STREAMS and args.json)
    module = importlib.import_module(f"bootstrap.commands.{COMMANDS[args.command][0]}")
    code = run_command(module.run, args, console, debug=args.debug)
    console.event("exit", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
