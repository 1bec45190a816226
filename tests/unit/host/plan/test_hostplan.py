"""Host planning: k3s config keys are real k3s flags, a converged host plans nothing."""

import hashlib
import json
import subprocess
from dataclasses import replace

import pytest
import yaml
from test_facts_parsers import h200_probe_output
from upstream import k3s_flags

from bootstrap.host.release import K3sArtifacts, LocalFile
from bootstrap.host.facts.host_facts import FileState, HostFacts, K3sInstall, SystemdUnit
from bootstrap.host.facts.probe import parse_host_facts
from bootstrap.host.parts.k3s_binary import PATH as K3S_BINARY
from bootstrap.host.parts.k3s_service import CONFIG
from bootstrap.host.parts.kernel import MODULES, SYSCTLS
from bootstrap.host.parts.manifest import MANIFEST, STATE_DIR
from bootstrap.host.parts.packages import HOLD_WHAT_CAME_WITH
from bootstrap.host.plan import desired as d
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.drivers import driver_packages
from bootstrap.host.images import gpu_operator_images
from bootstrap.host.plan.host_plan import after_the_ca, before_the_ca, plan_host
from bootstrap.errors import BootstrapError
from bootstrap.inventory.loader import parse_inventory
from bootstrap.state.secrets import with_secret_values
from bootstrap.host.plan.join_tokens import JoinTokens

TOKENS = JoinTokens("tok", "agent-tok")

INV = parse_inventory("""\
cluster: t
k3s: {version: v1.33.5+k3s1, tls_san: [api.example.com], disable: [traefik], flannel_iface: eth1,
      server_config: {kube-apiserver-arg: ["audit-log-maxage=7"]},
      agent_config: {kubelet-arg: ["max-pods=200"]}}
nodes:
  - {name: cp-1, address: 203.0.113.10, node_ip: 10.0.0.10, role: server}
  - {name: cp-2, address: 203.0.113.11, role: server}
  - {name: cp-3, address: 203.0.113.12, role: server}
  - {name: gpu-1, address: 203.0.113.21, labels: {pool: h200}, taints: ["gpu=true:NoSchedule"]}
registries:
  mirrors: {docker.io: ["https://mirror.example.com"]}
""")

CLUSTER_ID = "0123456789abcdef"


@pytest.mark.parametrize("name", ["cp-1", "cp-2", "gpu-1"])
def test_config_keys_are_real_k3s_flags(name):
    node = INV.node(name)
    config = k3sconfig.node_config(INV, node, TOKENS)
    role = "server" if node.role == "server" else "agent"
    unknown = set(config) - k3s_flags(role)
    assert not unknown, f"not k3s {role} flags: {unknown}"


def test_first_server_inits_etcd_and_the_others_join_it():
    first = k3sconfig.node_config(INV, INV.node("cp-1"), TOKENS)
    second = k3sconfig.node_config(INV, INV.node("cp-2"), TOKENS)
    agent = k3sconfig.node_config(INV, INV.node("gpu-1"), TOKENS)
    assert first["cluster-init"] is True and "server" not in first
    assert second["server"] == agent["server"] == "https://10.0.0.10:6443"  # the private address
    assert "cluster-init" not in second and "cluster-init" not in agent
    assert first["node-ip"] == "10.0.0.10" and first["node-external-ip"] == "203.0.113.10"
    assert {"api.example.com", "203.0.113.10", "10.0.0.10", "203.0.113.12"} <= set(first["tls-san"])
    assert agent["node-label"] == ["pool=h200"] and agent["node-taint"] == ["gpu=true:NoSchedule"]
    assert agent["kubelet-arg"] == ["shutdown-grace-period=30s", "shutdown-grace-period-critical-pods=10s",
                                    "max-pods=200"]
    assert first["kube-apiserver-arg"] == ["default-not-ready-toleration-seconds=10",
                                           "default-unreachable-toleration-seconds=10", "audit-log-maxage=7"]
    assert "kube-apiserver-arg" not in agent and "kube-controller-manager-arg" not in agent
    # Settings k3s requires equal on all servers are equal.
    for key in ("tls-san", "disable", "etcd-snapshot-schedule-cron"):
        assert first[key] == second[key]
    assert "disable" not in agent and "etcd-snapshot-retention" not in agent


def _artifacts(tmp_path):
    binary = tmp_path / "k3s"
    binary.write_bytes(b"k3s")
    return K3sArtifacts("amd64", "v1.33.5+k3s1", binary=LocalFile(binary, hashlib.sha256(b"k3s").hexdigest()))


