"""`bootstrap snapshot INVENTORY`: an etcd snapshot now, copied to the state folder."""

from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.snapshots import take
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "snapshot"):
        path = take(inventory, state)
    console.say(f"snapshot saved: {path} (with its token beside it, 0600)")
    return 0
