"""Machines at several providers (tests/testhosts.py providers: a router namespace per
provider, private subnets that do not route to each other, each host reachable only at its
1:1-NAT'd public address): `network.mode: public` builds one cluster across them over the
public addresses; private mode is refused with the matrix and the advice to go public; a
provider firewall that drops WireGuard shows in the matrix under that provider's name."""

import os

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts

# The machine's kernel has no WireGuard: the hosts get the module file the facts probe and
# the k3s stand-in look for (tests/standins/k3s_standin.py), as a kernel package installs it
# (under /usr: /lib is a symlink to usr/lib on Debian 12, which a real /lib in the overlay
# would hide).
WIREGUARD_MODULE = f"/usr/lib/modules/{os.uname().release}/kernel/drivers/net/wireguard/wireguard.ko"
REGIONS = {"alpha": "eu-1", "beta": "us-2"}


def spec(name, provider, wireguard=True):
    files = {WIREGUARD_MODULE: ("stand-in module\n", 0o644)} if wireguard else {}
    return testhosts.HostSpec(name, provider=provider, extra_files=files)


def inventory(path, hosts, mode, airgap):
    """Each node by its public address, with its provider and region, as a user writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {h.name: {"address": h.public_address, "provider": h.provider, "region": REGIONS[h.provider]}
             for h in hosts}
    return write_inventory(path, hosts, node_extra=extra, cluster=f"mp-{mode}",
                           extra={"network": {"mode": mode}, "k3s": {"airgap": str(airgap)}})


@pytest.fixture
def providers(lab):
    hosts = lab.start([spec("mp-cp", "alpha"), spec("mp-a1", "alpha"), spec("mp-b1", "beta", wireguard=False)])
    return lab, {h.name: h for h in hosts}


def test_public_mode_builds_one_cluster_across_providers_and_private_mode_is_refused(providers, tmp_path, airgap):
    lab, hosts = providers
    cp, a1, b1 = hosts["mp-cp"], hosts["mp-a1"], hosts["mp-b1"]
    assert b1.address.split(".")[2] != cp.address.split(".")[2]  # two private subnets

    # Private mode: the private addresses do not route between providers.
    private = inventory(tmp_path / "private" / "inv.yaml", list(hosts.values()), "private", airgap)
    refused = run_bootstrap("check", private, "--hosts", timeout=600)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    out = refused.stdout + refused.stderr
    assert "what did not get through" in out and "mp-b1 (beta)" in out, out
    assert "set network.mode: public" in out, out
    assert "k3s" not in cp.ssh("ls /usr/local/bin /etc/rancher 2>/dev/null; true").stdout  # nothing changed

    # Public mode: mp-b1 has no WireGuard module yet, and beta's firewall drops WireGuard.
    public = inventory(tmp_path / "public" / "inv.yaml", list(hosts.values()), "public", airgap)
    block = lab.block("beta", "udp", 51820)
    checked = run_bootstrap("check", public, "--hosts", timeout=600)
    out = checked.stdout + checked.stderr
    assert checked.returncode != 0, out
    assert "mp-b1: wireguard: the WireGuard kernel module is missing" in out, out
    assert "on their public addresses (network.mode public)" in out, out
    matrix = out[out.index("what did not get through"):]
    assert "mp-b1 (beta)" in matrix and "udp/51820" in matrix, out
    assert f"UDP 51820 (flannel WireGuard) on {b1.public_address} is not reachable from mp-cp (alpha)" in out, out
    assert "in beta's firewall (security group)" in out
    assert "tcp/6443" not in matrix and "udp/51820" not in matrix.split("mp-b1 (beta)", 1)[0].splitlines()[-1]
    lab.unblock(block)
    b1.ssh(f"mkdir -p {os.path.dirname(WIREGUARD_MODULE)} && echo module > {WIREGUARD_MODULE}", user="root")

    plan = run_bootstrap("plan", public, timeout=600)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "network: public: nodes talk over their public addresses" in plan.stdout
    assert f"mp-cp -> mp-b1 ({b1.public_address})" in plan.stdout

    up = run_bootstrap("up", public, "--no-validate", timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    for host in hosts.values():
        config = host.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
        assert f"node-ip: {host.address}" in config and f"node-external-ip: {host.public_address}" in config
        if host is not cp:
            assert f"server: https://{cp.public_address}:6443" in config  # across the internet
    server = yaml.safe_load(cp.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout)
    assert server["flannel-backend"] == "wireguard-native" and server["flannel-external-ip"] is True

    from test_daytwo_hosts import api_nodes, ready

    nodes = api_nodes(public)
    for name, host in hosts.items():
        node = nodes[name]
        assert ready(node), node["status"]
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["ExternalIP"] == host.public_address and addresses["InternalIP"] == host.address
        labels = node["metadata"]["labels"]
        assert labels["bootstrap.k3s/provider"] == host.provider
        assert labels["topology.kubernetes.io/region"] == REGIONS[host.provider]
        # flannel's WireGuard peers at the public address (flannel-external-ip).
        annotations = node["metadata"]["annotations"]
        assert annotations.get("flannel.alpha.coreos.com/public-ip-overwrite", annotations.get(
            "flannel.alpha.coreos.com/public-ip")) == host.public_address, annotations

    status = run_bootstrap("status", public, timeout=300)
    assert status.returncode == 0, status.stderr
    assert "provider alpha (eu-1):" in status.stdout and "provider beta (us-2):" in status.stdout
    assert status.stdout.index("provider beta") > status.stdout.index("mp-a1")
    again = run_bootstrap("up", public, "--no-validate", timeout=600)
    assert again.returncode == 0 and "hosts: no change" in again.stdout, again.stdout + again.stderr
