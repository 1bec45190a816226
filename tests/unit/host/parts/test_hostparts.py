"""The host parts: each path, unit and setting has one owner, and the probe, the plan and
`down` all read it from there."""

import fnmatch
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from bootstrap.host.release import k3s_artifacts, online_artifacts
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.host.facts.probe import PROBE_SCRIPT, probe_script
from bootstrap.host.parts import k3s_binary, k3s_images, k3s_service, kernel, manifest, packages, registries
from bootstrap.host.parts.base import Action
from bootstrap.host.parts.paths import FIXED, managed_paths
from bootstrap.host.plan import desired as d
from bootstrap.host.plan.host_plan import plan_host
from bootstrap.host.plan.rollout import plan_rollout
from bootstrap.inventory.loader import parse_inventory
from bootstrap.inventory.model import Component, Role
from bootstrap.host.teardown import ALWAYS_REMOVED, teardown_script
from bootstrap import templates
from bootstrap.host.plan.join_tokens import JoinTokens

TOKENS = JoinTokens("tok", "agent-tok")

ALL_PARTS = (*FIXED, k3s_images)

INV = parse_inventory("""\
cluster: t
k3s: {version: v1.33.5+k3s1}
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: gpu-1, address: 10.0.0.2}
registries:
  mirrors: {docker.io: ["https://mirror.example.com"]}
storage: {default: nfs, nfs: {server: 10.0.0.5, share: /x}}
""")


def airgap_inventory(tmp_path: Path):
    folder = tmp_path / "air"
    folder.mkdir()
    (folder / "k3s").write_bytes(b"k3s")
    (folder / "k3s-airgap-images-amd64.tar.zst").write_bytes(b"images")
    (folder / "k3s-airgap-images-arm64.tar.zst").write_bytes(b"other arch")
    return parse_inventory(f"""\
cluster: a
k3s: {{airgap: {folder}}}
nodes:
  - {{name: cp-1, address: 10.0.0.1, role: server}}
  - {{name: gpu-1, address: 10.0.0.2}}
""")


def fresh_plan(inventory, node_name: str, gpu: bool, artifacts):
    node = inventory.node(node_name)
    want = d.desired_state(inventory, node, TOKENS, artifacts, gpu=gpu, driver_packages=[])
    return want, plan_host(node, want, HostFacts(arch="amd64", swap_mib=1024), "0123456789abcdef", inventory.cluster)


def test_every_managed_path_has_exactly_one_owner(tmp_path):
    owners = {}
    for part in FIXED:
        for path in part.PATHS:
            owners.setdefault(path, []).append(part.__name__)
    shared = {path: names for path, names in owners.items() if len(names) > 1}
    assert not shared
    inventory = airgap_inventory(tmp_path)
    archives = k3s_images.paths(inventory)
    assert archives and not archives & set(owners)
    assert managed_paths(inventory) == sorted(set(owners) | archives)
    assert managed_paths(INV) == sorted(set(owners) | {k3s_images.PULLS_REQUESTED})  # no air-gap folder: no archives


def test_every_file_a_plan_places_is_a_managed_path(tmp_path):
    """The probe hashes exactly what a plan may write, or a converged host would not plan nothing."""
    for inventory, artifacts in ((INV, online_artifacts("v1.33.5+k3s1", "amd64")),
                                 (airgap := airgap_inventory(tmp_path), k3s_artifacts(airgap, {"amd64"})["amd64"])):
        for name, gpu in (("cp-1", False), ("gpu-1", True)):
            want, plan = fresh_plan(inventory, name, gpu, artifacts)
            written = {u.path for u in plan.uploads}
            assert written >= set(want.paths()) | {manifest.MANIFEST}
            assert written <= set(managed_paths(inventory))


def test_the_probe_asks_for_exactly_the_units_the_service_part_declares():
    shown = re.search(r"systemctl show -p Id -p LoadState -p ActiveState -p UnitFileState (.*)", PROBE_SCRIPT)[1]
    assert shown.split() == [f"{u}.service" for u in k3s_service.UNITS.values()]
    assert set(k3s_service.UNITS) == set(Role)


