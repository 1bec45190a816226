"""A provider firewall between the nodes: `up` (preflight) and `check --hosts` probe every
pair of nodes on the ports k3s needs, on the addresses the cluster uses, before any host
changes, and say which rule to open. iptables rules inside the test hosts play the firewall."""

import re

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts


def drop(host, source, proto, port, target="DROP"):
    extra = " --reject-with tcp-reset" if target == "REJECT" and proto == "tcp" else ""
    host.ssh(f"iptables -A INPUT -s {source.address} -p {proto} --dport {port} -j {target}{extra}", user="root")


def listeners_left(host):
    return [line for line in host.ssh("ss -Hltunp", user="root").stdout.splitlines() if "python3" in line]


def test_dropped_ports_stop_up_before_any_change_and_name_the_rule_to_open(lab, tmp_path, airgap):
    # a2 sits behind NAT: it is probed on its private address, the one k3s will use.
    hosts = lab.start(["rc-cp", "rc-a1", testhosts.HostSpec("rc-a2", nat=True)])
    cp, a1, a2 = hosts
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}},
                                node_extra={a2.name: {"address": a2.public_address}})
    drop(a1, cp, "udp", 8472)  # VXLAN from the server lost
    drop(cp, a2, "tcp", 6443)  # the agent cannot reach the API server
    drop(a2, a1, "tcp", 10250, "REJECT")  # kubelet refused

    check = run_bootstrap("check", inventory, "--hosts")
    assert check.returncode == 1, check.stdout + check.stderr
    out = check.stdout
    assert f"FAIL rc-a1: reachability: UDP 8472 (flannel VXLAN) on {a1.address} is not reachable from rc-cp " \
           "(nothing arrived)" in out
    assert f"fix: open UDP 8472 inbound on rc-a1 from rc-cp ({cp.address}) in the provider's firewall" in out
    assert f"FAIL rc-cp: reachability: TCP 6443 (k3s supervisor and API server) on {cp.address} is not " \
           "reachable from rc-a2 (timed out)" in out
    assert f"FAIL rc-a2: reachability: TCP 10250 (kubelet) on {a2.address} is not reachable from rc-a1 " \
           "(refused)" in out
    assert not [line for line in out.splitlines() if "reachability" in line and a2.public_address in line]
    matrix = out[out.index("what did not get through"):].splitlines()[1:5]
    rows = {line.split()[0]: line.split()[1:] for line in matrix[1:]}
    assert rows["rc-cp"] == ["-", "udp/8472", "ok"] and rows["rc-a2"] == ["tcp/6443", "ok", "-"]
    assert rows["rc-a1"] == ["ok", "-", "tcp/10250"]
    assert "no host was changed" in check.stderr

    up = run_bootstrap("up", inventory, "--hosts-only")
    assert up.returncode == 1 and "UDP 8472 (flannel VXLAN)" in up.stdout and "no host was changed" in up.stderr
    for host in hosts:
        assert host.created_files() == set(), host.created_files()  # the probes wrote nothing
        assert listeners_left(host) == []  # and their listeners are gone

    for host in hosts:
        host.ssh("iptables -F INPUT", user="root")
    up = run_bootstrap("up", inventory, "--hosts-only")
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r"reachability: \d+ probes between 3 nodes on the cluster's addresses: \d+ got through\n",
                     up.stdout), up.stdout
    again = run_bootstrap("up", inventory, "--hosts-only")
    assert again.returncode == 0 and "hosts: no change" in again.stdout
    assert "reachability" not in again.stdout  # a converged cluster is its own evidence: no probe

    # A node joining the running cluster is probed from and to the running nodes' k3s.
    (a3,) = lab.start(["rc-a3"])
    drop(a3, cp, "udp", 8472)
    drop(cp, a3, "tcp", 10250)
    grown = write_inventory(tmp_path / "inv.yaml", hosts + [a3], extra={"k3s": {"airgap": str(airgap)}},
                            node_extra={a2.name: {"address": a2.public_address}})
    join = run_bootstrap("up", grown, "--hosts-only")
    assert join.returncode == 1, join.stdout + join.stderr
    assert f"FAIL rc-a3: reachability: UDP 8472 (flannel VXLAN) on {a3.address} is not reachable from rc-cp" \
        in join.stdout
    assert f"FAIL rc-cp: reachability: TCP 10250 (kubelet) on {cp.address} is not reachable from rc-a3 (timed out)" \
        in join.stdout  # the running k3s answered the others: only rc-a3 is cut off
    assert "rc-a1: reachability" not in join.stdout and a3.created_files() == set()
    a3.ssh("iptables -F INPUT", user="root")
    cp.ssh("iptables -F INPUT", user="root")
    assert run_bootstrap("up", grown, "--hosts-only").returncode == 0


