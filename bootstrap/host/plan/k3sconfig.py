"""The /etc/rancher/k3s/config.yaml of each node: the tool writes it whole, never the installer.

Keys are k3s flag names (tests check every one against k3s's own flag list).
"""

from __future__ import annotations

import ipaddress

import yaml

from bootstrap.cluster.gate_rules import taint_flag
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.inventory.model import Inventory, NetworkMode, Node, Role
from bootstrap.checks.k3s_flags import NODE_MONITOR_GRACE_MIN_S, arg_name
from bootstrap.checks.providers import topology_labels
from bootstrap.state.secrets import secret_value

# Spot machines get a shutdown notice: let kubelet end pods cleanly before the VM goes.
GRACEFUL_SHUTDOWN = ("shutdown-grace-period=30s", "shutdown-grace-period-critical-pods=10s")
SUPERVISOR_PORT = 6443

# A lost node's pods are evicted node-monitor-grace-period after its last heartbeat (the node
# turns NotReady/Unknown and gets the NoExecute taints) plus the toleration every pod gets by
# default for those taints. Upstream that is 40 s (kube-controller-manager's default; 50 s
# since Kubernetes v1.32, kubernetes/kubernetes#126287) + 300 s (kube-apiserver's
# default-not-ready- and default-unreachable-toleration-seconds, the DefaultTolerationSeconds
# admission plugin, plugin/pkg/admission/defaulttolerationseconds/admission.go): about six
# minutes of a spot loss before its pods start elsewhere (kubernetes-sigs/kubespray#7112).
# A private network gets about a minute; the grace never goes below v1.32's 50 s
# (NODE_MONITOR_GRACE_MIN_S: above the 45 s a kubelet may take to drop a broken HTTP/2
# connection, #121793), so a shorter total is refused when the inventory is read. Internet
# paths flap: public mode waits longer.
LOST_NODE_EVICTION_S = {NetworkMode.PRIVATE: 60, NetworkMode.PUBLIC: 180}
NODE_MONITOR_GRACE_S = {NetworkMode.PRIVATE: NODE_MONITOR_GRACE_MIN_S, NetworkMode.PUBLIC: 60}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def cluster_address(node: Node, inventory: Inventory | None = None) -> str:
    """The address other nodes use for this one: its node_ip (from the inventory, or chosen
    among the host's own addresses by rules.node_addresses when planning), else its address;
    in network.mode public its inventory address (the public one: node_ip is private)."""
    if inventory is not None and inventory.network.public:
        return node.address
    return node.node_ip or node.address


def server_url(inventory: Inventory, via: Node | None = None) -> str:
    """Every joining node registers with the first server (or `via`, a healthy server when
    the first one is being replaced)."""
    address = cluster_address(via or inventory.servers[0], inventory)
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}:{SUPERVISOR_PORT}"


def node_config(inventory: Inventory, node: Node, tokens: JoinTokens, join_via: Node | None = None,
                embedded_mirror: bool = False, nvidia_default_runtime: bool = False, gated: bool = False) -> dict:
    """`gated`: a GPU node that registers with the acceptance gate's taint (bootstrap.cluster.gate_rules)."""
    config: dict = {"node-name": node.name}
    if nvidia_default_runtime:
        # k3s registers the `nvidia` runtime it finds (pkg/agent/containerd/nvidia.go) and
        # a RuntimeClass, but keeps runc the default: a pod without runtimeClassName gets
        # no GPU from the host's toolkit. As the default, nvidia-container-runtime passes the
        # GPUs the device plugin allotted (NVIDIA_VISIBLE_DEVICES, or CDI) to every pod and
        # is plain runc for the rest. The host toolkit is installed before k3s starts: a
        # default runtime containerd does not have stops the node (CRI plugin not loaded).
        config["default-runtime"] = "nvidia"
    # node-ip must be an address on one of the host's links: k3s registers it as the node's
    # InternalIP and its network policy controller exits when no link holds it (kube-router
    # pkg/utils/node.go GetNodeSubnet, via k3s pkg/agent/netpol/netpol.go). make_plans fills
    # node_ip from the host's own addresses when the inventory address is a NAT'd public one.
    if node.node_ip:
        config["node-ip"] = node.node_ip
        if _is_ip(node.address) and node.address != node.node_ip:
            config["node-external-ip"] = node.address  # the node's ExternalIP: what the world sees
    elif _is_ip(node.address):
        config["node-ip"] = node.address
    if inventory.network.public:
        # Even where the host holds its public address: flannel-external-ip takes the
        # tunnel endpoint from node-external-ip and warns, falling back to the internal
        # address, on a node without one (k3s-io/k3s pkg/agent/run.go, commit 0097157).
        config["node-external-ip"] = node.address
    labels = {**topology_labels(node), **node.labels}
    if labels:
        config["node-label"] = [f"{k}={v}" for k, v in sorted(labels.items())]
    taints = list(node.taints) + ([taint_flag()] if gated else [])
    if taints:
        # k3s applies node-taint only when the node registers (k3s-io/docs docs/cli/agent.md):
        # the gate holds a new or re-registered node until its first check.
        config["node-taint"] = taints
    if inventory.k3s.flannel_iface:
        config["flannel-iface"] = inventory.k3s.flannel_iface
    config["kubelet-arg"] = list(GRACEFUL_SHUTDOWN)
    first = inventory.servers[0]
    if node.role == Role.SERVER:
        config.update(server_settings(inventory, embedded_mirror))
        if not inventory.network.public and "node-ip" in config:
            # k3s advertises node-external-ip when it is set and advertise-address is not
            # (k3s-io/k3s pkg/cli/server/server.go): the `kubernetes` Service's endpoint and
            # the agents' load balancer would then go through the provider's NAT, which
            # often neither allows 6443 in nor loops back (k3s-io/k3s#8813). In a private
            # network the API is advertised on the address the nodes share.
            config["advertise-address"] = config["node-ip"]
        # Every server holds the agent token: any of them may be the one an agent asks.
        # (None: a cluster built before agent tokens, which must not get one now: LEGACY_NOTE.)
        if tokens.agent is not None:
            config["agent-token"] = tokens.agent
        if node.name == first.name and join_via is None:
            # Embedded etcd even for one server: it is what makes snapshots, restore after a
            # lost server, and growing to three servers possible. The short format: the CA
            # that a secure token would name does not exist before this server first starts.
            config["cluster-init"] = True
            config["token"] = tokens.server
        else:
            config["server"] = server_url(inventory, join_via)
            config["token"] = tokens.for_joining_server()
    else:
        # An agent gets what a kubelet needs: the agent token, never the server token.
        config["server"] = server_url(inventory, join_via)
        config["token"] = tokens.for_agent()
    extra = inventory.k3s.server_config if node.role == Role.SERVER else inventory.k3s.agent_config
    for key, value in extra.items():
        # Repeatable flags the tool also sets (kubelet-arg, node-label, tls-san...) add up.
        if isinstance(config.get(key), list):
            config[key] = _add_up(key, config[key], value if isinstance(value, list) else [value])
        else:
            config[key] = value
    return config


