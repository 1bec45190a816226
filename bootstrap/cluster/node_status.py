"""What a Node object says about itself. Pure: one answer to "is it Ready", "is it a server"."""

from __future__ import annotations


def ready_condition(node: dict) -> str | None:
    """The Ready condition's status ("True", "False", "Unknown"), None when it has none."""
    return next((c.get("status") for c in node.get("status", {}).get("conditions", []) if c.get("type") == "Ready"),
                None)


def node_ready(node: dict) -> bool:
    return ready_condition(node) == "True"


def ready_word(node: dict | None) -> str:
    """For people: Ready, NotReady, or absent (no such Node)."""
    if not node:
        return "absent"
    return {"True": "Ready", "False": "NotReady", "Unknown": "NotReady"}.get(ready_condition(node), "absent")


def is_server(node: dict) -> bool:
    labels = node.get("metadata", {}).get("labels", {})
    return "node-role.kubernetes.io/control-plane" in labels or "node-role.kubernetes.io/etcd" in labels
