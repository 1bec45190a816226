"""Which nodes may run the pods whose ServiceAccount can do more than a node needs. Pure.

Root on a node reads every ServiceAccount token projected into the pods there. An agent an
inventory marks `trusted: false` (a rented machine) is kept clear of the tool's releases whose
tokens reach past their node: Longhorn (its manager's ClusterRole edits ClusterRoleBindings and
every Node; its system components run under the same account), the GPU Operator's own
controller and NFD's master and garbage collector (patch any Node; the operator creates
DaemonSets), csi-driver-nfs's controller (reads any Secret it is named), Volcano's scheduler,
controllers and admission (bind and create pods anywhere). The README's trust section lists
each DaemonSet and what its account may do, including those that must run on every GPU node
and so cannot be kept off (Multus, whereabouts, the operator's operands).

The selector is a label the tool sets on every node (`true` on trusted ones, `false` on the
others) under `node-restriction.kubernetes.io/`: the NodeRestriction admission plugin, which
k3s enables, refuses a kubelet that adds or changes such a label on its own Node (kubernetes
plugin/pkg/admission/noderestriction/admission.go; k3s-io/k3s pkg/daemons/control/server.go
sets --enable-admission-plugins=NodeRestriction), so a node cannot mark itself trusted. A
label outside that prefix (the operator's nvidia.com/gpu.deploy.*) would not do: a kubelet
may write it on its own Node.
"""

from __future__ import annotations

from bootstrap.inventory.model import Inventory

TRUSTED_LABEL = "node-restriction.kubernetes.io/bootstrap.k3s-trusted"
TRUSTED_ONLY = {TRUSTED_LABEL: "true"}


def untrusted_nodes(inventory: Inventory) -> list[str]:
    return [n.name for n in inventory.nodes if not n.trusted]


def trust_labels(inventory: Inventory) -> dict[str, dict[str, str]]:
    """The label on every node, once any node is untrusted (else none: nothing to select)."""
    if not untrusted_nodes(inventory):
        return {}
    return {n.name: {TRUSTED_LABEL: "true" if n.trusted else "false"} for n in inventory.nodes}


def trusted_selector(inventory: Inventory) -> dict[str, str] | None:
    """A nodeSelector for the pods kept on trusted nodes; None when every node is trusted."""
    return dict(TRUSTED_ONLY) if untrusted_nodes(inventory) else None


def longhorn_selector_setting(inventory: Inventory) -> str | None:
    """Longhorn's systemManagedComponentsNodeSelector setting, `key:value` (values.yaml 1.12.1)."""
    return f"{TRUSTED_LABEL}:true" if untrusted_nodes(inventory) else None