def _add_up(key: str, tools: list, users: list) -> list:
    """The tool's entries, then the user's. For a component's arguments (`kube-apiserver-arg`,
    `kubelet-arg`...) the user's entry replaces the tool's of the same argument: k3s would pass
    both (pkg/util/args.go, GetArgs) and the component would take the last one silently."""
    if key.endswith("-arg"):
        theirs = {arg_name(arg) for arg in users}
        tools = [arg for arg in tools if arg_name(arg) not in theirs]
    return tools + users


def eviction_args(inventory: Inventory) -> dict[str, list[str]]:
    """The servers' arguments that evict a lost node's pods k3s.lost_node_eviction_s after
    its last heartbeat (by default LOST_NODE_EVICTION_S for the network mode)."""
    mode = NetworkMode.PUBLIC if inventory.network.public else NetworkMode.PRIVATE
    total = inventory.k3s.lost_node_eviction_s or LOST_NODE_EVICTION_S[mode]
    # The inventory refuses a total below NODE_MONITOR_GRACE_MIN_S; max() keeps the floor for
    # an Inventory built by hand.
    grace = max(NODE_MONITOR_GRACE_MIN_S, min(NODE_MONITOR_GRACE_S[mode], total))
    toleration = max(0, total - grace)
    return {"kube-apiserver-arg": [f"default-not-ready-toleration-seconds={toleration}",
                                   f"default-unreachable-toleration-seconds={toleration}"],
            "kube-controller-manager-arg": [f"node-monitor-grace-period={grace}s"]}


def server_settings(inventory: Inventory, embedded_mirror: bool = False) -> dict:
    """Settings that must be identical on every server (k3s refuses a mismatch on join)."""
    k3s = inventory.k3s
    settings: dict = {"write-kubeconfig-mode": "0600"}
    if embedded_mirror:
        settings["embedded-registry"] = True  # a server flag; it turns the mirror on cluster-wide
    sans = list(k3s.tls_san)
    for server in inventory.servers:
        for address in (server.address, server.node_ip):
            if address and address not in sans:
                sans.append(address)
    settings["tls-san"] = sans
    if k3s.disable:
        settings["disable"] = list(k3s.disable)
    if k3s.flannel_backend != "vxlan":
        settings["flannel-backend"] = k3s.flannel_backend
    if inventory.network.public:
        # WireGuard peers at each node's public address (k3s-io/docs
        # docs/networking/distributed-multicloud.md: servers take --flannel-external-ip).
        settings["flannel-external-ip"] = True
    if k3s.cluster_cidr:
        settings["cluster-cidr"] = k3s.cluster_cidr
    if k3s.service_cidr:
        settings["service-cidr"] = k3s.service_cidr
    settings.update(eviction_args(inventory))
    settings["etcd-snapshot-schedule-cron"] = k3s.snapshots.schedule
    settings["etcd-snapshot-retention"] = k3s.snapshots.retention
    settings.update(s3_settings(k3s.snapshots.s3))
    return settings


def s3_settings(s3) -> dict:
    """k3s uploads every snapshot to S3 itself; credentials come from their references
    (config.yaml is 0600, like the token in it)."""
    if s3 is None:
        return {}
    settings = {"etcd-s3": True, "etcd-s3-bucket": s3.bucket, "etcd-s3-endpoint": s3.endpoint,
                "etcd-s3-region": s3.region}
    if s3.folder:
        settings["etcd-s3-folder"] = s3.folder
    if s3.insecure:
        settings["etcd-s3-insecure"] = True
    access = secret_value(s3.access_key, "k3s.snapshots.s3.access_key")
    secret = secret_value(s3.secret_key, "k3s.snapshots.s3.secret_key")
    if access:
        settings["etcd-s3-access-key"] = access
    if secret:
        settings["etcd-s3-secret-key"] = secret
    return settings


def render(config: dict) -> str:
    return "# Managed by bootstrap; edits are replaced on the next `bootstrap up`.\n" + yaml.safe_dump(
        config, default_flow_style=False, sort_keys=True)
