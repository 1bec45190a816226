"""The stand-in's advertise address (issue 23, item 11): the `kubernetes` Endpoints and the
agents' load balancer list each server's advertise address, which k3s takes from
advertise-address, else node-external-ip, else node-ip (k3s-io/k3s pkg/cli/server/server.go,
pkg/daemons/control/server.go, pkg/agent/tunnel/tunnel.go; k3s-io/k3s#8813). So a NAT'd
server without advertise-address sends in-cluster clients and agents to its public address."""

import json

import pytest
from sandbox import cluster, k3s, wait  # noqa: F401  (fixtures)


def endpoint_addresses(c):
    endpoints = c.core.read_namespaced_endpoints("kubernetes", "default")
    return [a.ip for s in endpoints.subsets or [] for a in s.addresses or []]


@pytest.mark.parametrize("config,advertised", [
    ("node-ip: 127.0.0.1\nnode-external-ip: 203.0.113.7\n", "203.0.113.7"),  # k3s's default: the public one
    ("node-ip: 127.0.0.1\nnode-external-ip: 203.0.113.7\nadvertise-address: 127.0.0.1\n", "127.0.0.1"),
    ("node-ip: 127.0.0.1\n", "127.0.0.1"),
])
def test_the_api_is_advertised_where_k3s_would_advertise_it(cluster, config, advertised):  # noqa: F811
    cluster.server(config)
    wait("the kubernetes Endpoints", lambda: endpoint_addresses(cluster) == [advertised])
    cluster.agent("a1")
    cluster.wait_ready("a1")
    lb = json.loads((cluster.base / "a1/var/lib/rancher/k3s/agent/etc/k3s-agent-load-balancer.json").read_text())
    assert lb["ServerAddresses"] == [f"{advertised}:{cluster.port}"]
