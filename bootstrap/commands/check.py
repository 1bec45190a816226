"""`bootstrap check INVENTORY`: validate offline; exit 0 or 2, no host touched."""

from bootstrap.chart_archives import check_archives
from bootstrap.inventory.loader import load_inventory


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    check_archives(inventory)
    if not args.quiet:
        gpu_nodes = [n.name for n in inventory.nodes if n.gpu.enabled is not False]
        print(f"{inventory.source}: valid: cluster {inventory.cluster}, "
              f"{len(inventory.servers)} server(s), {len(inventory.agents)} agent(s)"
              f"{'' if gpu_nodes else ', no GPU nodes'}")
    return 0
