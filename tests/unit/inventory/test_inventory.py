"""The inventory model: defaults, overrides and the rules that span fields."""

from pathlib import Path

import pytest
from clirun import run_bootstrap

from bootstrap.errors import InvalidInput
from bootstrap.inventory.loader import parse_inventory
from bootstrap.inventory.model import SecretRef
from repo_paths import ROOT

SHIPPED = sorted((ROOT / "inventories").glob("*.yaml"))

MINIMAL = """\
cluster: solo
ssh: {user: ubuntu}
nodes:
  - name: box-1
    address: 203.0.113.10
    role: server
"""


def problems(text: str) -> list:
    with pytest.raises(InvalidInput) as caught:
        parse_inventory(text, "inv.yaml")
    return caught.value.problems


def test_five_line_inventory_gets_sensible_defaults():
    inv = parse_inventory(MINIMAL, "inv.yaml")
    assert inv.cluster == "solo" and inv.source == "inv.yaml"
    assert [n.name for n in inv.servers] == ["box-1"] and inv.agents == ()
    assert inv.ssh.port == 22 and inv.ssh.use_sudo  # non-root user: sudo by default
    assert inv.gpu.driver == "preinstalled" and inv.gpu.sharing.mode == "none"
    assert inv.storage.default == "local-path"
    assert inv.k3s.version is None and inv.k3s.snapshots.retention >= 1


def test_root_user_does_not_sudo_by_default():
    inv = parse_inventory(MINIMAL.replace("ubuntu", "root"))
    assert not inv.ssh.use_sudo


def test_node_overrides_sharing_and_ssh():
    inv = parse_inventory(MINIMAL + """\
  - name: gpu-1
    address: 203.0.113.11
    ssh: {port: 2222, user: root}
    gpu: {sharing: {mig: {layout: all-1g.18gb}}}
  - name: gpu-2
    address: 203.0.113.12
    gpu: {sharing: none}
gpu: {sharing: {time_slicing: {replicas: 4}}}
""")
    cp, gpu1, gpu2 = inv.nodes
    assert inv.sharing_for(cp).mode == "time-slicing" and inv.sharing_for(cp).time_slicing.replicas == 4
    assert inv.sharing_for(gpu1).mode == "mig" and inv.sharing_for(gpu1).mig.layout == "all-1g.18gb"
    assert inv.sharing_for(gpu2).mode == "none"
    assert inv.ssh_for(gpu1).port == 2222 and inv.ssh_for(gpu1).user == "root"
    assert inv.ssh_for(cp).port == 22


def test_secrets_are_references():
    inv = parse_inventory(MINIMAL + """\
registries:
  auth: {mirror.example.com: {username: bot, password_env: REGISTRY_PASSWORD}}
""")
    assert inv.registries.auth["mirror.example.com"].password == SecretRef(env="REGISTRY_PASSWORD")


def test_all_errors_reported_at_once():
    found = problems("""\
cluster: Bad_Name
ssh: {user: ubuntu, prot: 22}
nodes:
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: cp-1, address: 10.0.0.999}
gpu: {driver: magic}
storage: {default: nfs}
""")
    paths = {p.path for p in found}
    assert {"cluster", "ssh.prot", "nodes[1].name", "nodes[1].address", "gpu.driver", "storage.default"} <= paths
    assert [p.line for p in found] == sorted(p.line for p in found)


def test_did_you_mean_for_misspelt_keys():
    (problem,) = problems(MINIMAL + "volcanoo: {queues: []}\n")
    assert "did you mean 'volcano'" in problem.hint


def test_shared_address_with_distinct_ports_is_allowed():
    inv = parse_inventory(MINIMAL + """\
  - {name: a, address: 198.51.100.20, ssh: {port: 40122}}
  - {name: b, address: 198.51.100.20, ssh: {port: 40123}}
""")
    assert len(inv.agents) == 2


def test_three_servers_are_fine_two_are_not():
    three = MINIMAL + "".join(f"  - {{name: cp-{i}, address: 10.0.0.{i}, role: server}}\n" for i in (2, 3))
    assert len(parse_inventory(three).servers) == 3
    two = MINIMAL + "  - {name: cp-2, address: 10.0.0.2, role: server}\n"
    assert any("etcd quorum" in p.message for p in problems(two))


def test_the_shipped_inventories_are_found():
    assert {p.stem for p in SHIPPED} >= {"lab", "minimal", "mig-h200", "ib-2x8gpu", "spot-timeslicing"}


# lab.yaml's chart archives exist once `testhosts.py up` built them: tests/unit/inventory/test_lab_inventory.py
@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem != "lab"], ids=lambda p: p.stem)
def test_shipped_inventories_are_valid(path):
    result = run_bootstrap("check", str(path))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_missing_file_is_a_usage_error():
    result = run_bootstrap("check", "/nonexistent/inv.yaml")
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_installed_command_works_from_another_folder(tmp_path):
    result = run_bootstrap("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("check", "facts", "up", "validate", "rebuild", "scale-down", "down"):
        assert command in result.stdout
    assert run_bootstrap(cwd=tmp_path).returncode == 2  # no command: usage, exit 2
    bad = run_bootstrap("up", "--no-such-flag", "x.yaml", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    zero = run_bootstrap("up", "--max-unavailable", "0", "x.yaml", cwd=tmp_path)
    assert zero.returncode == 2 and "at least 1" in zero.stderr


def test_the_expected_gpu_count_and_burn_in_floor_are_checked_where_written():
    found = problems(MINIMAL.replace("    role: server\n", "    role: server\n    gpu: {count: 0}\n")
                     + "gpu: {count: many, gate: {burn_in_min_gflops: -1}}\n")
    where = {p.path: p.line for p in found}
    assert where == {"nodes[0].gpu.count": 7, "gpu.count": 8, "gpu.gate.burn_in_min_gflops": 8}
    inv = parse_inventory(MINIMAL.replace("    role: server\n", "    role: server\n    gpu: {count: 4}\n")
                          + "gpu: {count: 8, gate: {burn_in_min_gflops: 12000}}\n", "inv.yaml")
    assert inv.gpu_count_for(inv.nodes[0]) == 4 and inv.gpu.count == 8 and inv.gpu.gate.burn_in_min_gflops == 12000