def test_the_probe_reads_the_parts_paths_and_settings():
    for path in (k3s_service.CONFIG, k3s_service.CONTAINERD_CONFIG, k3s_service.CONTAINERD_SOCKET, manifest.MANIFEST):
        assert path in PROBE_SCRIPT
    sysctl_loop = re.search(r"for k in (.*); do f=/proc/sys", PROBE_SCRIPT)[1]
    assert sysctl_loop.split() == list(kernel.SYSCTLS)
    modules = re.search(r"^p_modules\(\) \{\n(.*?)^\}", PROBE_SCRIPT, re.S | re.M)[1]
    assert re.findall(r"&& echo (\S+)", modules) == list(kernel.MODULES)
    globs = re.search(r"dpkg-query -W -f='[^']*' (.*) 2>/dev/null", PROBE_SCRIPT)[1]
    assert shlex.split(globs) == list(packages.PROBE_GLOBS)
    assert "@@" not in PROBE_SCRIPT.replace("@@bootstrap-probe@@", "")  # every placeholder filled


def test_the_probe_hashes_the_managed_paths_in_its_one_script():
    script = probe_script(managed_paths(INV))
    assert script.startswith(f"BOOTSTRAP_FILES='{' '.join(managed_paths(INV))}'\n")
    assert script.count("probe()") == 1  # one script, one round trip


def test_the_probe_reports_every_package_the_plan_may_install():
    wanted = set(packages.COMPONENT_PACKAGES) | {packages.TOOLKIT, "nvidia-driver-580-server-open",
                                                  "libnvidia-compute-580", "cuda-drivers-580", "linux-headers-6.8.0"}
    for name in wanted:
        assert any(fnmatch.fnmatchcase(name, glob) for glob in packages.PROBE_GLOBS), name
    for prefix in packages.HOLD_PREFIXES:
        assert f"{prefix}*" in packages.PROBE_GLOBS


def test_the_kernel_files_carry_exactly_the_kernel_part_settings():
    modules, sysctls = kernel.files(kernel.sysctls(ipv6_pods=True))
    assert [line for line in modules.content.decode().splitlines() if not line.startswith("#")] == list(kernel.MODULES)
    settings = dict(line.split(" = ") for line in sysctls.content.decode().splitlines() if " = " in line)
    assert settings == kernel.SYSCTLS
    # The unit loads the same modules before k3s starts.
    unit = templates.render("host/k3s.service.j2", cluster="c", mode="server", binary=k3s_binary.PATH)
    assert re.findall(r"ExecStartPre=-/sbin/modprobe (\S+)", unit) == list(kernel.MODULES)


def removed_by(script: str):
    files, dirs = set(), []
    for line in script.splitlines():
        if line.startswith("rm -f "):
            files |= set(shlex.split(line)[2:])
        elif line.startswith("rm -rf "):
            dirs += shlex.split(line)[2:]
        elif folders := re.match(r'for d in (.*?); do .*rm -rf "\$d"', line):  # k3s's, mount-aware
            dirs += folders[1].split()
    return lambda path: path in files or any(path.startswith(f"{folder}/") for folder in dirs)


def test_teardown_removes_every_file_a_plan_writes(tmp_path):
    inventory = airgap_inventory(tmp_path)
    artifacts = k3s_artifacts(inventory, {"amd64"})["amd64"]
    for name, gpu in (("cp-1", False), ("gpu-1", True)):
        _, plan = fresh_plan(inventory, name, gpu, artifacts)
        recorded = json.loads(plan.uploads[0].content)
        gone = removed_by(teardown_script(recorded, purge_drivers=False))
        left = [u.path for u in plan.uploads if not gone(u.path)]
        assert not left
        assert all(gone(p) for p in ALWAYS_REMOVED + (k3s_service.KUBECONFIG, k3s_service.CONTAINERD_CONFIG))


def test_teardown_removes_unit_and_binary_even_when_no_manifest_lists_them():
    gone = removed_by(teardown_script({}, purge_drivers=False))
    assert all(gone(p) for p in (k3s_binary.PATH, *k3s_service.UNIT_PATHS))
    assert gone(manifest.MANIFEST)


def test_teardown_stops_the_units_and_processes_the_service_part_names():
    script = teardown_script({}, purge_drivers=False)
    assert f"for u in {' '.join(u + '.service' for u in k3s_service.UNITS.values())}; do systemctl stop" in script
    assert f"-v names='^({'|'.join(k3s_service.PROCESSES)})$'" in script
    gone = removed_by(script)
    assert all(gone(f"{folder}/x") for folder in k3s_service.DATA_DIRS)


