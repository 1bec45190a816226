"""validate's NCCL test measures the path it is meant to: each node's node-ip interface
(NCCL_SOCKET_IFNAME) and, with RDMA, the HCAs behind the inventory's RDMA interfaces
(NCCL_IB_HCA), the values printed with the result. Interface and HCA names come from hosts:
checked by the kernel's rules before they reach a pod spec (NVIDIA/nccl#1580, #1581)."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import replace

import pytest
from test_facts_parsers import h200_probe_output

from bootstrap.checks import nccl_ports
from bootstrap.cluster import checks
from bootstrap.cluster.checks import NCCL_SSH_PORT, check_nccl, interface_name_error, nccl_job, nccl_paths
from bootstrap.host.facts.host_facts import InterfaceAddress, RdmaDevice
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.inventory.loader import parse_inventory

H200 = parse_host_facts(h200_probe_output())


def inventory(rdma: str = ""):
    return parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}, "
                           "{name: a, address: 10.0.0.2}, {name: b, address: 10.0.0.3}]\n"
                           "validate: {nccl: {min_busbw_gbps: 100}}\n" + rdma)


def host(address: str, interface: str, rdma=()):
    """A GPU host with docker0 and cni0 besides its node-ip interface: NCCL's own pick could
    be any of them."""
    return replace(H200, addresses=[InterfaceAddress("lo", "127.0.0.1", 8, "host"),
                                    InterfaceAddress("docker0", "172.17.0.1", 16),
                                    InterfaceAddress("cni0", "10.42.1.1", 24),
                                    InterfaceAddress(interface, address, 24)], rdma=list(rdma))


def spec(job, task):
    return next(t for t in job["spec"]["tasks"] if t["name"] == task)["template"]["spec"]


def test_each_nodes_node_ip_interface_is_what_nccl_is_told():
    inv = inventory()
    nodes, facts = [inv.node("a"), inv.node("b")], {"a": host("10.0.0.2", "ens5"), "b": host("10.0.0.3", "enp1s0")}
    path = nccl_paths(inv, nodes, facts)
    assert (path.interfaces, path.problems, path.env()) == ({"a": "ens5", "b": "enp1s0"}, [],
                                                            {"NCCL_SOCKET_IFNAME": "=enp1s0,ens5"})
    job = nccl_job(inv, nodes, facts, path)
    launcher = spec(job, "launcher")["containers"][0]["command"][2]
    assert "-x NCCL_SOCKET_IFNAME==enp1s0,ens5 " in launcher  # '=': exact names (NCCL's env.html)
    assert f"--mca plm_rsh_args '-p {NCCL_SSH_PORT}'" in launcher
    worker = spec(job, "worker")
    assert worker["hostNetwork"] is True and worker["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert worker["containers"][0]["command"][2].endswith(
        f"/usr/sbin/sshd -D -p {NCCL_SSH_PORT} -o ListenAddress=\"$HOST_IP\"")
    assert "NCCL_IB_HCA" not in launcher and "securityContext" not in worker["containers"][0]
    assert path.describe() == "NCCL_SOCKET_IFNAME==enp1s0,ens5 (a: ens5, b: enp1s0)"


def test_with_rdma_the_active_hcas_behind_the_rdma_interfaces_are_named():
    inv = inventory("network: {rdma: {interfaces: [ib0, ib1]}}\n")
    devices = [RdmaDevice("mlx5_0", 1, "InfiniBand", "ACTIVE", ["ib0"]),
               RdmaDevice("mlx5_1", 1, "InfiniBand", "ACTIVE", ["ib1"]),
               RdmaDevice("mlx5_2", 1, "Ethernet", "ACTIVE", ["ens5"]),  # the node's own NIC, not RDMA's
               RdmaDevice("mlx5_3", 1, "InfiniBand", "DOWN", ["ib0"])]
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", "ens5", devices), "b": host("10.0.0.3", "ens5", devices[:1])}
    path = nccl_paths(inv, nodes, facts)
    assert path.hcas == {"a": ["mlx5_0:1", "mlx5_1:1"], "b": ["mlx5_0:1"]}
    assert path.env()["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    job = nccl_job(inv, nodes, facts, path)
    worker = spec(job, "worker")["containers"][0]
    assert worker["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert worker["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert "-x NCCL_IB_HCA==mlx5_0:1,mlx5_1:1 " in spec(job, "launcher")["containers"][0]["command"][2]
    assert "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1 (a: mlx5_0:1 mlx5_1:1, b: mlx5_0:1)" in path.describe()


@pytest.mark.parametrize("name", ["a/b", "eth0:1", "x" * 16, ".", "..", "a b", "eth0\n", "=eth0", "^eth", "eth,1",
                                  "\x1b[2J", "ｅth0", ""])
def test_a_hosts_interface_name_the_kernel_or_nccl_would_not_take_is_refused(name):
    assert interface_name_error(name)
    inv = inventory()
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", name), "b": host("10.0.0.3", "ens5")}
    path = nccl_paths(inv, nodes, facts)
    assert path.interfaces == {"b": "ens5"} and len(path.problems) == 1 and path.problems[0].startswith("a: ")
    result = check_nccl(None, inv, nodes, facts, 10)  # refused before anything is created
    assert result.status == "FAIL" and "cannot tell NCCL which path to measure: a: " in result.reason


@pytest.mark.parametrize("name", ["eth0", "ens5f0np0", "ib0.8001", "enp1s0-v", "a;id", "x" * 15])
def test_names_the_kernel_takes_pass_and_are_quoted_for_the_launchers_shell(name):
    assert interface_name_error(name) is None
    inv = inventory()
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", name), "b": host("10.0.0.3", "ens5")}
    launcher = spec(nccl_job(inv, nodes, facts), "launcher")["containers"][0]["command"][2]
    import shlex

    words = shlex.split(launcher)
    assert words[words.index("NCCL_DEBUG=WARN") + 2] == "NCCL_SOCKET_IFNAME==" + ",".join(sorted([name, "ens5"]))


def test_unknown_addresses_leave_nccl_to_choose_and_say_so():
    inv = inventory()
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", "ens5"), "b": replace(H200, addresses=None)}
    path = nccl_paths(inv, nodes, facts)
    assert path.unknown == ["b"] and path.env() == {} and not path.problems
    worker = spec(nccl_job(inv, nodes, facts, path), "worker")
    assert "hostNetwork" not in worker and worker["containers"][0]["command"][2].endswith("/usr/sbin/sshd -D")
    assert path.describe() == "NCCL_SOCKET_IFNAME not set: the addresses of b are unknown"


def run_worker_command(command: str, tmp_path, host_ip: str) -> tuple[int, list[str]]:
    """The worker's shell line run by /bin/sh with HOST_IP as the downward API sets it, sshd
    and its run directory replaced by a stand-in that records its arguments."""
    args = tmp_path / "args"
    sshd = tmp_path / "sshd"
    sshd.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {args}\n')
    sshd.chmod(0o755)
    line = command.replace("/usr/sbin/sshd", str(sshd)).replace("/var/run/sshd", str(tmp_path / "run"))
    done = subprocess.run(["/bin/sh", "-c", line], env={"HOST_IP": host_ip, "PATH": "/usr/bin:/bin"},
                          capture_output=True, timeout=10, cwd=tmp_path)
    return done.returncode, args.read_text().splitlines() if args.exists() else []


def test_the_workers_sshd_listens_only_on_its_nodes_host_ip(tmp_path):
    """On the host network sshd listens on port 12022 of the node's own address, the pod's
    status.hostIP (the address the launcher dials: a host-network pod's IP is its hostIP),
    never on every address of the host, public ones included."""
    inv = inventory()
    nodes, facts = [inv.node("a"), inv.node("b")], {"a": host("10.0.0.2", "ens5"), "b": host("10.0.0.3", "ens5")}
    container = spec(nccl_job(inv, nodes, facts), "worker")["containers"][0]
    assert container["env"] == [{"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    command = container["command"][2]
    for address in ("10.0.0.2", "fd00:0:0:1::2"):
        assert run_worker_command(command, tmp_path, address) == (
            0, ["-D", "-p", str(NCCL_SSH_PORT), "-o", f"ListenAddress={address}"])
    for hostile in ("", "10.0.0.2 -o ListenAddress=0.0.0.0", "$(touch pwned)", "10.0.0.2;id", "*"):
        (tmp_path / "args").unlink(missing_ok=True)
        assert run_worker_command(command, tmp_path, hostile) == (1, [])  # sshd not started
    assert not (tmp_path / "pwned").exists()


def test_the_chosen_values_are_printed_with_the_result(monkeypatch):
    created = []
    monkeypatch.setattr(checks, "_create", lambda cluster, obj, namespace=None: created.append(obj))
    monkeypatch.setattr(checks, "_pod_outcome", lambda cluster, name, timeout, namespace=None: (
        "Succeeded", "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 181.400 \n", ""))
    inv = inventory()
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", "ens5"), "b": host("10.0.0.3", "enp1s0")}
    result = check_nccl(object(), inv, nodes, facts, 10)
    assert result.status == "PASS" and created
    assert result.reason == ("bus bandwidth 181.4 GB/s across 2 nodes (floor 100) "
                             "[NCCL_SOCKET_IFNAME==enp1s0,ens5 (a: ens5, b: enp1s0)]")


def test_the_host_network_job_is_valid_for_volcano_and_kubernetes():
    import jsonschema
    import kubernetes_validate
    import yaml
    from upstream import upstream

    crd = yaml.safe_load(upstream("volcano/1.15.1/crd/bases/batch.volcano.sh_jobs.yaml").read_text())
    inv = inventory("network: {rdma: {interfaces: [ib0]}}\n")
    nodes = [inv.node("a"), inv.node("b")]
    device = [RdmaDevice("mlx5_0", 1, "InfiniBand", "ACTIVE", ["ib0"])]
    facts = {"a": host("10.0.0.2", "ens5", device), "b": host("10.0.0.3", "ens5", device)}
    job = nccl_job(inv, nodes, facts)
    jsonschema.validate(job, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    for task in job["spec"]["tasks"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": task["template"]["spec"]}
        kubernetes_validate.validate(pod, "1.33", strict=True)


def test_open_mpi_is_pinned_to_the_node_ip_interfaces_and_the_port_block_the_reachability_check_probes():
    """On the host network every port the job uses is one a firewall must let through:
    Open MPI's are pinned (its TCP transport and out-of-band on the node-ip interfaces, in
    nccl_ports' block), and the launcher runs on a measured node, so its ssh to the workers
    leaves from one of them."""
    inv = inventory()
    nodes = [inv.node("a"), inv.node("b")]
    facts = {"a": host("10.0.0.2", "ens5"), "b": host("10.0.0.3", "enp1s0")}
    job = nccl_job(inv, nodes, facts)
    words = shlex.split(spec(job, "launcher")["containers"][0]["command"][2])
    mca = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "--mca"}
    assert mca == {"plm_rsh_no_tree_spawn": "1",  # the workers hold no private key (nccl_ssh)
                   "plm_rsh_args": "-p 12022", "pml": "ob1", "btl": "self,tcp", "coll": "^hcoll",
                   "btl_tcp_if_include": "enp1s0,ens5", "btl_tcp_port_min_v4": "12070", "btl_tcp_port_range_v4": "64",
                   # mpirun itself is in the launcher's pod: the pod network is on its list too
                   "oob_tcp_if_include": "enp1s0,ens5,10.42.0.0/16", "oob_tcp_dynamic_ipv4_ports": "12030-12061"}
    low, high = nccl_ports.PINNED
    assert low <= 12030 and 12061 < 12070 and 12070 + 64 - 1 <= high == 12133 and low == NCCL_SSH_PORT
    placement = spec(job, "launcher")["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # By the Node's name: a kubelet may write its own Node's kubernetes.io/hostname label, so
    # a node claiming "a" as its hostname would have drawn the launcher and its private key.
    assert placement["nodeSelectorTerms"] == [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}]
    # The workers too: a node labelled with the provider (any kubelet may write that label)
    # would have drawn a worker of a pair it is not in, and failed the pair.
    workers = spec(job, "worker")["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert workers == placement
    # Off the host network (an address unknown) nothing is pinned: the pods' own network carries it.
    unknown = {"a": host("10.0.0.2", "ens5"), "b": replace(H200, addresses=None)}
    words = shlex.split(spec(nccl_job(inv, nodes, unknown), "launcher")["containers"][0]["command"][2])
    mca = {words[i + 1]: words[i + 2] for i, w in enumerate(words) if w == "--mca"}
    assert mca == {"plm_rsh_no_tree_spawn": "1"} and "affinity" not in spec(nccl_job(inv, nodes, unknown), "launcher")
