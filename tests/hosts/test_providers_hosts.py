"""Hosts rented at different providers, as on GPU clouds: each provider has its own private
network behind a router that does 1:1 NAT; providers share no private network, so across
providers (and from this machine, the operator's laptop) only public addresses work, and a
provider firewall (Lab.block) can drop what comes from outside the provider."""

import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import testhosts

pytestmark = pytest.mark.hosts

UDP_LISTENER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
with open(sys.argv[2], "a", buffering=1) as log:
    log.write("ready\\n")
    while True:
        data, peer = s.recvfrom(2048)
        log.write(f"{peer[0]} {data.decode()}\\n")
"""


def tcp_ok(src, address, port=22):
    probe = f"import socket; socket.create_connection(({address!r}, {port}), 2).close()"
    return src.ssh(f"python3 -c {probe!r}", check=False).returncode == 0


def udp_send(src, address, port, payload):
    code = (f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto({payload!r}.encode(), ({address!r}, {port}))")
    src.ssh(f"python3 -c {code!r}")


class UdpListener:
    """python3 on the receiver, as a transient unit, logging 'sender payload' per datagram."""

    def __init__(self, host, port):
        self.host, self.port, self.log = host, port, f"/tmp/udp-{port}.log"
        self.unit = f"pv-udp-{port}"
        host.ssh(f"cat > /tmp/udp-listen.py && rm -f {self.log}", input=UDP_LISTENER)
        host.ssh(f"sudo systemd-run --quiet --unit={self.unit} python3 /tmp/udp-listen.py {port} {self.log}")
        assert self.wait_for("ready") is not None, f"no UDP listener on {host.name}"

    def lines(self):
        return self.host.ssh(f"cat {self.log} 2>/dev/null", check=False).stdout.splitlines()

    def sender(self, payload):
        """Who sent payload (None: it has not arrived)."""
        for line in self.lines():
            if line.endswith(" " + payload):
                return line.split()[0]
        return None

    def wait_for(self, payload, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if payload == "ready" and "ready" in self.lines():
                return "ready"
            sender = self.sender(payload)
            if sender:
                return sender
            time.sleep(0.2)
        return None

    def stop(self):
        self.host.ssh(f"sudo systemctl stop {self.unit}", check=False)


def laptop_tcp_ok(address, port=22, timeout=2):
    try:
        socket.create_connection((address, port), timeout).close()
        return True
    except OSError:
        return False


def router_rules(prov, table, chain):
    out = testhosts._ns_iptables(prov.netns, "-t", table, "-S", chain).stdout.decode()
    return [line for line in out.splitlines() if line.startswith("-A ")]


def root_routes():
    return subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout


def test_providers_share_no_private_network_and_meet_at_public_addresses(lab):
    tag = f"p{os.getpid() % 100000}"
    # A crashed run left a router namespace, an uplink and a provider state behind.
    stale = testhosts.Provider("zzstale", testhosts.MAX_PROVIDERS)
    subprocess.run(["ip", "netns", "add", stale.netns], check=True)
    subprocess.run(["ip", "link", "add", stale.uplink_veth, "type", "veth", "peer", "name", f"{tag}x"], check=True)
    testhosts._providers_dir().mkdir(parents=True, exist_ok=True)
    (testhosts._providers_dir() / "zzstale.json").write_text('{"name": "zzstale", "number": 200}')

    spec = testhosts.HostSpec
    a1, a2, b1, b2, plain = lab.start([spec(f"{tag}-a1", provider="alpha"), spec(f"{tag}-a2", provider="alpha"),
                                       spec(f"{tag}-b1", provider="beta"), spec(f"{tag}-b2", provider="beta"),
                                       f"{tag}-plain"])
    print("boot to SSH: " + ", ".join(f"{h.name} {h.boot_seconds:.1f}s" for h in (a1, a2, b1, b2, plain)))
    assert not Path("/run/netns", stale.netns).exists() and not Path("/sys/class/net", stale.uplink_veth).exists()
    assert not (testhosts._providers_dir() / "zzstale.json").exists()

    alpha, beta = testhosts.provider("alpha"), testhosts.provider("beta")
    assert alpha.number != beta.number
    for host, prov in ((a1, alpha), (a2, alpha), (b1, beta), (b2, beta)):
        assert host.provider == prov.name
        assert ipaddress.ip_address(host.address) in prov.private_network
        assert host.public_address == prov.public_address_for(host.address)
        assert ipaddress.ip_address(host.public_address) in prov.public_network
        loaded = testhosts.TestHost.load(host.name)  # state.json keeps both
        assert (loaded.provider, loaded.public_address, loaded.address) == (prov.name, host.public_address,
                                                                            host.address)
        assert f"inet {host.address}/24 " in host.ssh("ip -4 -o addr show dev eth0").stdout
        assert host.public_address not in host.ssh("ip -o addr show").stdout  # on no interface of the host
        assert host.ssh("hostname").stdout.strip() == host.name  # the back door
    assert {h.name: h.provider for h in testhosts.known_hosts() if h.name.startswith(tag)} == {
        a1.name: "alpha", a2.name: "alpha", b1.name: "beta", b2.name: "beta", plain.name: None}
    assert plain.provider is None and plain.address.startswith("10.200.0.")  # the lab bridge, as before

    # This machine (the operator's laptop) reaches each host's public SSH, the tool's way (its
    # default source address), and has no route to any private address.
    for host in (a1, a2, b1, b2):
        assert laptop_tcp_ok(host.public_address), host.name
        ssh = host.ssh_command()
        ssh = ssh[:ssh.index("-b")] + [f"{testhosts.SSH_USER}@{host.public_address}", "hostname"]
        assert subprocess.run(ssh, capture_output=True, text=True, timeout=30).stdout.strip() == host.name
        route = subprocess.run(["ip", "route", "get", host.address], capture_output=True, text=True).stdout
        assert "bslab" not in route, route

    # Within a provider: the private network; across providers: public addresses only.
    assert tcp_ok(a1, a2.address) and tcp_ok(b2, b1.address)
    assert not tcp_ok(a1, b1.address) and not tcp_ok(b1, a2.address)
    assert tcp_ok(a1, b1.public_address) and tcp_ok(b2, a1.public_address)
    assert tcp_ok(a1, a2.public_address)  # hairpin
    assert not tcp_ok(a1, plain.address)  # the lab bridge is no provider's network

    # UDP, with the sender the receiver sees: across providers and hairpin, the sender's public
    # address, within the private network its private one.
    at_b1, at_a2 = UdpListener(b1, 51820), UdpListener(a2, 51820)
    try:
        udp_send(a1, b1.public_address, 51820, "alpha-to-beta")
        assert at_b1.wait_for("alpha-to-beta") == a1.public_address
        udp_send(a1, a2.public_address, 51820, "hairpin")
        assert at_a2.wait_for("hairpin") == a1.public_address
        udp_send(a1, a2.address, 51820, "private")
        assert at_a2.wait_for("private") == a1.address
        udp_send(a1, b1.address, 51820, "cross-private")  # no route: never arrives

        # The provider firewall: from outside beta dropped, within beta not.
        block = lab.block("beta", "udp", 51820)
        assert block.provider == "beta" and block in lab.blocks
        udp_send(a1, b1.public_address, 51820, "blocked-from-alpha")
        udp_send(b2, b1.public_address, 51820, "within-beta-public")
        udp_send(b2, b1.address, 51820, "within-beta-private")
        assert at_b1.wait_for("within-beta-public") == b2.public_address
        assert at_b1.wait_for("within-beta-private") == b2.address
        time.sleep(0.5)
        assert at_b1.sender("blocked-from-alpha") is None and at_b1.sender("cross-private") is None
        assert tcp_ok(a1, b1.public_address)  # only udp/51820 is blocked
        lab.unblock(block)
        assert block not in lab.blocks
        udp_send(a1, b1.public_address, 51820, "unblocked")
        assert at_b1.wait_for("unblocked") == a1.public_address
    finally:
        at_b1.stop()
        at_a2.stop()
    assert "active" != b1.ssh("systemctl is-active pv-udp-51820", check=False).stdout.strip()

    # Providers' hosts reach this machine (the internet) from their public addresses.
    for bind in (testhosts.INET_GATEWAY, testhosts.GATEWAY):
        with socket.socket() as server:
            server.bind((bind, 0))
            server.listen(1)
            server.settimeout(10)
            assert tcp_ok(b2, bind, server.getsockname()[1])
            conn, peer = server.accept()
            conn.close()
            assert peer[0] == b2.public_address

    # A blocked SSH port: shut for this machine and other providers, open within the provider
    # and for the back door.
    lab.block("alpha", "tcp", 22)
    assert not laptop_tcp_ok(a1.public_address, timeout=1)
    assert not tcp_ok(b1, a1.public_address)
    assert tcp_ok(a2, a1.public_address)
    assert a1.ssh("hostname").stdout.strip() == a1.name
    assert a1.host_key().startswith("ssh-ed25519 ")

    # Leftovers in a router that stays: a crashed host's NAT rule, a dead process's block.
    ghost = ("PREROUTING", "-d", "10.202.250.250/32", "-m", "comment", "--comment", "bslab-ghost",
             "-j", "DNAT", "--to-destination", "10.201.250.250")
    dead = ("FORWARD", "-i", "uplink", "-p", "udp", "-m", "udp", "--dport", "9",
            "-m", "comment", "--comment", f"{testhosts.BLOCK_COMMENT}999999999:1", "-j", "DROP")
    testhosts._ns_iptables(alpha.netns, "-t", "nat", "-A", *ghost)
    testhosts._ns_iptables(alpha.netns, "-A", *dead)
    with testhosts._locked(testhosts.LAB_DIR / ".hosts.lock"):
        testhosts._prune_providers()
    nat = "\n".join(router_rules(alpha, "nat", "PREROUTING") + router_rules(alpha, "nat", "POSTROUTING"))
    forward = "\n".join(router_rules(alpha, "filter", "FORWARD"))
    assert "bslab-ghost" not in nat and "999999999" not in forward
    assert f"bslab-{a1.name}" in nat and f"bslab-{a2.name}" in nat and "--dport 22" in forward

    # Spot loss and a re-created machine keep the provider's network.
    b2.kill()
    assert not tcp_ok(a1, b2.public_address) and not laptop_tcp_ok(b2.public_address, timeout=1)
    b2.restart()
    assert tcp_ok(a1, b2.public_address) and tcp_ok(b2, b1.address)
    old_key = a2.host_key()
    a2.recreate()
    assert a2.host_key() != old_key  # (alpha's tcp/22 is still blocked from outside)
    assert tcp_ok(a1, a2.public_address) and tcp_ok(a2, a1.address) and tcp_ok(a2, b1.public_address)

    hosts = (a1, a2, b1, b2, plain)
    lab.cleanup()
    assert not [h.netns for h in hosts if Path("/run/netns", h.netns).exists()]
    assert not [p for p in Path("/run/netns").glob(testhosts.ROUTER_NETNS_PREFIX + "*")]
    assert not [p for p in Path("/sys/class/net").glob(testhosts.UPLINK_PREFIX + "*")]
    assert not [h.name for h in hosts if h.dir.exists()]
    assert testhosts._saved_providers() == {}
    assert not Path("/sys/class/net", testhosts.INET_BRIDGE).exists()
    routes = root_routes()
    assert "bslab-inet" not in routes and "10.202." not in routes and "10.201." not in routes, routes
    rules = testhosts._iptables("-t", "nat", "-S").stdout.decode()
    assert tag not in rules
    lab.cleanup()  # idempotent


CRASHING_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import testhosts
lab = testhosts.Lab()
lab.start([testhosts.HostSpec({name!r}, provider="gamma")])
lab.block("gamma", "tcp", 22)
os.kill(os.getpid(), signal.SIGKILL)  # no cleanup
"""


