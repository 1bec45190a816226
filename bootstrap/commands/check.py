"""`bootstrap check INVENTORY`: validate offline; exit 0 or 2, no host touched. With
`--hosts`, also every check `up` makes on the hosts before changing them (exit 1 on a problem)."""

from bootstrap.chart_archives import check_archives
from bootstrap.inventory.loader import load_inventory


def run(args, console) -> int:
    inventory = load_inventory(args.inventory)
    check_archives(inventory)
    if not args.quiet:
        gpu_nodes = [n.name for n in inventory.nodes if n.gpu.enabled is not False]
        console.say(f"{inventory.source}: valid: cluster {inventory.cluster}, "
              f"{len(inventory.servers)} server(s), {len(inventory.agents)} agent(s)"
              f"{'' if gpu_nodes else ', no GPU nodes'}")
    if getattr(args, "hosts", False):
        from bootstrap.flows.host_check import check_hosts

        return check_hosts(inventory, console)
    return 0
