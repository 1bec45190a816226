"""`bootstrap health INVENTORY [--cordon] [--burn-in SECONDS]`: the GPU health checks on a
running cluster (bootstrap.flows.gpu_health). Exit 1 when a node has a health error."""

from __future__ import annotations

import argparse

from bootstrap.commands.flags import add_json_document

SUMMARY = "check every GPU node's health (ECC, remaps, PCIe, NVLink, slowdown, Xid); --cordon the bad ones"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_document(parser)
    parser.add_argument("--cordon", action="store_true",
                        help="cordon a node with a health error and label it with why (the scheduler stops "
                             "placing work there)")
    parser.add_argument("--burn-in", type=burn_in_seconds, metavar="SECONDS",
                        help="also stress each GPU node's GPUs for about SECONDS through a pod, and compare "
                             "each GPU's throughput with its siblings'")


def burn_in_seconds(text: str) -> int:
    if not text.isdigit() or not 10 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds from 10 to 3600")
    return int(text)


def run(args, console) -> int:
    # imported here: startup time (`bootstrap --help` imports every command module for its flags)
    from bootstrap.flows.burn_in import burn_in
    from bootstrap.flows.gpu_health import check_health, render
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    results = check_health(inventory, state, console, cordon=args.cordon)
    burn = None
    if args.burn_in:
        burn = burn_in(inventory, state, {r.node: r.host for r in results if r.verdict != "error"}, args.burn_in,
                       console)
    if args.json:
        console.document({"nodes": {r.node: {
            "verdict": r.verdict, "gpus": r.gpus,
            "issues": [{"check": f.check.split(":", 1)[1], "severity": "error" if f.severity == "health-error"
                        else f.severity, "message": f.message, "fix": f.fix} for f in r.findings],
            "new_xids": [x.to_dict() for x in r.new_xids]} for r in results},
            "burn_in": burn})
    else:
        console.say_lines(render(results))
    bad = any(r.verdict == "error" for r in results) or bool(burn and burn.get("failed"))
    return 1 if bad else 0
