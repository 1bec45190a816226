"""Which k3s flags an inventory may add under k3s.server_config / k3s.agent_config.

Pure, apart from reading the flag list shipped beside this file (k3s_flags.txt, copied from
k3s's documentation; its header names the source). The tool writes each node's config.yaml
whole, so the flags it sets itself are refused here: an inventory value would silently
replace the tool's (the token, the node's name, where it joins) or fight an inventory key
that already says it.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources

from bootstrap.inventory.model import Role

ROLES = tuple(role.value for role in Role)

# flag -> what to write instead (or why the tool keeps it)
OWNED = {
    "token": "the tool generates the cluster token and keeps it in the state folder",
    "token-file": "the tool generates the cluster token and keeps it in the state folder",
    "agent-token": "the tool generates the agent token agents join with and keeps it in the state folder",
    "agent-token-file": "the tool generates the agent token agents join with and keeps it in the state folder",
    "server": "the tool joins every node to the first server",
    "node-name": "set nodes[].name",
    "with-node-id": "set nodes[].name (node names must stay what the inventory says)",
    "data-dir": "the tool relies on k3s's default data folder",
    "config": "the tool writes /etc/rancher/k3s/config.yaml itself",
    "cluster-init": "the tool starts embedded etcd on the first server",
    "cluster-reset": "use `bootstrap` commands to restore (a reset in config.yaml would run on every start)",
    "cluster-reset-restore-path": "use `bootstrap` commands to restore a snapshot",
    "write-kubeconfig": "the tool fetches the kubeconfig into the state folder",
    "write-kubeconfig-mode": "the tool keeps the kubeconfig 0600",
    "write-kubeconfig-group": "the tool keeps the kubeconfig 0600",
    "node-label": "set nodes[].labels",
    "node-taint": "set nodes[].taints",
    "node-ip": "set nodes[].node_ip",
    "node-external-ip": "set nodes[].address (with node_ip for the private address)",
    "tls-san": "set k3s.tls_san",
    "flannel-backend": "set k3s.flannel_backend",
    "flannel-iface": "set k3s.flannel_iface",
    "flannel-external-ip": "set network.mode: public (nodes talk over their public addresses, WireGuard)",
    "cluster-cidr": "set k3s.cluster_cidr",
    "service-cidr": "set k3s.service_cidr",
    "disable": "set k3s.disable",
    "embedded-registry": "set images.embedded_mirror",
    "private-registry": "set registries (the tool writes /etc/rancher/k3s/registries.yaml)",
    "etcd-snapshot-schedule-cron": "set k3s.snapshots.schedule",
    "etcd-snapshot-retention": "set k3s.snapshots.retention",
}
OWNED_PREFIXES = {"etcd-s3": "set k3s.snapshots.s3 (the tool writes every etcd-s3 flag from it)"}

# The component arguments k3s.lost_node_eviction_s sets: (k3s flag, argument name).
EVICTION_ARGS = (("kube-apiserver-arg", "default-not-ready-toleration-seconds"),
                 ("kube-apiserver-arg", "default-unreachable-toleration-seconds"),
                 ("kube-controller-manager-arg", "node-monitor-grace-period"))
# node-monitor-grace-period never below 50 s: a kubelet may take 45 s to drop a stalled HTTP/2
# connection to the API server (HTTP2_READ_IDLE_TIMEOUT_SECONDS 30 + HTTP2_PING_TIMEOUT_SECONDS
# 15, kubernetes/kubernetes#121793), and a healthy node whose status updates wait that long
# would be marked NotReady and its pods evicted. 50 s is kube-controller-manager's default
# since v1.32 for that reason (kubernetes/kubernetes#126287). So k3s.lost_node_eviction_s
# (grace plus toleration) is at least this.
NODE_MONITOR_GRACE_MIN_S = 50


def arg_name(arg: object) -> str:
    """The argument an entry of a repeatable `*-arg` flag sets, as k3s reads it (k3s-io/k3s
    pkg/util/args.go, GetArgs: leading "--" dropped, the name before "=", a trailing "+" or
    "-" (append, prepend) is the same argument)."""
    return str(arg).removeprefix("--").split("=", 1)[0].rstrip("+-")


def component_args(values: object) -> list[str]:
    """A `*-arg` flag's value from an inventory: one entry or a list of them."""
    return [str(v) for v in values] if isinstance(values, list) else [str(values)]


@cache
def flags(role: str) -> frozenset[str]:
    """The flags k3s accepts in a config.yaml for `role`: a server runs an agent too, so it
    takes the agent flags as well."""
    text = resources.files("bootstrap.checks").joinpath("k3s_flags.txt").read_text(encoding="utf-8")
    listed: dict[str, set[str]] = {r: set() for r in ROLES}
    for line in text.splitlines():
        listed_role, colon, name = line.partition(":")
        if colon and listed_role in listed and not line.startswith("#"):
            listed[listed_role].add(name.strip())
    return frozenset(listed[Role.AGENT] | (listed[Role.SERVER] if role == Role.SERVER else set()))


def owned(flag: str) -> str | None:
    """What to write instead of `flag`, when the tool sets it; None when the inventory may."""
    if flag in OWNED:
        return OWNED[flag]
    return next((why for prefix, why in OWNED_PREFIXES.items() if flag.startswith(prefix)), None)


def flag_problem(role: str, flag: str) -> tuple[str, str | None] | None:
    """(what is wrong, what to do) with `flag` under k3s.<role>_config; None when fine."""
    why = owned(flag)
    if why:
        return f"{flag} is set by the tool", why
    if flag in flags(role):
        return None
    if role == Role.AGENT and flag in flags(Role.SERVER):
        return f"{flag} is a server flag, not an agent flag", "move it to k3s.server_config"
    close = difflib.get_close_matches(flag, sorted(flags(role)), n=1, cutoff=0.6)
    return (f"{flag} is not a k3s {role} flag",
            f"did you mean '{close[0]}'?" if close else f"see `k3s {role} --help` for the flags k3s takes")