def test_a_kept_driver_keeps_the_manifest_that_lists_it():
    recorded = {"packages_installed": ["nvidia-driver-580", "nfs-common"], "packages_held": ["nvidia-driver-580"]}
    script = teardown_script(recorded, purge_drivers=False)
    assert f"rm -rf {manifest.STATE_DIR}" not in script
    # written to a temp next to it and renamed over it (bootstrap.host.parts.placing.write_text)
    kept = re.search(r"printf '%s\\n' (.*) > \"\$t\" .* mv -fT \"\$t\" " + re.escape(manifest.MANIFEST), script)[1]
    assert json.loads(shlex.split(kept)[0]) == {"packages_held": ["nvidia-driver-580"],
                                                "packages_installed": ["nvidia-driver-580"]}
    assert f"rm -rf {manifest.STATE_DIR}" in teardown_script(recorded, purge_drivers=True)


def test_plans_carry_typed_actions():
    artifacts = online_artifacts("v1.33.5+k3s1", "amd64")
    _, plan = fresh_plan(INV, "gpu-1", True, artifacts)
    assert {Action.REPLACE_BINARY, Action.PLACE_FILES, Action.TURN_OFF_SWAP, Action.LOAD_MODULES,
            Action.SET_SYSCTLS, Action.INSTALL_PACKAGES, Action.INSTALL_TOOLKIT, Action.HOLD_PACKAGES,
            Action.ENABLE_UNIT, Action.WRITE_MANIFEST, Action.PULL_IMAGES} <= plan.actions
    assert plan.replaces_binary


def running_facts(node, version: str) -> HostFacts:
    unit = k3s_service.unit_name(node.role)
    return HostFacts(arch="amd64", k3s=K3sInstall(k3s_binary.PATH, version, True,
                                                  [SystemdUnit(f"{unit}.service", "loaded", "active", "enabled")]))


def test_the_rollout_reads_the_actions_not_the_text():
    facts = {n.name: running_facts(n, "v1.33.5+k3s1") for n in INV.nodes}
    artifacts = online_artifacts("v1.34.1+k3s1", "amd64")
    plans = {}
    for node in INV.nodes:
        want = d.desired_state(INV, node, TOKENS, artifacts, gpu=False, driver_packages=[])
        plans[node.name] = replace(plan_host(node, want, facts[node.name], "0123456789abcdef", "t"), changes=[])
    rollout = plan_rollout(INV, facts, plans, "v1.34.1+k3s1")
    assert rollout.servers == ["cp-1"] and rollout.agent_batches == [["gpu-1"]]
    # The same release already installed: no download, so nothing to roll.
    same = {n.name: plan_host(n, d.desired_state(INV, n, TOKENS, online_artifacts("v1.33.5+k3s1", "amd64"),
                                                 gpu=False, driver_packages=[]), facts[n.name], "id", "t")
            for n in INV.nodes}
    assert not any(p.replaces_binary for p in same.values())
    assert plan_rollout(INV, facts, same, None) is None


@pytest.mark.parametrize("role,unit", [("server", "k3s"), ("agent", "k3s-agent")])
def test_unit_names_per_role(role, unit):
    assert role == Role(role) and k3s_service.unit_name(role) == unit
    node = INV.servers[0] if role == "server" else INV.agents[0]
    files = k3s_service.files(INV, node, "token: x\n")
    assert files[0].path == k3s_service.unit_path(unit) and f"ExecStart={k3s_binary.PATH} {role}" in \
        files[0].content.decode()


def test_roles_and_components_are_defined_once():
    from bootstrap.cluster.components.versions import DEFAULTS
    from bootstrap.inventory.schema import CHART_COMPONENTS, ROLES
    from bootstrap.checks import k3s_flags

    assert set(DEFAULTS) == set(Component)
    assert CHART_COMPONENTS == tuple(c.value for c in Component)
    assert ROLES == k3s_flags.ROLES == ("server", "agent")
    assert INV.node("cp-1").role == Role.SERVER and INV.node("gpu-1").role == Role.AGENT


def test_registries_file_only_when_there_is_something_to_say():
    bare = parse_inventory("cluster: b\nnodes:\n  - {name: cp-1, address: 10.0.0.1, role: server}\n")
    assert registries.file(bare, embedded_mirror=False) is None
    spec = registries.file(INV, embedded_mirror=False)
    assert spec.path == registries.REGISTRIES and spec.secret and spec.mode == 0o600