def test_what_a_crashed_run_left_at_a_provider_goes(lab):
    tag = f"c{os.getpid() % 100000}"
    tests = str(Path(testhosts.__file__).parent)
    crashed = subprocess.run([sys.executable, "-c", CRASHING_RUN.format(tests=tests, name=f"{tag}-old")],
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == -9, crashed.stderr
    gamma = testhosts.provider("gamma")
    assert Path("/run/netns", gamma.netns).exists()  # the crash left the router, its rules and routes
    assert "--dport 22" in "\n".join(router_rules(gamma, "filter", "FORWARD"))

    (new,) = lab.start([testhosts.HostSpec(f"{tag}-new", provider="gamma")])
    assert not Path("/run/netns", f"bslab-{tag}-old").exists()
    rules = "\n".join(router_rules(gamma, "nat", "PREROUTING") + router_rules(gamma, "filter", "FORWARD"))
    assert f"bslab-{tag}-old" not in rules and "--dport 22" not in rules and f"bslab-{new.name}" in rules
    assert laptop_tcp_ok(new.public_address)
    lab.cleanup()
    assert not Path("/run/netns", gamma.netns).exists() and not Path("/sys/class/net", gamma.uplink_veth).exists()
    assert str(gamma.public_network) not in root_routes()


def test_provider_specs_are_checked(lab):
    with pytest.raises(testhosts.LabError, match="bad provider name"):
        lab.start([testhosts.HostSpec("pv-bad", provider="Alpha")])
    with pytest.raises(testhosts.LabError, match="nat and provider"):
        lab.start([testhosts.HostSpec("pv-bad", provider="alpha", nat=True)])
    with pytest.raises(testhosts.LabError, match="no provider"):
        lab.block("nosuch", "udp", 51820)
    assert not (testhosts.LAB_DIR / "hosts" / "pv-bad").exists()
