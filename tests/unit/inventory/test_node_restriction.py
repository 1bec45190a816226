"""NodeRestriction stays on: k3s enables it itself (k3s-io/k3s pkg/daemons/control/server.go,
argsMap["enable-admission-plugins"] = "NodeRestriction"), and a kube-apiserver-arg of that name
replaces k3s's value. Without it a kubelet may change any Node, and the
node-restriction.kubernetes.io/ labels that keep untrusted agents apart with it."""

from __future__ import annotations

import pytest

from bootstrap.errors import InvalidInput
from bootstrap.inventory.loader import parse_inventory


def inventory(args: str):
    return parse_inventory(f"""\
cluster: t
k3s: {{server_config: {{kube-apiserver-arg: {args}}}}}
nodes:
  - {{name: cp-1, address: 203.0.113.10, role: server}}
  - {{name: gpu-1, address: 203.0.113.21, trusted: false}}
""", "inv.yaml")


@pytest.mark.parametrize("args, hint", [
    ('["enable-admission-plugins=PodSecurity"]', "enable-admission-plugins=PodSecurity,NodeRestriction"),
    ('"--enable-admission-plugins=AlwaysPullImages,PodSecurity"', "AlwaysPullImages,PodSecurity,NodeRestriction"),
    ('["audit-log-maxage=7", "admission-control=PodSecurity"]', "admission-control=PodSecurity,NodeRestriction"),
    ('["disable-admission-plugins=NodeRestriction"]', "remove NodeRestriction"),
    ('["disable-admission-plugins+=PodSecurity,NodeRestriction"]', "remove NodeRestriction"),
])
def test_an_argument_that_drops_node_restriction_is_refused_where_written(args, hint):
    with pytest.raises(InvalidInput) as caught:
        inventory(args)
    (found,) = caught.value.problems
    assert found.path.startswith("k3s.server_config.kube-apiserver-arg")
    assert "NodeRestriction" in found.message and "a kubelet" in found.message
    assert hint in found.hint


@pytest.mark.parametrize("args", [
    '["enable-admission-plugins=NodeRestriction,PodSecurity"]',
    '["enable-admission-plugins+=PodSecurity"]',  # k3s's append form keeps its own value
    '["disable-admission-plugins=DefaultStorageClass"]',
    '["audit-log-maxage=7"]',
])
def test_arguments_that_keep_node_restriction_are_taken(args):
    inventory(args)