def converged_facts(want: d.Desired, unit: str) -> HostFacts:
    """Facts of a host that holds exactly what is wanted, as the probe would report it."""
    files = {f.path: FileState(f.mode, f.sha256) for f in want.files}
    return HostFacts(files=files, modules=list(MODULES), sysctls=dict(SYSCTLS),
                     packages={"nvidia-container-toolkit": "1.17.8-1"},
                     held_packages=["nvidia-container-toolkit"],
                     # as `crictl images` names them (full names) once pulled
                     images=("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", "docker.io/library/busybox:1.36",
                             *gpu_operator_images(INV)),
                     k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                    [SystemdUnit(f"{unit}.service", "loaded", "active", "enabled")]))


def test_converged_host_plans_nothing_and_fresh_host_plans_everything(tmp_path):
    node = INV.node("gpu-1")
    want = d.desired_state(INV, node, TOKENS, _artifacts(tmp_path), gpu=True, driver_packages=[])
    fresh = plan_host(node, want, HostFacts(sysctls={"net.ipv4.ip_forward": "0"}, swap_mib=1024), CLUSTER_ID, "lab")
    assert fresh.service == "start" and {u.path for u in fresh.uploads} >= {CONFIG, K3S_BINARY, MANIFEST}
    assert any("apt-get install" in line and "nvidia-container-toolkit" in line for line in fresh.prepare)
    assert any(line.startswith("swapoff") for line in fresh.prepare)
    assert fresh.prepull[:3] == ["nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", "busybox:1.36",
                                 "nvcr.io/nvidia/gpu-operator:v26.7.0"]
    manifest = yaml.safe_load(next(u for u in fresh.uploads if u.path == MANIFEST).content)
    assert manifest["sysctl_before"] == {"net.ipv4.ip_forward": "0"} and manifest["swap_disabled"]
    assert manifest["packages_installed"] == ["nvidia-container-toolkit"]

    facts = converged_facts(want, "k3s-agent")
    first_manifest = next(u for u in fresh.uploads if u.path == MANIFEST)
    facts = replace(facts, manifest=yaml.safe_load(first_manifest.content),
                    files={**facts.files, MANIFEST: FileState(0o644, first_manifest.sha256)})
    noop = plan_host(node, want, facts, CLUSTER_ID, "lab")
    assert not noop.changed, noop.changes


def test_the_toolkits_dependencies_are_held_by_the_install_so_the_next_up_is_a_no_op(tmp_path):
    """NVIDIA's toolkit (1.17) comes as three packages: the install of nvidia-container-toolkit
    brings nvidia-container-toolkit-base and libnvidia-container-tools. The lab's apt
    repository serves that split; the second `up` used to hold the two it had not named,
    every GPU node "changed" on a no-op."""
    node = INV.node("gpu-1")
    want = d.desired_state(INV, node, TOKENS, _artifacts(tmp_path), gpu=True, driver_packages=[])
    fresh = plan_host(node, want, HostFacts(), CLUSTER_ID, "lab")
    installed = next(i for i, line in enumerate(fresh.prepare) if "apt-get install" in line and "toolkit" in line)
    # As the host is after that command: the three installed; held, what its lines hold.
    split = {"nvidia-container-toolkit": "1.17.8-1", "nvidia-container-toolkit-base": "1.17.8-1",
             "libnvidia-container-tools": "1.17.8-1"}
    holds = [line for line in fresh.prepare[installed + 1:] if "apt-mark hold" in line]
    held = sorted(split) if any(HOLD_WHAT_CAME_WITH in line for line in holds) else \
        sorted(p for p in split if any(f" {p} " in line for line in holds))
    first_manifest = next(u for u in fresh.uploads if u.path == MANIFEST)
    facts = replace(converged_facts(want, "k3s-agent"), packages=split, held_packages=held,
                    manifest=yaml.safe_load(first_manifest.content))
    facts = replace(facts, files={**facts.files, MANIFEST: FileState(0o644, first_manifest.sha256)})
    again = plan_host(node, want, facts, CLUSTER_ID, "lab")
    assert not again.changed, again.changes


def test_the_hold_line_holds_only_what_dpkg_has_installed(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dpkg-query").write_text("#!/bin/sh\nprintf 'ii nvidia-container-toolkit-base\\nun libnvidia-container1\\n"
                                     "hi libnvidia-container-tools\\n'\n")
    (fake / "apt-mark").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/held\n")
    for tool in ("dpkg-query", "apt-mark"):
        (fake / tool).chmod(0o755)
    line = HOLD_WHAT_CAME_WITH.replace(STATE_DIR, str(tmp_path / "state"))  # the host's state folder, here
    subprocess.run(["sh", "-ec", line], check=True, env={"PATH": f"{fake}:/usr/bin:/bin"})
    # libnvidia-container-tools was held already (by the host's operator): not claimed as the tool's
    assert (tmp_path / "held").read_text().split() == ["hold", "nvidia-container-toolkit-base"]
    # and what it held is recorded on the host for `down` (bootstrap.host.parts.packages.HELD_ON_HOST)
    assert (tmp_path / "state" / "packages-held.txt").read_text() == "nvidia-container-toolkit-base\n"


