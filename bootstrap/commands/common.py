"""What commands share: choosing nodes by name."""

from __future__ import annotations

from bootstrap.errors import UsageError
from bootstrap.inventory.model import Inventory, Node


def select_nodes(inventory: Inventory, names: list[str] | None) -> list[Node]:
    if not names:
        return list(inventory.nodes)
    known = {n.name for n in inventory.nodes}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no node named {', '.join(unknown)} in {inventory.source}",
                         f"nodes are: {', '.join(sorted(known))}")
    return [n for n in inventory.nodes if n.name in names]
