"""The cluster's kubeconfig: fetched from the first server, kept 0600, merged on request."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from bootstrap.errors import BootstrapError
from bootstrap.hostparts.k3s_service import KUBECONFIG
from bootstrap.inventory.model import Inventory
from bootstrap.statedir import StateDir


def context_name(inventory: Inventory) -> str:
    return f"bootstrap-{inventory.cluster}"


# The cluster's id rides in the kubeconfig as a named extension (client-go's
# clientcmd/api/v1 NamedExtension, as minikube's `cluster_info`), so a merge can tell
# another cluster that happens to have the same name from this one.
EXTENSION = "bootstrap"


def rewrite(text: str, inventory: Inventory, cluster_id: str, server: str | None = None,
            address: str | None = None) -> str:
    """k3s writes https://127.0.0.1:6443 and names everything `default`: point it at the
    server it came from (`address`, default the first) or at `server` (host:port), and name
    cluster, user and context bootstrap-<cluster>."""
    config = yaml.safe_load(text)
    name = context_name(inventory)
    address = address or inventory.servers[0].address
    host = f"[{address}]" if ":" in address else address
    for cluster in config.get("clusters", []):
        scheme = cluster["cluster"]["server"].split("://", 1)[0]
        cluster["cluster"]["server"] = server or f"{scheme}://{host}:6443"
        cluster["cluster"]["extensions"] = [{"name": EXTENSION, "extension": {"cluster-id": cluster_id}}]
        cluster["name"] = name
    for user in config.get("users", []):
        user["name"] = name
    for context in config.get("contexts", []):
        context["name"] = name
        context["context"].update(cluster=name, user=name)
    config["current-context"] = name
    return yaml.safe_dump(config, default_flow_style=False)


def fetch_over_ssh(inventory: Inventory, state: StateDir) -> Path:
    from bootstrap.cluster.tunnel import connect_ssh

    first = inventory.servers[0]
    client = connect_ssh(inventory, first, state)
    try:
        sudo = "sudo -n " if inventory.ssh_for(first).use_sudo else ""
        _, stdout, stderr = client.exec_command(f"{sudo}cat {KUBECONFIG}", timeout=30)
        text = stdout.read().decode()
        if stdout.channel.recv_exit_status() != 0:
            raise BootstrapError(f"cannot read {KUBECONFIG} on {first.name}: {stderr.read().decode().strip()}",
                                 "has `bootstrap up` run on this cluster?")
    finally:
        client.close()
    return state.write_secret("kubeconfig", rewrite(text, inventory, state.cluster_id))


def with_server(path: Path, server: str) -> str:
    """The saved kubeconfig, pointed at another address (the local end of a tunnel)."""
    config = yaml.safe_load(path.read_text())
    for cluster in config.get("clusters", []):
        scheme = cluster["cluster"]["server"].split("://", 1)[0]
        cluster["cluster"]["server"] = f"{scheme}://{server}"
    return yaml.safe_dump(config, default_flow_style=False)


def cluster_id_of(entry: dict) -> str | None:
    for extension in (entry.get("cluster") or {}).get("extensions") or []:
        if isinstance(extension, dict) and extension.get("name") == EXTENSION:
            return (extension.get("extension") or {}).get("cluster-id")
    return None


def foreign_entry(existing: dict, ours: dict) -> str | None:
    """The name of a cluster entry in `existing` that has our name but is another cluster's."""
    for mine in ours.get("clusters", []):
        for entry in existing.get("clusters") or []:
            if not isinstance(entry, dict) or entry.get("name") != mine["name"]:
                continue
            theirs = cluster_id_of(entry)
            if theirs != cluster_id_of(mine) and (theirs is not None or
                                                  (entry.get("cluster") or {}).get("server") != mine["cluster"]["server"]):
                return mine["name"]
    return None


def merge_into(target: Path, ours: dict) -> None:
    """Replace our cluster/user/context entries in `target`, keep everything else. An entry
    of the same name that belongs to another cluster is not overwritten."""
    existing = yaml.safe_load(target.read_text()) if target.exists() else None
    existing = existing or {"apiVersion": "v1", "kind": "Config", "preferences": {}}
    clash = foreign_entry(existing, ours)
    if clash:
        raise BootstrapError(f"{target} already has a context {clash} for another cluster of the same name; "
                             "it was not changed",
                             f"give this cluster its own name (cluster: in the inventory), or remove the other "
                             f"entry first: kubectl config delete-context {clash}; kubectl config delete-cluster {clash}")
    for section in ("clusters", "users", "contexts"):
        names = {entry["name"] for entry in ours.get(section, [])}
        kept = [entry for entry in existing.get(section) or [] if entry.get("name") not in names]
        existing[section] = kept + ours.get(section, [])
    existing.setdefault("current-context", ours["current-context"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".bootstrap-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        yaml.safe_dump(existing, handle, default_flow_style=False)
    os.replace(tmp, target)


def default_target() -> Path:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser()
    return Path.home() / ".kube" / "config"