def test_a_link_with_a_lower_mtu_is_an_error_naming_the_pair_and_the_mtu_to_set(lab, tmp_path, airgap):
    """mt-a2's port on the lab bridge carries 1400 bytes while every interface says 1500.
    Pings and the small probes pass; the full-size datagrams with don't-fragment show the
    path's MTU. mt-a2's own 1500-byte frames die on its veth (nothing there fragments: a
    black hole, an error); towards mt-a2 the bridge fragments what lacks don't-fragment
    (the machine's bridge netfilter refragments to the port's MTU, as a router would), so
    those pairs are slower, not broken: a warning."""
    hosts = lab.start(["mt-cp", "mt-a1", "mt-a2"])
    cp, a1, a2 = hosts
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    testhosts._run("ip", "link", "set", a2.veth, "mtu", "1400")
    try:
        check = run_bootstrap("check", inventory, "--hosts")
    finally:
        testhosts._run("ip", "link", "set", a2.veth, "mtu", "1500")
    out = check.stdout
    assert check.returncode == 1, out + check.stderr
    for sender, receiver in ((cp, a2), (a1, a2), (a2, cp), (a2, a1)):
        tag = "FAIL" if sender is a2 else "WARN"
        assert f"{tag} {sender.name}: mtu: path MTU from {sender.name} to {receiver.name} ({receiver.address}): " \
               f"1400 bytes get through with don't-fragment, less than {sender.name}'s eth0 MTU 1500, which flannel " \
               "VXLAN fills (it adds 50 bytes and gives pods 1450)" in out, out
    assert "mt-a2 -> mt-cp: 1400 of 1500 (fragments dropped)" in out and "mt-cp -> mt-a2: 1400 of 1500 (fragmented)" in out
    assert f"fix: set the MTU of {cp.name}'s eth0 (flannel-iface) to 1400 on every node, so pods get 1350" in out
    assert "path MTU: 2 of 6 pairs carry their interface's MTU" in out  # mt-cp <-> mt-a1 is fine
    assert "FAIL mt-cp: reachability" not in out and "no host was changed" in check.stderr

    again = run_bootstrap("check", inventory, "--hosts")  # the link back at 1500: no MTU finding
    assert "path MTU: 6 of 6 pairs carry their interface's MTU" in again.stdout, again.stdout
    assert ": mtu:" not in again.stdout


