"""/etc/rancher/k3s/registries.yaml from the inventory's mirrors and credentials.

Written only when there is something to say; secret (credentials), so k3s restarts to read it.
"""

from __future__ import annotations

import yaml

from bootstrap.host.parts.base import FileSpec, text_file
from bootstrap.inventory.model import Inventory
from bootstrap.state.secrets import secret_value

REGISTRIES = "/etc/rancher/k3s/registries.yaml"
PATHS = (REGISTRIES,)


def embedded_mirror_on(inventory: Inventory, gpu_cluster: bool) -> bool:
    """k3s's embedded registry mirror (Spegel): nodes pull images from each other, so a
    multi-gigabyte CUDA image crosses the internet once per cluster. On by default for GPU
    clusters (bootstrap.topology.gpu_cluster: from the inventory and the servers, never from
    an agent's claim); `images.embedded_mirror` decides otherwise."""
    setting = inventory.images.embedded_mirror
    return gpu_cluster if setting is None else setting


def registries_yaml(inventory: Inventory, embedded_mirror: bool = False) -> str | None:
    """k3s enables the embedded mirror per registry listed under `mirrors` (an entry with no
    endpoint is enough); the inventory's own mirror endpoints are tried after it."""
    registries = inventory.registries
    shared = inventory.images.mirror_registries if embedded_mirror else ()
    if not registries.mirrors and not registries.auth and not shared:
        return None
    data: dict = {}
    mirrors = {name: {} for name in shared}
    mirrors.update({name: {"endpoint": list(urls)} for name, urls in registries.mirrors.items()})
    if mirrors:
        data["mirrors"] = dict(sorted(mirrors.items()))
    configs = {}
    for host, auth in sorted(registries.auth.items()):
        entry: dict = {}
        if auth.username:
            entry["username"] = auth.username
        password = secret_value(auth.password, f"registries.auth.{host}.password")
        if password is not None:
            entry["password"] = password
        token = secret_value(auth.token, f"registries.auth.{host}.token")
        if token is not None:
            entry["identitytoken"] = token
        configs[host] = {"auth": entry}
    if configs:
        data["configs"] = configs
    return "# Managed by bootstrap.\n" + yaml.safe_dump(data, default_flow_style=False, sort_keys=True)


def file(inventory: Inventory, embedded_mirror: bool) -> FileSpec | None:
    text = registries_yaml(inventory, embedded_mirror)
    return None if text is None else text_file(REGISTRIES, text, 0o600, secret=True, restarts_k3s=True)