def test_config_change_restarts_only_that_host(tmp_path):
    node = INV.node("gpu-1")
    want = d.desired_state(INV, node, TOKENS, _artifacts(tmp_path), gpu=False, driver_packages=[])
    facts = converged_facts(want, "k3s-agent")
    edited = replace(facts, files={**facts.files, CONFIG: FileState(0o600, "0" * 64)})
    plan = plan_host(node, want, edited, CLUSTER_ID, "lab")
    assert plan.service == "restart" and [u.path for u in plan.uploads if u.path != MANIFEST] == [CONFIG]
    assert all(u.secret for u in plan.uploads if u.path == CONFIG)
    stopped = replace(facts, k3s=K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                            [SystemdUnit("k3s-agent.service", "loaded", "inactive", "enabled")]))
    assert plan_host(node, want, stopped, CLUSTER_ID, "lab").service == "start"


def test_secrets_never_appear_in_plan_text(tmp_path):
    node = INV.node("cp-1")
    want = d.desired_state(INV, node, JoinTokens("s3cr3t-token", "s3cr3t-agent-token"), _artifacts(tmp_path), gpu=False, driver_packages=[])
    plan = plan_host(node, want, HostFacts(), CLUSTER_ID, "lab")
    assert "s3cr3t-token" not in "\n".join(plan.changes + plan.prepare)
    assert b"s3cr3t-token" in next(u for u in plan.uploads if u.path == CONFIG).content


@pytest.mark.parametrize("os_id, version, branch, expected", [
    ("ubuntu", "24.04", None, ["nvidia-driver-580-server-open", "linux-modules-nvidia-580-server-open-6.8.0-1-generic"]),
    ("ubuntu", "22.04", "570", ["nvidia-driver-570-server-open", "linux-modules-nvidia-570-server-open-6.8.0-1-generic"]),
    ("debian", "12", None, ["nvidia-driver", "firmware-misc-nonfree", "linux-headers-6.8.0-1-generic"]),
])
def test_host_driver_packages_per_os(os_id, version, branch, expected):
    gpu = f", driver_branch: '{branch}'" if branch else ""
    inv = parse_inventory(f"cluster: t\nnodes: [{{name: a, address: 10.0.0.1, role: server}}]\n"
                          f"gpu: {{driver: host{gpu}}}\n")
    no_driver = replace(parse_host_facts(h200_probe_output()), gpus=[], os_id=os_id, os_version_id=version,
                        kernel="6.8.0-1-generic")
    assert driver_packages(inv, no_driver) == expected
    with_driver = parse_host_facts(h200_probe_output())
    assert driver_packages(inv, with_driver) == []  # a working driver is left alone


def test_replacement_first_server_joins_a_healthy_one_instead_of_starting_a_new_cluster():
    config = k3sconfig.node_config(INV, INV.node("cp-1"), TOKENS, join_via=INV.node("cp-2"))
    assert "cluster-init" not in config and config["server"] == "https://203.0.113.11:6443"
    agent = k3sconfig.node_config(INV, INV.node("gpu-1"), TOKENS, join_via=INV.node("cp-2"))
    assert agent["server"] == "https://203.0.113.11:6443"


def test_snapshots_go_to_s3_with_credentials_from_references(monkeypatch):
    monkeypatch.setenv("S3_KEY", "AKIAEXAMPLE")
    monkeypatch.setenv("S3_SECRET", "s3cr3t")
    inv = parse_inventory("""\
cluster: t
k3s: {snapshots: {retention: 4, s3: {bucket: k3s-snaps, endpoint: s3.example.com, folder: t,
                                       access_key_env: S3_KEY, secret_key_env: S3_SECRET}}}
nodes: [{name: cp-1, address: 10.0.0.1, role: server}, {name: a, address: 10.0.0.2}]
""")
    with pytest.raises(BootstrapError, match="not read before planning"):  # planning reads no environment
        k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS)
    inv = with_secret_values(inv)
    assert "s3cr3t" not in repr(inv)
    server = k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS)
    assert server["etcd-s3"] is True and server["etcd-s3-bucket"] == "k3s-snaps"
    assert server["etcd-s3-access-key"] == "AKIAEXAMPLE" and server["etcd-s3-secret-key"] == "s3cr3t"
    assert set(server) <= k3s_flags("server")
    agent = k3sconfig.node_config(inv, inv.node("a"), TOKENS)
    assert not any(key.startswith("etcd") for key in agent)


