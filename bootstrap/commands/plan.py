"""`bootstrap plan INVENTORY`: what `up` would change on each host, changing nothing."""

from __future__ import annotations

from bootstrap.commands.common import open_hosts
from bootstrap.commands.up import gather_and_plan
from bootstrap.inventory.loader import load_inventory
from bootstrap.statedir import StateDir


def run(args) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with open_hosts(inventory, list(inventory.nodes), "plan") as session:
        _, plans = gather_and_plan(session, inventory, state, create_token=False)
    for node in inventory.nodes:
        plan = plans.plans[node.name]
        if not plan.changed:
            print(f"{node.name}: no change")
            continue
        print(f"{node.name}:")
        for change in plan.changes:
            print(f"  - {change}")
    return 0
