"""Load an inventory file: parse, check every field, then check the file as a whole.

Everything wrong is reported at once, each with file:line:column, before any host is touched.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path as FsPath

from bootstrap.errors import InvalidInput, Problem, UsageError
from bootstrap.inventory.model import Inventory
from bootstrap.inventory.schema import INVENTORY
from bootstrap.inventory.source import Located, load_located
from bootstrap.inventory.spec import Checker


def load_inventory(path: str | os.PathLike) -> Inventory:
    file = os.fspath(path)
    try:
        text = FsPath(file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"inventory file {file} does not exist",
                         "give the path of a YAML inventory, e.g. inventories/lab.yaml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read inventory {file}: {exc}") from None
    return parse_inventory(text, file)


def parse_inventory(text: str, file: str = "<inventory>") -> Inventory:
    located, problems = load_located(text, file)
    if problems:
        raise InvalidInput(problems=problems)
    if not isinstance(located.data, dict):
        mark = located.mark(())
        raise InvalidInput(problems=[Problem(file, mark.line, mark.column, "", "the inventory must be a mapping of keys",
                                             "start with cluster: NAME, then nodes:")])
    checker = Checker(located)
    inventory = INVENTORY.check(located.data, (), checker)
    check_across_fields(located.data, located, checker)
    if checker.problems:
        raise InvalidInput(problems=sorted(checker.problems, key=lambda p: (p.line, p.column)))
    return replace(inventory, source=file)


def check_across_fields(data: dict, located: Located, ck: Checker) -> None:
    """Rules that span fields or nodes. They read the raw data (defensively), so they are
    reported in the same pass as type errors elsewhere in the file."""
    nodes = [n for n in _as_list(data.get("nodes")) if isinstance(n, dict)]
    raw_nodes = _as_list(data.get("nodes"))
    check_unique_nodes(raw_nodes, _raw_port(data.get("ssh"), 22), located, ck)
    if nodes:
        servers = [n for n in nodes if n.get("role") == "server"]
        if not servers:
            ck.problem(("nodes",), "no node has role: server",
                       "give one node (or three, for an HA control plane) role: server", key=True)
        elif len(servers) % 2 == 0:
            ck.problem(("nodes",), f"{len(servers)} servers: an even number cannot keep etcd quorum",
                       f"use {len(servers) - 1} or {len(servers) + 1} servers (1, 3 or 5)", key=True)
    storage = _as_dict(data.get("storage"))
    if storage.get("default") == "nfs" and not storage.get("nfs"):
        ck.problem(("storage", "default"), "NFS storage needs a server and a share",
                   "add under storage: nfs: {server: 10.0.0.5, share: /srv/nfs}")
    has_rdma = bool(_as_dict(_as_dict(data.get("network")).get("rdma")))
    for index, node in enumerate(raw_nodes):
        if isinstance(node, dict) and "rdma_interfaces" in node and not has_rdma:
            ck.problem(("nodes", index, "rdma_interfaces"), "rdma_interfaces without network.rdma",
                       "add network: {rdma: {mode: shared, interfaces: [...]}} to enable RDMA", key=True)
    check_one_mig_strategy(data, raw_nodes, ck)
    gpu = _as_dict(data.get("gpu"))
    if gpu.get("driver_branch") and gpu.get("driver", "preinstalled") != "host":
        ck.problem(("gpu", "driver_branch"), "driver_branch only applies to driver: host",
                   "remove driver_branch, or set driver: host", key=True)


def check_one_mig_strategy(data: dict, nodes: list, ck: Checker) -> None:
    """The GPU Operator's MIG strategy is one chart value for the whole cluster."""
    def strategy(gpu) -> str | None:
        mig = _as_dict(_as_dict(_as_dict(gpu).get("sharing")).get("mig"))
        return mig.get("strategy", "single") if mig else None

    cluster_wide = strategy(data.get("gpu"))
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        own = strategy(node.get("gpu"))
        if own and cluster_wide and own != cluster_wide:
            ck.problem(("nodes", index, "gpu", "sharing", "mig", "strategy"),
                       f"MIG strategy {own} differs from the cluster's {cluster_wide}",
                       "the MIG strategy is one setting for the whole cluster: use the same on every node")
        cluster_wide = cluster_wide or own


def check_unique_nodes(nodes: list, default_port: int, located: Located, ck: Checker) -> None:
    """k3s refuses two nodes with one name, and two nodes cannot share one SSH endpoint."""
    seen_names: dict[str, int] = {}
    seen_endpoints: dict[tuple, int] = {}
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        name, address = node.get("name"), node.get("address")
        if isinstance(name, str):
            if name in seen_names:
                first = located.mark(("nodes", seen_names[name], "name"))
                ck.problem(("nodes", index, "name"), f"duplicate node name {name!r} (first on line {first.line})",
                           "give every node its own name: k3s refuses two nodes with one name")
            else:
                seen_names[name] = index
        if isinstance(address, str):
            endpoint = (address, _raw_port(node.get("ssh"), default_port))
            if endpoint in seen_endpoints:
                first = located.mark(("nodes", seen_endpoints[endpoint], "address"))
                ck.problem(("nodes", index, "address"),
                           f"duplicate address {address} (first on line {first.line})",
                           "each node needs its own address (or its own ssh.port behind one shared IP)")
            else:
                seen_endpoints[endpoint] = index


def _as_list(value) -> list:
    return value if isinstance(value, list) else []


def _as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _raw_port(ssh, default):
    port = ssh.get("port") if isinstance(ssh, dict) else None
    return port if isinstance(port, int) else default
