"""A machine re-created under the same name (a spot VM replaced, a host reinstalled) must
lose its old Node before it joins, in `up` as in `rebuild`.

k3s keeps `<name>.node-password.k3s` in kube-system and refuses a new machine's node
password while it exists (k3s-io/k3s pkg/nodepassword/nodepassword.go verifyHash, answered
403 by pkg/nodepassword/validate.go; the agent then retries for ever: "Node password
rejected, duplicate hostname ...", pkg/agent/config/config.go). A server's new etcd member
is refused while the old one is listed ("duplicate node name found", pkg/etcd/etcd.go,
join). Both go with the Node: the secret is owned by it (pkg/nodepassword/controller.go)
and a server's member is removed first through k3s's removal annotation
(bootstrap.cluster.node_removal). So the Node is deleted through the API, before the join.
"""

from __future__ import annotations

import time
from dataclasses import replace

from bootstrap.cluster.client import ClusterError, connect as connect_to_cluster, get
from bootstrap.cluster.node_status import is_server, node_ready
from bootstrap.console_text import printable
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.flows.run import Run
from bootstrap.checks.lost_nodes import fresh, replaced_machines
from bootstrap.cluster.node_removal import remove_node
from bootstrap.remote import hostkeys
from bootstrap.state.lock import cluster_lock


def cluster_nodes(inventory, state, connect=connect_to_cluster):
    """({name: Node}, None) through any server that answers, or (None, why not)."""
    try:
        with connect(inventory, state) as cluster:
            nodes = get(cluster, "/api/v1/nodes") or {}
            return {n["metadata"]["name"]: n for n in nodes.get("items", [])}, None
    except (ClusterError, BootstrapError) as exc:
        return None, exc.message
    except Exception as exc:  # the client's own errors (ApiException, urllib3): the cause, not a verdict
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def remove_nodes(inventory, state, names: list[str], servers: list[str], connect=connect_to_cluster) -> None:
    """Each Node and its node-password secret; `servers` leave etcd first."""
    if not names:
        return
    with connect(inventory, state) as cluster:
        for name in names:
            remove_node(cluster, name, etcd_member=name in servers)


def find_replaced(run: Run) -> None:
    """Marks each host whose machine was re-created under its name (its record's `replaced`,
    `replaced_member` for an etcd member's), and the server to join when the first one was
    (`run.join_via`). Read only. Asked only of a cluster that exists (the state folder has its
    kubeconfig) and only when a host has no k3s: a converged `up` costs no API call."""
    inventory, facts = run.inventory, run.facts
    if not (run.state.path / "kubeconfig").exists() or not any(fresh(facts.get(n.name)) for n in inventory.nodes):
        return
    nodes, error = cluster_nodes(inventory, run.state, run.connect)
    if nodes is None:
        run.console.say("cannot ask the cluster whether a host without k3s replaces one of its machines "
                        f"({printable(error)}); a machine re-created under an old name is refused by k3s until its "
                        "Node is gone: `bootstrap rebuild INVENTORY` removes it")
        return
    names = replaced_machines(inventory, nodes, facts)
    for name in names:
        run.hosts[name].replaced = True
        run.hosts[name].replaced_member = is_server(nodes[name])
    if run.topology.first_server in names:
        # It must join a healthy server, not start a cluster of its own (cluster-init).
        run.join_via = next((s for s in inventory.servers if s.name not in names and s.name in facts
                             and s.name in nodes and node_ready(nodes[s.name])), None)


def clear_replaced(run: Run) -> None:
    names = [name for name, record in run.hosts.items() if record.replaced]
    if not names:
        return
    members = [name for name in names if run.hosts[name].replaced_member]
    remove_nodes(run.inventory, run.state, names, members, run.connect)
    for name in names:
        run.console.say(f"{name}: a new machine under this name: its old Node and node-password secret were "
                        "removed so it can join")


# How long a lost machine's Node may still say Ready: kube-controller-manager's
# --node-monitor-grace-period (40 s, 50 s from Kubernetes 1.32) plus its 5 s monitor period.
NODE_GRACE_S = 60.0


def forget_replaced_keys(inventory, state, names: list[str], console, connect=connect_to_cluster,
                         wait_s: float = NODE_GRACE_S) -> None:
    """`--replace NODE...`: the machines behind these nodes were replaced, so their pinned
    host keys go (the new keys are pinned at first contact), but only for a node the cluster
    says is NotReady or gone: a Ready node's machine is still there, and a changed key then
    means something else answers at its address. A machine lost moments ago still says Ready
    until the node controller's grace period is over: that long is waited for."""
    unknown = [n for n in names if n not in {x.name for x in inventory.nodes}]
    if unknown:
        raise UsageError(f"--replace: no node named {', '.join(unknown)} in {inventory.source}")
    with cluster_lock(state, "replace"):
        # The API through nodes that stay: the replaced machine's key is the one refused.
        others = tuple(n for n in inventory.nodes if n.name not in names)
        through = replace(inventory, nodes=others) if others else inventory
        deadline, said = time.monotonic() + wait_s, False
        while True:
            nodes, why = cluster_nodes(through, state, connect)
            if nodes is None:
                raise UsageError(f"--replace: the cluster did not answer ({why}), so whether "
                                 f"{', '.join(names)} is gone cannot be told",
                                 f"if the machine was replaced, run: bootstrap forget-host {inventory.source} "
                                 + " ".join(names))
            ready = [n for n in names if n in nodes and node_ready(nodes[n])]
            if not ready or time.monotonic() >= deadline:
                break
            if not said:
                said = True
                console.say(f"{', '.join(ready)}: still Ready in the cluster; waiting up to {wait_s:.0f}s for the "
                            "node controller to mark a lost machine NotReady")
            time.sleep(min(3.0, max(0.1, deadline - time.monotonic())))
        if ready:
            raise UsageError(f"--replace: {', '.join(ready)} is Ready in the cluster, so its machine was not replaced; "
                             "nothing was changed",
                             "a changed host key on a node that runs means something else answers at its address: "
                             "check it before you trust it")
        for name in names:
            node = inventory.node(name)
            port = inventory.ssh_for(node).port
            forgot = hostkeys.forget(state.known_hosts, node.address, port)
            console.say(f"{name}: " + ("forgot the pinned host key of the replaced machine; the new one is pinned "
                                       "at first contact" if forgot else "no pinned host key to forget"))
