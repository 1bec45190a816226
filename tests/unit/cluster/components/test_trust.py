"""Untrusted agents (`trusted: false`): the label the tool sets, which a node's own kubelet
cannot set (NodeRestriction), and every release whose ServiceAccount reaches past its node
kept on trusted nodes. The keys exist in the charts' values (test_components' scenarios)."""

import pytest
from test_components import facts_for, inventory, node_labels, releases_by_name

from bootstrap.cluster.checks import pvc_writer
from bootstrap.cluster.components import trust
from bootstrap.errors import UsageError
from bootstrap.inventory.loader import parse_inventory
from bootstrap.topology import gpu_nodes

EVERYTHING = "storage: {default: longhorn, nfs: {server: 10.0.0.5, share: /srv/nfs}}\ngpu: {driver: operator}\n"
UNTRUSTED = "  - {name: g2, address: 10.0.0.3, trusted: false}\n"
SELECTOR = {"node-restriction.kubernetes.io/bootstrap.k3s-trusted": "true"}


def test_the_label_is_one_a_kubelet_may_not_set_on_its_own_node():
    # kubernetes plugin/pkg/admission/noderestriction/admission.go: labels under this prefix
    # are refused to node identities, on create and update alike.
    prefix, name = trust.TRUSTED_LABEL.split("/")
    assert prefix == "node-restriction.kubernetes.io" and len(name) <= 63


def test_every_node_is_labelled_once_one_is_untrusted():
    inv = inventory(EVERYTHING, UNTRUSTED)
    labels = node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))
    assert {n: l[trust.TRUSTED_LABEL] for n, l in labels.items()} == {"cp-1": "true", "g1": "true", "g2": "false"}


def test_all_trusted_changes_nothing():
    inv = inventory(EVERYTHING)
    labels = node_labels(inv, facts_for(inv), gpu_nodes(inv, facts_for(inv)))
    assert not any(trust.TRUSTED_LABEL in l for l in labels.values())
    releases = releases_by_name(inv)
    assert "global" not in releases["longhorn"].values
    assert "systemManagedComponentsNodeSelector" not in releases["longhorn"].values["defaultSettings"]
    assert releases["csi-driver-nfs"].values == {}
    assert "operator" not in releases["gpu-operator"].values
    assert "custom" not in releases["volcano"].values


def test_over_privileged_pods_stay_on_trusted_nodes():
    releases = releases_by_name(inventory(EVERYTHING, UNTRUSTED))
    longhorn = releases["longhorn"].values
    assert longhorn["global"]["nodeSelector"] == SELECTOR  # manager, UI, driver deployer
    assert longhorn["defaultSettings"]["systemManagedComponentsNodeSelector"] == \
        "node-restriction.kubernetes.io/bootstrap.k3s-trusted:true"
    assert longhorn["longhornManager"]["tolerations"]  # the gate's toleration is kept
    assert releases["csi-driver-nfs"].values == {"controller": {"nodeSelector": SELECTOR}}
    operator = releases["gpu-operator"].values
    assert operator["operator"]["nodeSelector"] == SELECTOR
    nfd = operator["node-feature-discovery"]
    assert nfd["master"]["nodeSelector"] == SELECTOR and nfd["gc"]["nodeSelector"] == SELECTOR
    assert nfd["worker"]["tolerations"] and "nodeSelector" not in nfd["worker"]  # the worker labels every GPU node
    assert operator["daemonsets"] == {"tolerations": operator["daemonsets"]["tolerations"]}  # operands: no selector
    assert releases["volcano"].values["custom"] == {"default_ns": SELECTOR}


def test_a_server_cannot_be_untrusted():
    text = "cluster: t\nnodes:\n  - {name: cp-1, address: 10.0.0.1, role: server, trusted: false}\n"
    with pytest.raises(UsageError) as caught:
        parse_inventory(text)
    shown = caught.value.render()
    assert "<inventory>:3:" in shown and "nodes[0].trusted: a server cannot be untrusted" in shown  # line and field


@pytest.mark.parametrize("value", ["no-thanks", 0, "[]"])
def test_trusted_is_a_boolean(value):
    with pytest.raises(UsageError) as caught:
        parse_inventory(f"cluster: t\nnodes:\n  - {{name: cp-1, address: 10.0.0.1, role: server}}\n"
                        f"  - {{name: g1, address: 10.0.0.2, trusted: {value}}}\n")
    assert "<inventory>:4:" in caught.value.render() and "nodes[1].trusted: expected true or false" in caught.value.render()


@pytest.mark.parametrize("storage, pinned", [("longhorn", True), ("nfs", False)])
def test_validates_pvc_writer_goes_where_the_storage_runs(storage, pinned):
    extra = f"storage: {{default: {storage}, nfs: {{server: 10.0.0.5, share: /srv/nfs}}}}\n"
    spec = pvc_writer(inventory(extra, UNTRUSTED))["spec"]
    assert (spec.get("nodeSelector") == SELECTOR) is pinned
    assert "nodeSelector" not in pvc_writer(inventory(extra))["spec"]  # all trusted: anywhere