def test_gpu_nodes_with_the_hosts_toolkit_make_nvidia_the_default_runtime():
    """A plain pod (and the validation pods, which set no runtimeClassName) gets its GPUs
    only when nvidia is containerd's default runtime: k3s keeps runc the default."""
    from bootstrap.cluster.checks import _pod

    artifacts = K3sArtifacts("amd64", "v1.33.5+k3s1", download_url="https://k3s.example/k3s")
    for driver, wanted in (("preinstalled", "nvidia"), ("host", "nvidia"), ("operator", None)):
        inv = parse_inventory(f"cluster: t\ngpu: {{driver: {driver}}}\nnodes: [{{name: cp, address: 10.0.0.1, "
                              "role: server}, {name: g, address: 10.0.0.2}]\n")
        gpu = d.desired_state(inv, inv.node("g"), TOKENS, artifacts, gpu=True, driver_packages=[])
        cpu = d.desired_state(inv, inv.node("cp"), TOKENS, artifacts, gpu=False, driver_packages=[])
        config = yaml.safe_load(next(f.content for f in gpu.files if f.path == CONFIG))
        assert config.get("default-runtime") == wanted, driver
        assert "default-runtime" not in yaml.safe_load(next(f.content for f in cpu.files if f.path == CONFIG))
    assert "runtimeClassName" not in _pod("gpu-test-g", "g", "img", {"nvidia.com/gpu": 1})["spec"]


def test_ipv6_forwarding_only_for_an_ipv6_pod_network():
    """all.forwarding=1 makes a SLAAC host ignore router advertisements: set only when pods
    have IPv6 addresses; a value an older run set is put back."""
    from bootstrap.host.parts.kernel import IPV6_FORWARDING

    artifacts = K3sArtifacts("amd64", "v1.33.5+k3s1", download_url="https://k3s.example/k3s")
    fresh = HostFacts(sysctls={"net.ipv4.ip_forward": "0", IPV6_FORWARDING: "0"})
    for cidr, wanted in ((None, False), ("10.42.0.0/16", False), ("fd00:42::/56", True)):
        inv = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}]\n"
                              + (f"k3s: {{cluster_cidr: '{cidr}'}}\n" if cidr else ""))
        desired = d.desired_state(inv, inv.node("cp"), TOKENS, artifacts, gpu=False, driver_packages=[])
        sysctl_file = next(f for f in desired.files if f.path.endswith("90-bootstrap-k3s.conf")).content.decode()
        plan = plan_host(inv.node("cp"), desired, fresh, CLUSTER_ID, "t")
        assert (IPV6_FORWARDING in sysctl_file) is wanted, cidr
        assert any(IPV6_FORWARDING in c for c in plan.changes) is wanted, plan.changes
    # an earlier run turned it on (and recorded 0 as before): this one puts 0 back
    earlier = replace(fresh, sysctls={"net.ipv4.ip_forward": "1", IPV6_FORWARDING: "1"},
                      manifest={"sysctl_before": {IPV6_FORWARDING: "0", "net.ipv4.ip_forward": "0"}})
    inv = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}]\n")
    plan = plan_host(inv.node("cp"), d.desired_state(inv, inv.node("cp"), TOKENS, artifacts, gpu=False,
                                                      driver_packages=[]), earlier, CLUSTER_ID, "t")
    assert f"set {IPV6_FORWARDING}=0 back (this cluster does not need it)" in plan.changes
    recorded = json.loads(next(u for u in plan.uploads if u.path == MANIFEST).content)
    assert recorded["sysctl_before"] == {"net.ipv4.ip_forward": "0"}  # what down still puts back


def test_a_joiner_is_enabled_only_with_its_config_so_a_reboot_between_never_starts_a_cluster_of_its_own(tmp_path):
    """A new cluster's joiners are prepared while the first server starts, and get their
    config.yaml (it names the CA's hash) and their start after. A joiner enabled in the first
    pass that rebooted before its config came (a spot VM, a killed host) booted into k3s with
    no config: a server of a cluster of its own, whose join then failed for good ("bootstrap
    data already found and encrypted with different token"; the fault host test found it)."""
    node = INV.node("cp-2")
    want = d.desired_state(INV, node, TOKENS, _artifacts(tmp_path), gpu=False, driver_packages=[])
    fresh = plan_host(node, want, HostFacts(), CLUSTER_ID, "lab")
    enable = "systemctl enable k3s.service 2>/dev/null"
    assert enable in fresh.prepare
    early, late = before_the_ca(fresh), after_the_ca(fresh)
    assert enable not in early.prepare and CONFIG not in {u.path for u in early.uploads} and early.service is None
    assert "systemctl daemon-reload" in early.prepare  # the unit file itself is placed early
    assert late.prepare == [enable] and [u.path for u in late.uploads] == [CONFIG] and late.service == "start"
