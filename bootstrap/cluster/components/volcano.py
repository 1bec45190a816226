"""Volcano (gang scheduling) and its queues (Queue CRD scheduling.volcano.sh/v1beta1, 1.15.1)."""

from __future__ import annotations

from bootstrap.cluster.components import trust, versions
from bootstrap.cluster.components.release import Release
from bootstrap.inventory.model import Component, Inventory, Queue

NAMESPACE = "volcano-system"


def release(inventory: Inventory) -> Release | None:
    if not inventory.volcano.enabled:
        return None
    src = versions.source(inventory, Component.VOLCANO)
    # The chart pulls with "Always"; IfNotPresent keeps restarts working behind a slow or
    # rate-limited registry and with preloaded images.
    values: dict = {"basic": {"image_pull_policy": "IfNotPresent"}}
    selector = trust.trusted_selector(inventory)
    if selector:
        # The scheduler binds any pod, the controllers create pods in any namespace: their
        # tokens stay on trusted nodes (custom.default_ns, values.yaml 1.15.1; templates/
        # scheduler.yaml, controllers.yaml, admission.yaml, admission-init.yaml take
        # `or .Values.custom.<component>_ns .Values.custom.default_ns` as their nodeSelector).
        values["custom"] = {"default_ns": selector}
    return Release("volcano", NAMESPACE, src.chart, src.repo, src.version, values, src.archive)


def queue(q: Queue) -> dict:
    # Reclaimable defaults to Volcano's own default (true) while the inventory has no field for it.
    reclaimable = getattr(q, "reclaimable", True)
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": q.name},
            "spec": {"weight": q.weight, "reclaimable": bool(reclaimable)}}


def queues(inventory: Inventory) -> list[dict]:
    return [queue(q) for q in inventory.volcano.queues] if inventory.volcano.enabled else []
