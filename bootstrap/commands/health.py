"""`bootstrap health INVENTORY [--cordon] [--burn-in SECONDS]`: the GPU health checks on a
running cluster (bootstrap.flows.gpu_health). Exit 1 when a node has a health error."""

from __future__ import annotations

from bootstrap.flows.gpu_health import check_health, render
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    results = check_health(inventory, state, console, cordon=args.cordon)
    burn = None
    if args.burn_in:
        from bootstrap.flows.burn_in import burn_in

        burn = burn_in(inventory, state, {r.node: r.gpus for r in results if r.verdict != "error"}, args.burn_in,
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
