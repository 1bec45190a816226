"""Which address each node's k3s uses for cluster traffic (`node-ip`) and which it announces
as its public one (`node-external-ip`). Pure: inventory and facts in, addresses out.

Most clouds give a VM a private address on its interface and a public one that exists only
as a 1:1 NAT translation in the provider's network. The inventory's `address` is the one
SSH reaches, often that public one. k3s takes `node-ip` as given (k3s-io/k3s
pkg/util/net.go, GetHostnameAndIPs, commit 0a3f10c: only parsed), registers it as the
node's InternalIP, and then its network policy controller looks that InternalIP up among
the addresses of the host's links and exits when none holds it ("unable to initialize
network policy controller: error getting node subnet: failed to find interface with
specified node ip": k3s-io/k3s pkg/agent/netpol/netpol.go, commit 0589157, calling
cloudnativelabs/kube-router pkg/utils/node.go GetNodeSubnet, commit 0155169); systemd
restarts it, forever. So `node-ip` is always one of the host's own addresses:

1. `nodes[].node_ip` when the inventory gives one (preflight refuses one the host lacks);
2. the address on `k3s.flannel_iface` when that is set (the interface pod traffic uses);
3. the inventory address, when the host holds it (no NAT);
4. the node-ip the node's k3s runs with (its own config.yaml), while the host still holds it:
   a running node keeps its address until the operator changes the inventory (1-3), so a
   changed peer, or a changed rule, never rewrites its config and restarts its k3s;
5. else the host address whose interface reaches the most other nodes on a route of its
   own (a shared subnet, a VPC route), ties going to the default route's interface: what
   k3s picks without `node-ip` (apimachinery's ChooseHostInterface, kubernetes/kubernetes
   staging/src/k8s.io/apimachinery/pkg/util/net/interface.go, commit 03aacde).

A node is judged by the inventory and by its own answers only: the other nodes are reached
at the addresses the operator wrote for them (`node_ip`, `address`), never at the addresses
they list themselves. A host that lists 172.18.0.99/16 would otherwise make a server's
docker network "reach" it and move the server's node-ip there.

`node-external-ip` is the inventory address when it is an IP and differs from `node-ip`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace

from bootstrap.host.facts.host_facts import HostFacts, InterfaceAddress, Route
from bootstrap.inventory.model import Inventory, Node

# Interfaces k3s, its CNI or a container engine create: never a node's own address. Docker
# names a user-defined network's bridge "br-" and the first 12 hex digits of the network's id
# (moby/moby libnetwork/drivers/bridge/bridge_linux.go, parseNetworkOptions, commit 0040890);
# other br-* (br-lan, br-ens3) are the host's own.
_NOT_HOST = re.compile(r"^(lo|cni\d*|flannel[.-].*|flannel-wg(-v6)?|kube-ipvs\d*|kube-bridge|docker\d+|"
                       r"br-[0-9a-f]{12}|veth.*|cali.*|tunl\d+|vxlan[.-]calico)$")
# Addresses that come and go (a failover VIP is a secondary address) or are not usable yet.
_UNSTABLE = {"secondary", "deprecated", "tentative", "dadfailed"}
DEFAULT_CIDRS = {4: ("10.42.0.0/16", "10.43.0.0/16"), 6: ("fd00:42::/56", "fd00:43::/112")}


@dataclass(frozen=True)
class NodeAddresses:
    internal: str | None  # node-ip; None: the host's addresses are unknown, or none fits
    external: str | None = None  # node-external-ip
    how: str = ""  # why this address, for people
    nat: bool = False  # the inventory address is not on the host


def host_interface(name: str) -> bool:
    """An interface of the host's own, not one k3s, a CNI or a container engine made."""
    return not _NOT_HOST.match(name)


def _ip(text: str | None):
    try:
        return ipaddress.ip_address(text) if text else None
    except ValueError:
        return None


def on_host(facts: HostFacts, address: str) -> InterfaceAddress | None:
    """The interface address equal to `address` (any link, as kube-router looks)."""
    wanted = _ip(address)
    if wanted is None or facts.addresses is None:
        return None
    return next((a for a in facts.addresses if _ip(a.address) == wanted), None)


def _family(inventory: Inventory) -> int:
    cidr = (inventory.k3s.cluster_cidr or "").split(",")[0].strip()
    return 6 if ":" in cidr else 4


def candidates(inventory: Inventory, facts: HostFacts) -> list[InterfaceAddress]:
    """The host's own, stable, global addresses of the cluster's family, not on an
    interface or in a range that k3s's pod and service networks own."""
    family = _family(inventory)
    taken = [inventory.k3s.cluster_cidr or DEFAULT_CIDRS[family][0], inventory.k3s.service_cidr or DEFAULT_CIDRS[family][1]]
    nets = [ipaddress.ip_network(c.strip(), strict=False) for text in taken for c in text.split(",")]
    out = []
    for a in facts.addresses or ():
        ip = _ip(a.address)
        if (ip is None or ip.version != family or a.scope != "global" or not host_interface(a.interface)
                or _UNSTABLE & set(a.flags) or any(ip.version == n.version and ip in n for n in nets)):
            continue
        out.append(a)
    return out


