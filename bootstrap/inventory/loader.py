"""Load an inventory file: parse, check every field, then check the file as a whole.

Everything wrong is reported at once, each with file:line:column, before any host is touched.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from bootstrap.errors import InvalidInput, Problem, UsageError
from bootstrap.inventory.addresses import DNS_LABEL, host_error, ip_error, normal_endpoint, normal_host
from bootstrap.inventory.kube import derived_name, nad_name, parse_taint
from bootstrap.inventory.model import Inventory, Role
from bootstrap.inventory.schema import INVENTORY
from bootstrap.inventory.source import MAX_BYTES, Located, load_located, size_problem
from bootstrap.inventory.spec import Checker, TooManyProblems


def load_inventory(path: str | os.PathLike) -> Inventory:
    file = os.fspath(path)
    try:
        with open(file, "rb") as stream:
            data = stream.read(MAX_BYTES + 1)  # never more: the file may be huge, or endless
    except FileNotFoundError:
        raise UsageError(f"inventory file {file} does not exist",
                         "give the path of a YAML inventory, e.g. inventories/lab.yaml") from None
    except OSError as exc:
        raise UsageError(f"cannot read inventory {file}: {exc}") from None
    too_big = size_problem(file, len(data))
    if too_big:
        raise InvalidInput(problems=[too_big])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidInput(problems=[Problem(file, line, 1, "", f"the file is not UTF-8 text (byte {exc.object[exc.start]:#04x})",
                                             "save the inventory as UTF-8")]) from None
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
    try:
        inventory = INVENTORY.check(located.data, (), checker)
        check_across_fields(located.data, located, checker)
    except TooManyProblems:
        pass  # the problems so far are reported
    if checker.problems:
        raise InvalidInput(problems=sorted(checker.problems, key=lambda p: (p.line, p.column)))
    return with_mode_defaults(replace(inventory, source=file), located.data)


def with_mode_defaults(inventory: Inventory, data: dict) -> Inventory:
    """network.mode public encrypts pod traffic between nodes: WireGuard unless the
    inventory names a backend (check_public_network refuses any other)."""
    if inventory.network.public and "flannel_backend" not in _as_dict(data.get("k3s")):
        return replace(inventory, k3s=replace(inventory.k3s, flannel_backend="wireguard-native"))
    return inventory


def check_across_fields(data: dict, located: Located, ck: Checker) -> None:
    """Rules that span fields or nodes. They read the raw data (defensively), so they are
    reported in the same pass as type errors elsewhere in the file."""
    nodes = [n for n in _as_list(data.get("nodes")) if isinstance(n, dict)]
    raw_nodes = _as_list(data.get("nodes"))
    check_unique_nodes(data, raw_nodes, located, ck)
    if nodes:
        servers = [n for n in nodes if n.get("role") == Role.SERVER]
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
    check_own_passwords(data, raw_nodes, ck)
    check_public_network(data, raw_nodes, ck)
    check_derived_names(data, raw_nodes, located, ck)
    for index, node in enumerate(raw_nodes):
        if isinstance(node, dict):
            check_unique_taints(node.get("taints"), ("nodes", index, "taints"), ck)
    gpu = _as_dict(data.get("gpu"))
    if gpu.get("driver_branch") and gpu.get("driver", "preinstalled") != "host":
        ck.problem(("gpu", "driver_branch"), "driver_branch only applies to driver: host",
                   "remove driver_branch, or set driver: host", key=True)


def check_public_network(data: dict, nodes: list, ck: Checker) -> None:
    """network.mode public: nodes talk over their inventory addresses, which become k3s's
    node-external-ip (IP addresses only: k3s-io/k3s pkg/util/net.go ParseStringSliceToIPs),
    and pod traffic between them crosses the internet, so it is encrypted: flannel's
    wireguard-native backend, with flannel-external-ip (k3s-io/docs
    docs/networking/distributed-multicloud.md)."""
    if _as_dict(data.get("network")).get("mode") != "public":
        return
    backend = _as_dict(data.get("k3s")).get("flannel_backend")
    if backend is not None and backend != "wireguard-native":
        ck.problem(("k3s", "flannel_backend"), f"network.mode public carries pod traffic over the internet; "
                   f"flannel backend {backend} would send it unencrypted",
                   "remove k3s.flannel_backend (public mode uses wireguard-native)")
    for index, node in enumerate(nodes):
        address = node.get("address") if isinstance(node, dict) else None
        if isinstance(address, str) and ip_error(address) is not None and host_error(address) is None:
            ck.problem(("nodes", index, "address"), f"{address} is a host name; in network.mode public the "
                       "address is the node's public IP (k3s's node-external-ip takes IP addresses only)",
                       "write the machine's public IP address")


def check_one_mig_strategy(data: dict, nodes: list, ck: Checker) -> None:
    """The GPU Operator's MIG strategy is one chart value for the whole cluster, and the
    operator passes it to every node's device plugin (MIG_STRATEGY), over the per-node
    config: with `mixed`, no node can use MPS."""
    def sharing(gpu) -> dict:
        return _as_dict(_as_dict(gpu).get("sharing"))

    def strategy(gpu) -> str | None:
        mig = _as_dict(sharing(gpu).get("mig"))
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
    if cluster_wide != "mixed":
        return
    # NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go (validateFlags, v0.17-v0.20):
    # "using --mig-strategy=mixed is not supported with MPS"; the plugin then advertises nothing.
    hint = ("the GPU Operator gives every node's device plugin the cluster's MIG strategy, and the plugin "
            "refuses MPS with mixed: use strategy: single on the MIG nodes, or time_slicing here")
    places = [(("gpu", "sharing", "mps"), data.get("gpu"))]
    places += [(("nodes", i, "gpu", "sharing", "mps"), n.get("gpu")) for i, n in enumerate(nodes) if isinstance(n, dict)]
    for path, gpu in places:
        if sharing(gpu).get("mps"):
            ck.problem(path, "MPS in a cluster whose MIG strategy is mixed", hint)


PASSWORD_FIELDS = ("password_env", "password_file")


def check_own_passwords(data: dict, nodes: list, ck: Checker) -> None:
    """An SSH password is offered to the host it is given for: one shared by several nodes
    (the top-level ssh.password of two nodes or more, or one variable or file named by
    several) lets any of those hosts, or whoever runs it, log in to all the others. Each
    node names its own (nodes[].ssh.password_env / password_file), or keys are used."""
    top = _password_ref(data.get("ssh"), ("ssh",))
    using: dict = {}
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        path, ref = _password_ref(node.get("ssh"), ("nodes", index, "ssh")) or top or (None, None)
        if ref is not None:
            name = node.get("name") if isinstance(node.get("name"), str) else f"nodes[{index}]"
            using.setdefault(ref, []).append((path, name))
    for users in using.values():
        if len(users) < 2:
            continue
        names = ", ".join(ascii(name) for _, name in users[:5]) + (", ..." if len(users) > 5 else "")
        for path in dict.fromkeys(path for path, _ in users):
            ck.problem(path, f"one SSH password for {len(users)} nodes ({names}): each of them is offered it when "
                       "it logs in, so a host that gets it can log in to the others",
                       "give each node its own password (nodes[].ssh.password_env or password_file), or use "
                       "SSH keys (ssh.key), the default", key=True)


def _password_ref(ssh, path: tuple) -> tuple[tuple, tuple] | None:
    """(path of the field, what it names) of an ssh mapping's password reference, or None.
    Files compare by their path as the tool opens it (~ expanded, ./ and // folded)."""
    for field in PASSWORD_FIELDS:
        value = ssh.get(field) if isinstance(ssh, dict) else None
        if isinstance(value, str) and value:
            named = os.path.normpath(os.path.expanduser(value)) if field == "password_file" else value
            return path + (field,), (field, named)
    return None


def check_unique_nodes(data: dict, nodes: list, located: Located, ck: Checker) -> None:
    """k3s refuses two nodes with one name, and two nodes cannot share one SSH endpoint (nor
    one cluster address). Addresses compare in one spelling: 2001:DB8:0::1 is 2001:db8::1."""
    default_port, default_jump = _raw_port(data.get("ssh"), 22), _raw_jump(data.get("ssh"), None)
    names, endpoints, node_ips = [], [], []
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        name, address, node_ip = node.get("name"), node.get("address"), node.get("node_ip")
        if isinstance(name, str):
            names.append((("nodes", index, "name"), name, name))
        if isinstance(address, str):
            jump = _raw_jump(node.get("ssh"), default_jump)
            endpoint = (normal_host(address), _raw_port(node.get("ssh"), default_port),
                        normal_endpoint(jump) if jump else None)
            endpoints.append((("nodes", index, "address"), address, endpoint))
        if isinstance(node_ip, str):
            node_ips.append((("nodes", index, "node_ip"), node_ip, normal_host(node_ip)))
    report_duplicates(names, "node name", "give every node its own name: k3s refuses two nodes with one name",
                      located, ck)
    report_duplicates(endpoints, "address",
                      "each node needs its own address (or its own ssh.port behind one shared IP)", located, ck)
    report_duplicates(node_ips, "node_ip", "each node needs its own cluster address", located, ck)


def report_duplicates(entries: list, what: str, hint: str, located: Located, ck: Checker,
                      derived: bool = False) -> None:
    """`entries` are (path, value as written, what it is compared as); each repeat of an
    earlier one is reported at its own line, naming the first. With `derived`, the compared
    value is a name made from the written one: one value written twice is no collision."""
    seen: dict = {}
    for path, written, compared in entries:
        first_path, first_written = seen.setdefault(compared, (path, written))
        if first_path == path or (derived and first_written == written):
            continue
        same = f" (both become {compared!a})" if derived else ""
        first = located.mark(first_path)
        ck.problem(path, f"duplicate {what} {written!a}{same}: {first_written!a} is on line {first.line}", hint)


def check_derived_names(data: dict, nodes: list, located: Located, ck: Checker) -> None:
    """Object names the tool derives from inventory names must be valid and distinct:
    a NetworkAttachmentDefinition per RDMA interface, a validation pod per node, a queue each."""
    interfaces = _strings(_as_dict(_as_dict(data.get("network")).get("rdma")).get("interfaces"),
                          ("network", "rdma", "interfaces"))
    for index, node in enumerate(nodes):
        if isinstance(node, dict):
            interfaces += _strings(node.get("rdma_interfaces"), ("nodes", index, "rdma_interfaces"))
    nads = [(path, name, nad_name(name)) for path, name in interfaces]
    for path, name, nad in nads:
        if not re.fullmatch(DNS_LABEL, nad):
            ck.problem(path, f"interface {name!a} gives the NetworkAttachmentDefinition name {nad!a}, "
                       "which is not a DNS label", "name the interface as the host does, e.g. ibp26s0")
    report_duplicates(nads, "RDMA interface", "two interface names may not differ only in case or in '.', '_' "
                      "and '-': each gets its own NetworkAttachmentDefinition", located, ck, derived=True)
    named = {name for _, name in interfaces}
    for key in _as_dict(_as_dict(_as_dict(data.get("network")).get("rdma")).get("link_layer")):
        if isinstance(key, str) and key not in named:  # a typo would leave the name to decide
            ck.problem(("network", "rdma", "link_layer", key), f"link_layer names {key!a}, which is no RDMA interface",
                       "use a name from network.rdma.interfaces or a node's rdma_interfaces", key=True)
    pods = [(("nodes", i, "name"), n["name"], derived_name("gpu-test-", n["name"])) for i, n in enumerate(nodes)
            if isinstance(n, dict) and isinstance(n.get("name"), str)]
    report_duplicates(pods, "node name", "give the nodes names that differ earlier", located, ck, derived=True)
    queues = _as_list(_as_dict(data.get("volcano")).get("queues"))
    report_duplicates([(("volcano", "queues", i, "name"), q["name"], q["name"]) for i, q in enumerate(queues)
                       if isinstance(q, dict) and isinstance(q.get("name"), str)],
                      "queue name", "give every queue its own name", located, ck)


def check_unique_taints(taints, path: tuple, ck: Checker) -> None:
    """The API server refuses a node with two taints of one key and effect."""
    seen = set()
    for taint_path, text in _strings(taints, path):
        parts = parse_taint(text)
        if parts is None:
            continue
        key, _, effect = parts
        if (key, effect) in seen:
            ck.problem(taint_path, f"a second {key}:{effect} taint", "keep one taint per key and effect")
        seen.add((key, effect))


def _as_list(value) -> list:
    return value if isinstance(value, list) else []


def _as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _strings(value, path: tuple) -> list[tuple[tuple, str]]:
    """(path, text) of each text item of a list that may also be written as one item."""
    if isinstance(value, str):
        return [(path, value)]
    return [(path + (i,), item) for i, item in enumerate(_as_list(value)) if isinstance(item, str)]


def _raw_jump(ssh, default):
    jump = ssh.get("jump") if isinstance(ssh, dict) else None
    return jump if isinstance(jump, str) else default


def _raw_port(ssh, default):
    port = ssh.get("port") if isinstance(ssh, dict) else None
    return port if isinstance(port, int) else default
