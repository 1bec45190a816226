"""Kubernetes' naming rules, as the API server and kubelet apply them, and the object names
the tool derives from inventory names.

Pure. Checked when the inventory is read, so a bad label fails `bootstrap check` with its
line instead of failing kubelet's start on a host half-way through `up`.
"""

from __future__ import annotations

import hashlib
import re

from bootstrap.inventory.addresses import DNS_NAME

# apimachinery validation.IsQualifiedName / IsValidLabelValue
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
NAME_MAX = 63
PREFIX_MAX = 253
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# What kubelet may set on its own Node (k3s passes node-label to kubelet as --node-labels):
# kubelet refuses any other key in the kubernetes.io or k8s.io namespaces, or their subdomains.
# From kubernetes/kubernetes staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go
# (kubeletLabels, kubeletLabelNamespaces) and cmd/kubelet/app/options/options.go
# (isKubernetesLabel), at commit 1c7b3d91802c4ada3e6401b1ace80e2d0e8b2a1b.
KUBELET_LABELS = frozenset({
    "kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type",
    "kubernetes.io/os", "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch",
})
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
KUBERNETES_NAMESPACES = ("kubernetes.io", "k8s.io")


def _in_namespace(prefix: str, namespace: str) -> bool:
    return prefix == namespace or prefix.endswith("." + namespace)


def label_key_error(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return f"{key!a}: the prefix before '/' is empty"
    if prefix and (len(prefix) > PREFIX_MAX or not re.fullmatch(DNS_NAME, prefix)):
        return (f"{key!a}: the prefix {prefix!a} must be a lower-case DNS name of at most {PREFIX_MAX} characters")
    if len(name) > NAME_MAX or not re.fullmatch(LABEL_NAME, name):
        return (f"{key!a}: the name {name!a} must be 1-{NAME_MAX} letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit")
    return None


def label_value_error(value: str) -> str | None:
    if value and (len(value) > NAME_MAX or not re.fullmatch(LABEL_NAME, value)):
        return (f"{value!a} is not a label value: at most {NAME_MAX} letters, digits, '-', '_' or '.', "
                "starting and ending with a letter or digit (or empty)")
    return None


def node_label_key_error(key: str) -> str | None:
    """A label key kubelet accepts for its own node."""
    error = label_key_error(key)
    if error:
        return error
    prefix = key.rpartition("/")[0]
    reserved = any(_in_namespace(prefix, ns) for ns in KUBERNETES_NAMESPACES)
    allowed = key in KUBELET_LABELS or any(_in_namespace(prefix, ns) for ns in KUBELET_LABEL_NAMESPACES)
    if reserved and not allowed:
        return (f"{key!a}: kubelet refuses to set labels in the kubernetes.io and k8s.io namespaces on its own "
                "node (only node.kubernetes.io/..., kubelet.kubernetes.io/... and a few well-known keys); "
                "use your own prefix, e.g. example.com/role")
    return None


def parse_taint(text: str) -> tuple[str, str, str] | None:
    """(key, value, effect) of `key[=value]:Effect`; None when it is not of that shape."""
    body, colon, effect = text.rpartition(":")
    if not colon:
        return None
    key, _, value = body.partition("=")
    return key, value, effect


def taint_error(text: str) -> str | None:
    parts = parse_taint(text)
    if parts is None:
        return f"{text!a} is not a taint key[=value]:Effect"
    key, value, effect = parts
    if effect not in TAINT_EFFECTS:
        return f"{text!a}: the effect {effect!a} is not one of {', '.join(TAINT_EFFECTS)}"
    return label_key_error(key) or label_value_error(value)


def derived_name(prefix: str, name: str, limit: int = NAME_MAX) -> str:
    """`prefix + name` cut to `limit` characters without ending in '-' and without two long
    names that share their start ending up as one: a cut name carries a hash of the whole."""
    whole = prefix + name
    if len(whole) <= limit:
        return whole
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return (whole[:limit - len(digest) - 1].rstrip("-.") + "-" + digest)


def nad_name(interface: str) -> str:
    """The NetworkAttachmentDefinition of an RDMA interface: `ib0` -> `rdma-ib0`. Different
    interfaces can map to one name (`ib.0`, `ib_0`, `IB-0`); the inventory check refuses that."""
    return "rdma-" + re.sub(r"[^a-z0-9-]+", "-", interface.lower()).strip("-")
