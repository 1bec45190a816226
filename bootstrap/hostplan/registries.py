"""/etc/rancher/k3s/registries.yaml from the inventory's mirrors and credentials."""

from __future__ import annotations

import yaml

from bootstrap.inventory.model import Inventory
from bootstrap.secrets import resolve


def registries_yaml(inventory: Inventory) -> str | None:
    registries = inventory.registries
    if not registries.mirrors and not registries.auth:
        return None
    data: dict = {}
    if registries.mirrors:
        data["mirrors"] = {name: {"endpoint": list(urls)} for name, urls in sorted(registries.mirrors.items())}
    configs = {}
    for host, auth in sorted(registries.auth.items()):
        entry: dict = {}
        if auth.username:
            entry["username"] = auth.username
        password = resolve(auth.password, f"registries.auth.{host}.password")
        if password is not None:
            entry["password"] = password
        token = resolve(auth.token, f"registries.auth.{host}.token")
        if token is not None:
            entry["identitytoken"] = token
        configs[host] = {"auth": entry}
    if configs:
        data["configs"] = configs
    return "# Managed by bootstrap.\n" + yaml.safe_dump(data, default_flow_style=False, sort_keys=True)