def route_to(facts: HostFacts, destination) -> Route | None:
    """The main table's route for `destination`: longest prefix, then lowest metric."""
    best, best_key = None, None
    for route in facts.routes:
        if route.kind != "unicast" or route.family != destination.version or not route.interface:
            continue
        net = ipaddress.ip_network("::/0" if route.family == 6 else "0.0.0.0/0") if route.destination == "default" \
            else ipaddress.ip_network(route.destination)
        if destination not in net:
            continue
        key = (net.prefixlen, -route.metric)
        if best_key is None or key > best_key:
            best, best_key = route, key
    return best


def _source(route: Route | None, own: list[InterfaceAddress]) -> InterfaceAddress | None:
    """The address the kernel sends from on `route`: its src, else the first on its device."""
    if route is None:
        return None
    by_src = next((a for a in own if route.source and _ip(a.address) == _ip(route.source)), None)
    return by_src or next((a for a in own if a.interface == route.interface), None)


def _peer_ips(inventory: Inventory, node: Node) -> dict[str, list]:
    """The addresses the operator wrote for each other node (its node_ip, its inventory
    address): never what that host lists itself, which it may make up."""
    peers: dict[str, list] = {}
    for other in inventory.nodes:
        if other.name == node.name:
            continue
        ips = [_ip(other.node_ip), _ip(other.address)]
        peers[other.name] = [ip for ip in ips if ip is not None]
    return peers


def _reach(facts: HostFacts, own: InterfaceAddress, peers: dict[str, list]) -> list[str]:
    """The other nodes this address reaches on a route of its interface that is not the
    default route (a shared subnet, a VPC or VPN route)."""
    reached = []
    for name, ips in peers.items():
        for ip in ips:
            route = route_to(facts, ip) if ip.version == _ip(own.address).version else None
            if route and route.destination != "default" and route.interface == own.interface:
                reached.append(name)
                break
    return reached


def _running(host: HostFacts, own: list[InterfaceAddress]) -> InterfaceAddress | None:
    """The candidate address equal to the node-ip in the host's k3s config.yaml, if any."""
    running = _ip(host.k3s.node_ip) if host.k3s else None
    return next((a for a in own if running is not None and _ip(a.address) == running), None)


def choose(inventory: Inventory, node: Node, facts: dict[str, HostFacts]) -> NodeAddresses:
    host = facts.get(node.name)
    public = node.address if _ip(node.address) else None

    def result(internal: str, how: str) -> NodeAddresses:
        external = public if public and _ip(public) != _ip(internal) else None
        nat = host is not None and host.addresses is not None and public is not None and not on_host(host, public)
        return NodeAddresses(internal, external, how, nat)

    if node.node_ip:
        return result(node.node_ip, "nodes[].node_ip")
    if host is None or host.addresses is None:
        # Unknown addresses (no `ip` on the host): as before, the inventory address.
        return NodeAddresses(public, None, "the inventory address (the host's addresses are unknown)")
    own = candidates(inventory, host)
    iface = inventory.k3s.flannel_iface
    if iface:
        on_iface = next((a for a in own if a.interface == iface), None)
        if on_iface:
            return result(on_iface.address, f"the address of k3s.flannel_iface {iface}")
    if public and on_host(host, public):
        return result(public, "the inventory address, on " + on_host(host, public).interface)
    running = _running(host, own)
    if running:
        return result(running.address, f"the node-ip its k3s runs with, on {running.interface}")
    if not own:
        return NodeAddresses(None, public, "no global address on the host", bool(public))
    peers = _peer_ips(inventory, node)
    default = _source(route_to(host, ipaddress.ip_address("::" if _family(inventory) == 6 else "0.0.0.0")), own)
    reach = {a.address: _reach(host, a, peers) for a in own}
    best = max(own, key=lambda a: (len(reach[a.address]), a is default))
    if reach[best.address]:
        how = f"on {best.interface}, which reaches {', '.join(reach[best.address])}"
    elif best is default:
        how = f"on {best.interface}, the default route's interface"
    else:
        how = f"on {best.interface}, the host's first address"
    return result(best.address, how)


def choose_all(inventory: Inventory, facts: dict[str, HostFacts]) -> dict[str, NodeAddresses]:
    return {node.name: choose(inventory, node, facts) for node in inventory.nodes}


def with_node_ips(inventory: Inventory, facts: dict[str, HostFacts],
                  chosen: dict[str, NodeAddresses] | None = None) -> Inventory:
    """The inventory with each node's chosen node-ip as its node_ip: what k3s's config,
    the join URL and the API certificate's names are made from. `chosen`: choose_all's
    answer when the caller has it (bootstrap.topology)."""
    chosen = chosen if chosen is not None else choose_all(inventory, facts)

    def resolved(node: Node) -> Node:
        internal = chosen[node.name].internal
        # The inventory address itself stays implicit: its config is what it always was.
        if internal is None or _ip(internal) == _ip(node.address):
            return node
        return replace(node, node_ip=internal)

    return replace(inventory, nodes=tuple(resolved(n) for n in inventory.nodes))
