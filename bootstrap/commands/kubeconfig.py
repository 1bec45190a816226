"""`bootstrap kubeconfig INVENTORY [--merge]`: fetch the kubeconfig; optionally merge it."""

from __future__ import annotations

import yaml

from bootstrap.cluster import kubeconfig_file
from bootstrap.inventory.loader import load_inventory
from bootstrap.lock import cluster_lock
from bootstrap.statedir import StateDir


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    state = StateDir(inventory)
    with cluster_lock(state, "kubeconfig"):  # it may pin the server's host key
        path = kubeconfig_file.fetch_over_ssh(inventory, state)
    print(f"kubeconfig for cluster {inventory.cluster}: {path} (context {kubeconfig_file.context_name(inventory)})")
    if args.merge:
        target = kubeconfig_file.default_target()
        kubeconfig_file.merge_into(target, yaml.safe_load(path.read_text()))
        print(f"merged into {target} as context {kubeconfig_file.context_name(inventory)}")
    return 0
