"""Hosts behind 1:1 NAT, as most clouds rent them: SSH reaches a public address that no
interface of the host holds; the host has only its private address. `up` must give k3s the
private one as node-ip (k3s exits when no interface holds its node IP) and announce the
public one as the node's ExternalIP."""

import json
import re
import subprocess
import time

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts


def nat_inventory(path, hosts, **kwargs):
    """The inventory names each host by its public address only, as a cloud console shows it."""
    return write_inventory(path, hosts, node_extra={h.name: {"address": h.public_address} for h in hosts}, **kwargs)


def test_a_nat_host_is_reached_at_an_address_it_does_not_hold(lab):
    plain, nat = lab.start(["nt-plain", testhosts.HostSpec("nt-nat", nat=True)])
    assert nat.public_address == testhosts.public_address_for(nat.address) != nat.address
    ssh = nat.ssh_command()[:-1] + [f"{testhosts.SSH_USER}@{nat.public_address}", "hostname"]
    assert subprocess.run(ssh, capture_output=True, text=True, timeout=30).stdout.strip() == "nt-nat"
    assert nat.public_address not in nat.ssh("ip -o addr show").stdout  # on no interface
    # Host to host only the private address works, as inside a provider's network.
    probe = "import socket; socket.create_connection(({!r}, 22), 3).close()"
    assert plain.ssh(f"python3 -c {probe.format(nat.address)!r}", check=False).returncode == 0
    assert plain.ssh(f"python3 -c {probe.format(nat.public_address)!r}", check=False).returncode != 0
    lab.cleanup()
    rules = testhosts._iptables("-t", "nat", "-S", "OUTPUT").stdout.decode()
    assert "bslab-nt-nat" not in rules  # cleanup removed the translation


def api_nodes(inventory_path):
    from bootstrap.cluster.client import connect, get
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory_path)
    with connect(inv, StateDir(inv)) as api:
        return {n["metadata"]["name"]: n for n in get(api, "/api/v1/nodes")["items"]}


def api_get(inventory_path, path):
    from bootstrap.cluster.client import connect, get
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory_path)
    with connect(inv, StateDir(inv)) as api:
        return get(api, path)


def state_secret(inventory_path, name):
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    return (StateDir(load_inventory(inventory_path)).path / name).read_text().strip()


def test_up_behind_nat_uses_the_private_address_as_node_ip_and_the_public_one_as_external(lab, tmp_path, airgap):
    hosts = lab.start([testhosts.HostSpec("nat-cp", nat=True), testhosts.HostSpec("nat-a1", nat=True)])
    cp, agent = hosts
    inventory = nat_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)},
                                                                   "validate": {"timeout_s": 60}})
    result = run_bootstrap("up", inventory, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{cp.public_address} is not on this host (a NAT); node-ip {cp.address}" in result.stdout
    config = agent.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
    assert f"node-ip: {agent.address}" in config and f"node-external-ip: {agent.public_address}" in config
    assert f"server: https://{cp.address}:6443" in config  # the agent joins over the private network
    for host in hosts:
        unit = "k3s" if host is cp else "k3s-agent"
        assert host.ssh(f"systemctl is-active {unit}").stdout.strip() == "active"
        assert host.ssh(f"systemctl show -p NRestarts --value {unit}").stdout.strip() == "0"  # no crash loop
    nodes = api_nodes(inventory)
    for host in hosts:
        addresses = {a["type"]: a["address"] for a in nodes[host.name]["status"]["addresses"]}
        assert addresses["InternalIP"] == host.address and addresses["ExternalIP"] == host.public_address
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in nodes[host.name]["status"]["conditions"])
    # The API is advertised on the private address (issue 23, item 11): with only
    # node-external-ip, k3s would put the public one in the `kubernetes` Endpoints and the
    # agents' load balancer, through a NAT that need not let them back in.
    endpoints = api_get(inventory, "/api/v1/namespaces/default/endpoints/kubernetes")
    assert [a["ip"] for s in endpoints["subsets"] for a in s["addresses"]] == [cp.address]
    balancer = agent.ssh("sudo cat /var/lib/rancher/k3s/agent/etc/k3s-agent-load-balancer.json").stdout
    assert json.loads(balancer)["ServerAddresses"] == [f"{cp.address}:6443"]
    # The agent holds the agent token only, in k3s's secure format naming the cluster's CA
    # (issue 23, items 2 and 3); the server token stays on the server.
    server_token, agent_token = state_secret(inventory, "token"), state_secret(inventory, "agent-token")
    ca_hash = state_secret(inventory, "ca-hash")
    assert yaml.safe_load(config)["token"] == f"K10{ca_hash}::node:{agent_token}"
    seen = agent.ssh("sudo cat /etc/rancher/k3s/config.yaml /etc/systemd/system/k3s-agent.service; "
                     "for p in $(pgrep k3s); do sudo cat /proc/$p/cmdline /proc/$p/environ; done", check=False).stdout
    assert agent_token in seen and server_token not in seen  # not in its config, argv or environment
    files = agent.ssh(f"sudo grep -rIl -- {server_token} /etc /var/lib/rancher /var/lib/bootstrap /tmp", check=False)
    assert files.stdout == "", files.stdout  # nor in any file
    assert f"K10{ca_hash}::server:{server_token}" == cp.ssh("sudo cat /var/lib/rancher/k3s/server/token").stdout.strip()
    again = run_bootstrap("up", inventory)
    assert again.returncode == 0 and "hosts: no change" in again.stdout, again.stdout + again.stderr


def test_a_node_ip_the_host_does_not_have_is_refused_before_any_change(lab, tmp_path, airgap):
    hosts = lab.start([testhosts.HostSpec("nip-cp", nat=True)])
    (cp,) = hosts
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}},
                                node_extra={cp.name: {"address": cp.public_address, "node_ip": cp.public_address}})
    result = run_bootstrap("up", inventory, "--hosts-only")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"node_ip {cp.public_address} is not an address of this host (its addresses: eth0 {cp.address}/24)" \
        in result.stdout
    assert "no host was changed" in result.stderr and cp.created_files() == set()
    facts = run_bootstrap("facts", inventory)
    assert re.search(rf"addresses +eth0 {re.escape(cp.address)}/24\n", facts.stdout), facts.stdout


def test_the_stand_in_crash_loops_on_a_node_ip_no_interface_holds(lab, tmp_path, airgap):
    """What k3s does with the old config (node-ip: the public address): it exits, and
    systemd starts it again and again; `up` would wait for it until its time-out."""
    hosts = lab.start([testhosts.HostSpec("loop-cp", nat=True)])
    (cp,) = hosts
    cp.ssh("sudo install -m 0755 /dev/stdin /usr/local/bin/k3s", input=(airgap / "k3s").read_text())
    cp.ssh(f"sudo mkdir -p /etc/rancher/k3s && echo 'node-ip: {cp.public_address}' | "
           "sudo tee /etc/rancher/k3s/config.yaml >/dev/null")
    run = cp.ssh("sudo systemd-run --unit=k3s-loop -p Restart=always -p RestartSec=1 /usr/local/bin/k3s server")
    assert run.returncode == 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        restarts = int(cp.ssh("systemctl show -p NRestarts --value k3s-loop").stdout.strip() or 0)
        if restarts >= 2:
            break
        time.sleep(1)
    assert restarts >= 2
    log = cp.ssh("sudo journalctl -u k3s-loop --no-pager -q").stdout
    assert "failed to find interface with specified node ip" in log