def test_a_shorter_path_that_fragments_warns_and_one_that_drops_fragments_refuses(lab, tmp_path, airgap):
    """fm-cp's route to fm-a1 carries 1400 bytes (as a path MTU it learned would): its
    don't-fragment datagrams above that never leave, its full-size one without it (as
    flannel's VXLAN sends) goes as fragments and arrives reassembled: a warning, nothing
    stops. With fm-a1 dropping fragments (iptables -f) those packets are lost: an error."""
    hosts = lab.start(["fm-cp", "fm-a1"])
    cp, a1 = hosts
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    cp.ssh(f"ip route add {a1.address}/32 dev eth0 mtu 1400", user="root")
    check = run_bootstrap("check", inventory, "--hosts")
    out = check.stdout
    assert check.returncode == 0, out + check.stderr
    assert f"WARN fm-cp: mtu: path MTU from fm-cp to fm-a1 ({a1.address}): 1400 bytes get through with " \
           "don't-fragment, less than fm-cp's eth0 MTU 1500" in out, out
    assert "flannel VXLAN does not set don't-fragment, so its full-size packets are fragmented on the way and " \
           "arrive reassembled" in out
    assert "fix: set the MTU of fm-cp's eth0 (flannel-iface) to 1400 on every node, so pods get 1350" in out
    assert "path MTU: 1 of 2 pairs carry their interface's MTU; fm-cp -> fm-a1: 1400 of 1500 (fragmented)" in out
    assert "what did not get through" not in out

    # The path drops fragments: fm-a1 drops every non-first fragment as it comes in (in raw's
    # PREROUTING: an INPUT rule would see none, local delivery reassembles before INPUT).
    a1.ssh("iptables -t raw -A PREROUTING -f -j DROP", user="root")
    try:
        dropped = run_bootstrap("check", inventory, "--hosts")
    finally:
        a1.ssh("iptables -t raw -F PREROUTING", user="root")
    out = dropped.stdout
    assert dropped.returncode == 1, out + dropped.stderr
    assert f"FAIL fm-cp: mtu: path MTU from fm-cp to fm-a1 ({a1.address}): 1400 bytes get through" in out, out
    assert "did not arrive either (the path neither carries nor fragments it, or drops the fragments): full-size " \
           "packets between pods would be lost" in out
    assert "fm-cp -> fm-a1: 1400 of 1500 (fragments dropped)" in out and "mtu1400" in out
    assert "FAIL fm-a1" not in out  # fm-a1 -> fm-cp carries its full size


def test_validate_nccl_needs_its_port_block_and_the_ephemeral_range_between_the_gpu_nodes(lab, tmp_path, airgap):
    """With validate.nccl the GPU nodes must reach each other on the NCCL job's pinned block
    (sshd and Open MPI) and on the kernel's ephemeral ports (NCCL's own sockets): a firewall
    that lets only k3s's ports through is named before any change, with the range to open.
    The server takes no part in NCCL: nothing of it is probed to or from nc-cp."""
    hosts = lab.start(["nc-cp", "nc-g1", "nc-g2"], gpu=["nc-g1", "nc-g2"])
    cp, g1, g2 = hosts
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
        "k3s": {"airgap": str(airgap)}, "validate": {"nccl": {"min_busbw_gbps": 10}}})
    drop(g2, g1, "tcp", 12133)  # the top of Open MPI's block: only sshd's 12022 was opened
    # No ephemeral ports from g2, as a stateful provider firewall: replies to g1's own
    # connections (from an ephemeral port of its own) still come back.
    g1.ssh(f"iptables -A INPUT -s {g2.address} -p tcp --dport 32768:60999 -m conntrack --ctstate NEW -j DROP",
           user="root")
    check = run_bootstrap("check", inventory, "--hosts")
    out = check.stdout
    assert check.returncode == 1, out + check.stderr
    assert f"FAIL nc-g2: reachability: TCP 12133 (validate.nccl: sshd and Open MPI, TCP 12022-12133) on " \
           f"{g2.address} is not reachable from nc-g1 (timed out)" in out, out
    assert f"fix: open TCP 12022-12133 inbound on nc-g2 from nc-g1 ({g1.address})" in out
    for port in (32768, 60999):  # both ends of the range
        assert f"FAIL nc-g1: reachability: TCP {port} (validate.nccl: NCCL's sockets, the kernel's ephemeral " \
               f"TCP 32768-60999) on {g1.address} is not reachable from nc-g2 (timed out)" in out, out
    assert f"fix: open TCP 32768-60999 inbound on nc-g1 from nc-g2 ({g2.address})" in out
    assert len([line for line in out.splitlines() if ": reachability:" in line]) == 3, out  # nothing else
    assert "no host was changed" in check.stderr
    for host in hosts:
        host.ssh("iptables -F INPUT", user="root")
    again = run_bootstrap("check", inventory, "--hosts")
    assert ": reachability:" not in again.stdout, again.stdout
