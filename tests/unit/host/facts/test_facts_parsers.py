"""Host facts: parsers on real H200 output and on synthetic/garbage input, the probe script
run for real under sh (dash), and the pyinfra fact through the @local connector."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from bootstrap.host.facts import parsers as p
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.facts.probe import DELIMITER, PROBE_SCRIPT, SECTIONS, parse_host_facts, split_sections
from repo_paths import TESTS

FIXTURES = TESTS / "fixtures" / "gpu-vm-h200"
SH = shutil.which("dash") or "/bin/sh"


def recorded(name: str) -> tuple[int, list[str]]:
    """A fixture file: "$ command", output, "# rc=N" -> (rc, output lines)."""
    lines = (FIXTURES / name).read_text().split("\n")
    if lines[-1] == "":
        lines.pop()
    assert lines[0].startswith("$ ") and lines[-1].startswith("# rc=")
    return int(lines[-1][len("# rc=") :]), lines[1:-1]


def section(name: str, body: list[str] | str = (), rc: int = 0) -> list[str]:
    if isinstance(body, str):
        body = body.splitlines()
    return [f"{DELIMITER} {name} rc={rc}", *body]


def from_fixture(name: str, fixture: str) -> list[str]:
    rc, body = recorded(fixture)
    return section(name, body, rc)


def h200_probe_output() -> list[str]:
    """What the probe prints on the recorded H200 VM, assembled from the real outputs."""
    # The fixture lists /sys/class/infiniband as empty, so the probe's RDMA listing is too.
    _, infiniband = recorded("infiniband.txt")
    ib_entries = infiniband[infiniband.index("/sys/class/infiniband:") + 2 : infiniband.index("")]
    assert [e.split()[-1] for e in ib_entries] == [".", ".."]
    return [
        *from_fixture("commands", "which.txt"),
        *from_fixture("os-release", "os-release.txt"),
        *from_fixture("uname", "uname.txt"),  # recorded as `uname -a`; the parser takes both
        *section("nproc", ["16"]),  # not recorded by itself: lscpu.txt's "CPU(s): 16"
        *from_fixture("meminfo", "meminfo.txt"),
        *section("rdma", []),
        *from_fixture("pci-nvidia", "sys-pci-nvidia.txt"),
        *from_fixture("nvidia-smi", "nvidia-smi.txt"),
        *from_fixture("nvidia-smi-query", "nvidia-smi-query.txt"),
        *from_fixture("nvidia-smi-mig-lgip", "nvidia-smi-mig-lgip.txt"),
        *from_fixture("nvidia-smi-mig-lgipp", "nvidia-smi-mig-lgipp.txt"),
    ]


# --- the real H200 --------------------------------------------------------------------


def test_h200_fixture_is_a_real_h200():
    facts = parse_host_facts(h200_probe_output())

    assert facts.has_gpu and facts.gpu_error is None
    (gpu,) = facts.gpus
    assert gpu.index == 0
    assert gpu.uuid == "GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261"
    assert gpu.name == "NVIDIA H200"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.memory_mib == 143771
    assert gpu.driver_version == "580.159.04"
    assert gpu.compute_capability == "9.0"
    assert gpu.persistence_mode is True
    assert gpu.mig_current is False and gpu.mig_pending is False  # MIG capable, disabled
    assert gpu.mig_capable and facts.mig_capable
    (pci,) = facts.nvidia_pci
    assert (pci.bus_id, pci.device_id, pci.driver, pci.is_gpu) == ("0000:00:06.0", "0x2335", "nvidia", True)
    assert facts.driver_version == "580.159.04"
    assert facts.cuda_version == "13.0"

    profiles = {m.name: m for m in facts.mig_profiles}
    assert {name: m.instances_total for name, m in profiles.items()} == {
        "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3,
        "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1,
    }  # fmt: skip
    assert {name: m.memory_gib for name, m in profiles.items()} == {
        "1g.18gb": 16.0, "1g.18gb+me": 16.0, "1g.35gb": 32.5, "2g.35gb": 32.5,
        "3g.71gb": 69.75, "4g.71gb": 69.75, "7g.141gb": 140.0,
    }  # fmt: skip
    assert {name: m.profile_id for name, m in profiles.items()} == {
        "1g.18gb": 19, "1g.18gb+me": 20, "1g.35gb": 15, "2g.35gb": 14,
        "3g.71gb": 9, "4g.71gb": 5, "7g.141gb": 0,
    }  # fmt: skip
    assert all(m.instances_free == m.instances_total and m.gpu_index == 0 for m in profiles.values())
    assert profiles["1g.18gb"].placements == [(i, 1) for i in range(7)]
    assert profiles["1g.35gb"].placements == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert profiles["2g.35gb"].placements == [(0, 2), (2, 2), (4, 2)]
    assert profiles["3g.71gb"].placements == [(0, 4), (4, 4)]
    assert profiles["4g.71gb"].placements == [(0, 4)]
    assert profiles["7g.141gb"].placements == [(0, 8)]

    assert (facts.os_id, facts.os_version_id, facts.os_pretty) == ("ubuntu", "24.04", "Ubuntu 24.04.3 LTS")
    assert facts.arch == "amd64"
    assert facts.hostname == "vm" and facts.kernel == "6.18.44-fc-v657-gpu"
    assert facts.cpus == 16
    assert facts.memory_mib == 131981020 // 1024
    assert facts.swap_mib is None  # the recording has only the first 5 meminfo lines
    assert facts.rdma == []
    assert facts.k3s is None
    assert facts.package_manager == "apt"
    assert facts.commands["nvidia-smi"] == "/usr/local/nvidia/bin/nvidia-smi"
    assert "k3s" not in facts.commands


def test_to_dict_is_json():
    facts = parse_host_facts(h200_probe_output())
    data = json.loads(json.dumps(facts.to_dict()))
    assert data["has_gpu"] is True
    assert data["gpus"][0]["memory_mib"] == 143771
    assert data["mig_profiles"][-1]["placements"] == [[0, 8]]
    assert json.dumps(HostFacts().to_dict())


# --- GPU edge cases ---------------------------------------------------------------------


def test_no_nvidia_smi_is_a_cpu_host_not_an_error():
    facts = parse_host_facts(section("commands", "nvidia-smi: missing\napt-get: /usr/bin/apt-get"))
    assert not facts.has_gpu and facts.gpus == []
    assert facts.gpu_error is None and facts.driver_version is None and facts.mig_profiles == []


def test_broken_driver_sets_gpu_error():
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    facts = parse_host_facts(section("nvidia-smi", ["", message, ""], rc=9))
    assert facts.gpus == [] and not facts.has_gpu
    assert facts.gpu_error == message


def test_nvidia_smi_timeout_and_silent_failure():
    assert parse_host_facts(section("nvidia-smi", [], rc=124)).gpu_error == "nvidia-smi timed out"
    assert parse_host_facts(section("nvidia-smi", ["+----+"], rc=3)).gpu_error == "nvidia-smi exited with rc=3"


def test_query_failing_after_header_is_an_error():
    _, header = recorded("nvidia-smi.txt")
    lines = section("nvidia-smi", header) + section("nvidia-smi-query", ["No devices were found"], rc=6)
    facts = parse_host_facts(lines)
    assert facts.gpus == [] and facts.gpu_error == "No devices were found"
    assert facts.driver_version == "580.159.04"


def test_query_garbage_is_an_error_not_a_crash():
    _, header = recorded("nvidia-smi.txt")
    facts = parse_host_facts(section("nvidia-smi", header) + section("nvidia-smi-query", ["%%%garbage"]))
    assert facts.gpus == [] and facts.gpu_error.startswith("nvidia-smi --query-gpu output lists no GPU")


def test_eight_gpu_query():
    # SYNTHETIC: the recorded H200 row repeated for indices 0-7 with distinct UUIDs and bus ids.
    _, (header, row) = recorded("nvidia-smi-query.txt")
    rows = [
        row.replace("0, GPU-0cb55614", f"{i}, GPU-{i}cb55614", 1).replace("00:06.0", f"{0x18 + i:02X}:00.0")
        for i in range(8)
    ]
    gpus = p.parse_gpu_query([header, *rows])
    assert [g.index for g in gpus] == list(range(8))
    assert len({g.uuid for g in gpus}) == 8 and len({g.pci_bus_id for g in gpus}) == 8
    assert gpus[7].pci_bus_id == "00000000:1F:00.0"
    assert all(g.memory_mib == 143771 and g.name == "NVIDIA H200" for g in gpus)


def test_query_with_the_short_field_list():
    lines = [
        "index, uuid, name, pci.bus_id, memory.total [MiB], driver_version, mig.mode.current, "
        "mig.mode.pending, compute_cap",
        "0, GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261, NVIDIA H200, 00000000:00:06.0, 143771 MiB, "
        "580.159.04, Enabled, Disabled, 9.0",
    ]
    (gpu,) = p.parse_gpu_query(lines)
    assert gpu.mig_current is True and gpu.mig_pending is False
    assert gpu.persistence_mode is None and gpu.vbios_version is None


def test_non_mig_gpu_reports_na():
    # SYNTHETIC: an RTX-class GPU, where nvidia-smi reports MIG mode as [N/A] and
    # `mig -lgip` has no table to print.
    _, (header, _) = recorded("nvidia-smi-query.txt")
    row = (
        "0, GPU-5a1e2b3c-0000-1111-2222-333344445555, NVIDIA GeForce RTX 4090, 00000000:01:00.0, "
        "24564 MiB, 550.54.14, [N/A], [N/A], 8.9, Disabled, 95.02.3C.00.8E, [N/A]"
    )
    lines = (
        section("nvidia-smi", "| NVIDIA-SMI 550.54.14    Driver Version: 550.54.14    CUDA Version: 12.4 |")
        + section("nvidia-smi-query", [header, row])
        + section("nvidia-smi-mig-lgip", ["No MIG-supported devices found."], rc=6)
        + section("nvidia-smi-mig-lgipp", ["No MIG-supported devices found."], rc=6)
    )
    facts = parse_host_facts(lines)
    (gpu,) = facts.gpus
    assert gpu.mig_current is None and gpu.mig_pending is None and not gpu.mig_capable
    assert gpu.memory_mib == 24564 and gpu.compute_capability == "8.9"
    assert facts.mig_profiles == [] and not facts.mig_capable
    assert facts.gpu_error is None and facts.cuda_version == "12.4"


def test_na_values():
    header = "index, uuid, name, pci.bus_id, memory.total [MiB], driver_version, compute_cap"
    (gpu,) = p.parse_gpu_query([header, "0, GPU-x, Some GPU, [N/A], [N/A], N/A, [Not Supported]"])
    assert gpu.pci_bus_id == "" and gpu.memory_mib is None
    assert gpu.driver_version is None and gpu.compute_capability is None


# --- RDMA, k3s, sockets ---------------------------------------------------------------

# SYNTHETIC, in the probe's format: an IB HCA, a RoCE NIC (two ports), one port down.
RDMA_LISTING = """\
/sys/class/infiniband/mlx5_0/ports/1/link_layer:InfiniBand
/sys/class/infiniband/mlx5_1/ports/1/link_layer:Ethernet
/sys/class/infiniband/mlx5_1/ports/2/link_layer:Ethernet
/sys/class/infiniband/mlx5_10/ports/1/link_layer:InfiniBand
/sys/class/infiniband/mlx5_0/ports/1/state:4: ACTIVE
/sys/class/infiniband/mlx5_1/ports/1/state:4: ACTIVE
/sys/class/infiniband/mlx5_1/ports/2/state:1: DOWN
/sys/class/infiniband/mlx5_10/ports/1/state:4: ACTIVE
/sys/class/infiniband/mlx5_0/device/net/ibp24s0
/sys/class/infiniband/mlx5_1/device/net/ens1f1np1
/sys/class/infiniband/mlx5_1/device/net/ens1f0np0
"""


def test_rdma_listing():
    devices = parse_host_facts(section("rdma", RDMA_LISTING)).rdma
    assert [(d.name, d.port, d.link_layer, d.state) for d in devices] == [
        ("mlx5_0", 1, "InfiniBand", "ACTIVE"),
        ("mlx5_1", 1, "Ethernet", "ACTIVE"),
        ("mlx5_1", 2, "Ethernet", "DOWN"),
        ("mlx5_10", 1, "InfiniBand", "ACTIVE"),
    ]
    assert devices[0].netdevs == ["ibp24s0"] and devices[0].active
    assert devices[1].netdevs == ["ens1f0np0", "ens1f1np1"]
    assert not devices[2].active
    assert devices[3].netdevs == []


def test_rdma_probe_reads_a_sysfs_tree(tmp_path):
    """The probe's shell globbing, on a fake /sys/class/infiniband."""
    ib = tmp_path / "sys" / "class" / "infiniband"
    for dev, ports, netdevs in [("mlx5_0", {1: ("InfiniBand", "4: ACTIVE")}, ["ibp24s0"]),
                                ("mlx5_1", {1: ("Ethernet", "1: DOWN")}, ["ens1f0np0"])]:  # fmt: skip
        for port, (link_layer, state) in ports.items():
            (ib / dev / "ports" / str(port)).mkdir(parents=True)
            (ib / dev / "ports" / str(port) / "link_layer").write_text(link_layer + "\n")
            (ib / dev / "ports" / str(port) / "state").write_text(state + "\n")
        for netdev in netdevs:
            (ib / dev / "device" / "net" / netdev).mkdir(parents=True)
    script = PROBE_SCRIPT.replace("/sys/class/infiniband", str(ib))
    facts = parse_host_facts(subprocess.run([SH, "-c", script], capture_output=True, text=True).stdout)
    assert [(d.name, d.port, d.link_layer, d.state, d.netdevs) for d in facts.rdma] == [
        ("mlx5_0", 1, "InfiniBand", "ACTIVE", ["ibp24s0"]),
        ("mlx5_1", 1, "Ethernet", "DOWN", ["ens1f0np0"]),
    ]


K3S_UNITS = """\
Id=k3s.service
LoadState=loaded
ActiveState=active
UnitFileState=enabled

Id=k3s-agent.service
LoadState=not-found
ActiveState=inactive
UnitFileState=
"""


def test_k3s_installed_server():
    k3s_section = [
        "binary: /usr/local/bin/k3s",
        "k3s version v1.31.4+k3s1 (a562d090)",
        "go version go1.22.9",
        "config: present",
    ]
    facts = parse_host_facts(section("k3s", k3s_section) + section("k3s-units", K3S_UNITS))
    k3s = facts.k3s
    assert k3s.binary == "/usr/local/bin/k3s" and k3s.version == "v1.31.4+k3s1" and k3s.config_present
    assert [u.name for u in k3s.units] == ["k3s.service"]  # k3s-agent is not installed
    assert k3s.unit("k3s").active and k3s.unit("k3s").unit_file_state == "enabled"
    assert k3s.unit("k3s-agent") is None


def test_k3s_absent_and_leftovers():
    nothing_loaded = section("k3s-units", K3S_UNITS.replace("=loaded", "=not-found"))
    assert parse_host_facts(section("k3s", "config: absent") + nothing_loaded).k3s is None
    # binary removed, unit file and config left behind: still reported, for teardown
    leftover = parse_host_facts(section("k3s", "config: present") + section("k3s-units", K3S_UNITS)).k3s
    assert leftover.binary is None and leftover.config_present and leftover.unit("k3s.service").present
    # no systemd: systemctl fails, which says nothing about units
    no_systemd = section("k3s-units", "System has not been booted with systemd as init system (PID 1).", rc=1)
    assert parse_host_facts(section("k3s", "config: absent") + no_systemd).k3s is None


# SYNTHETIC, iproute2 6.1 `ss -Hltunp` format.
SS_OUTPUT = """\
udp   UNCONN 0      0                  0.0.0.0:8472       0.0.0.0:*
udp   UNCONN 0      0            127.0.0.53%lo:53         0.0.0.0:*    users:(("systemd-resolve",pid=612,fd=13))
tcp   LISTEN 0      4096         127.0.0.53%lo:53         0.0.0.0:*    users:(("systemd-resolve",pid=612,fd=14))
tcp   LISTEN 0      128                0.0.0.0:22         0.0.0.0:*    users:(("sshd",pid=801,fd=3))
tcp   LISTEN 0      128                   [::]:22            [::]:*    users:(("sshd",pid=801,fd=4))
tcp   LISTEN 0      4096                     *:6443              *:*
tcp   LISTEN 0      4096                     *:10250             *:*    users:(("k3s-server",pid=2211,fd=160),("k3s-server",pid=2211,fd=161))
"""


def test_ss_listening_ports():
    facts = parse_host_facts(section("ss", SS_OUTPUT))
    assert facts.tcp_ports == {22, 53, 6443, 10250}
    assert facts.udp_ports == {53, 8472}
    assert facts.listener(10250).process == "k3s-server" and facts.listener(10250).pid == 2211
    assert facts.listener(6443).process is None and facts.listener(6443).address == "*"
    assert facts.listener(22).address == "0.0.0.0"
    assert facts.listener(8472, "udp") is not None and facts.listener(8472) is None
    assert {s.address for s in facts.listening_ports if s.port == 22} == {"0.0.0.0", "::"}


# SYNTHETIC /proc/net lines as the probe prefixes them (used when `ss` fails).
PROC_NET = """\
tcp   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
tcp   0: 00000000:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0 100 0 0 10 0
tcp   1: 0100007F:280A 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000     0        0 2002 1 0 20 4 30 10 -1
tcp6   0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 2003 1 0 100 0 0 10 0
udp   0: 00000000:2118 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2004 2 0 0
udp   1: 0100007F:0035 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2005 2 0 0
"""


def test_proc_net_fallback():
    lines = section("ss", "sh: 1: ss: not found", rc=127) + section("proc-net", PROC_NET)
    facts = parse_host_facts(lines)
    assert [(s.proto, s.address, s.port) for s in facts.listening_ports] == [
        ("tcp", "::1", 22),
        ("tcp", "0.0.0.0", 6443),
        ("udp", "0.0.0.0", 8472),
    ]


# --- system sources ---------------------------------------------------------------------


def test_uname_forms_and_arch():
    assert p.parse_uname(["vm 6.8.0-45-generic aarch64"]) == ("vm", "6.8.0-45-generic", "aarch64")
    debian_a = "Linux h1 6.1.0-26-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.112-1 (2024-09-30) x86_64 GNU/Linux"
    assert p.parse_uname([debian_a]) == ("h1", "6.1.0-26-amd64", "x86_64")
    assert [p.normalise_arch(m) for m in ("x86_64", "aarch64", "arm64", "riscv64", None)] == [
        "amd64", "arm64", "arm64", "riscv64", None,
    ]  # fmt: skip


def test_df_nearest_parent_and_swap():
    df = """\
Filesystem     1024-blocks      Used Available Capacity Mounted on
/dev/root        101430960  5183108  96247852       6% /
/dev/nvme1n1    3750000000 100000000 3650000000     3% /var/lib
"""
    mem = "MemTotal:       2097152 kB\nSwapTotal:       1048576 kB\n"
    facts = parse_host_facts(section("df", df) + section("meminfo", mem) + section("pid1", "systemd"))
    assert facts.disk_free_gib == {"/": 91.79, "/var/lib/rancher": 3480.91}
    assert facts.memory_mib == 2048 and facts.swap_mib == 1024
    assert facts.has_systemd and facts.init_process == "systemd"
    # a df that printed only one line cannot be mapped to the two paths
    assert parse_host_facts(section("df", df.splitlines()[:2], rc=1)).disk_free_gib == {}


def test_os_release_quoting():
    lines = ["ID=debian", 'VERSION_ID="12"', "PRETTY_NAME='Debian 12'", 'BAD="unterminated', "# comment"]
    assert p.parse_os_release(lines) == {
        "ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian 12", "BAD": "unterminated",
    }  # fmt: skip


# --- garbage never crashes --------------------------------------------------------------

RECORDINGS = sorted(FIXTURES.iterdir())
PARSERS = [
    p.parse_os_release, p.parse_uname, p.parse_first_int, p.parse_first_word, p.parse_meminfo,
    p.parse_df, p.parse_commands, p.parse_nvidia_smi_header, p.parse_gpu_query,
    p.parse_mig_profiles, p.parse_mig_placements, p.parse_rdma, p.parse_k3s,
    p.parse_systemd_units, p.parse_ss, p.parse_proc_net, p.first_meaningful_line,
]  # fmt: skip

GARBAGE = [
    "", " ", "\x00\x01\x02", "???", "|", "a,b,c", '"unterminated, quote', "=", "KEY=", "::::",
    "GPU  x Profile ID y Placements: {a,b}:c", "|   0  MIG", "index, uuid", "tcp LISTEN 0 0 nohost:x",
    "tcp 0: ZZZZ:ZZZZ 0000:0000 0A", "/sys/class/infiniband/x/ports/y/state:", "Id=", "% % % %",
    "Filesystem 1024-blocks", "0 0 0 0 0% ", "Linux", "x" * 5000, "\udcff\udcfe",
]  # fmt: skip


@pytest.mark.parametrize("parser", PARSERS, ids=lambda f: f.__name__)
def test_parsers_survive_empty_and_garbage(parser):
    empty = parser([])
    assert empty in (None, [], {}, (None, None), p.K3sFiles(None, None, False))
    parser(GARBAGE)
    parser(None)
    # every real recording through every parser
    assert len(RECORDINGS) >= 10, FIXTURES
    for fixture in RECORDINGS:
        parser(recorded(fixture.name)[1])


def test_host_facts_survive_shuffled_garbage():
    rng = random.Random(20261129)
    pool = GARBAGE + [line for f in RECORDINGS for line in recorded(f.name)[1]]
    for _ in range(200):
        lines = []
        for name in rng.sample(SECTIONS, rng.randint(0, len(SECTIONS))):
            lines += section(name, rng.sample(pool, rng.randint(0, 30)), rng.choice([0, 0, 1, 9, 127]))
        assert isinstance(parse_host_facts(lines), HostFacts)
    assert parse_host_facts([]) == HostFacts()
    assert parse_host_facts("not a probe at all\n\x00") == HostFacts()


def test_split_sections():
    lines = [
        "motd noise",
        *section("a", ["1", "2"], rc=3),
        *section("b"),
        f"{DELIMITER} bad rc=x",
        *section("a", ["dup"]),
    ]
    sections = split_sections(lines)
    assert sections["a"].rc == 3 and sections["a"].lines == ("1", "2")
    assert sections["b"].lines == (f"{DELIMITER} bad rc=x",)  # a malformed delimiter is just output
    assert set(sections) == {"a", "b"}


# --- the probe for real -----------------------------------------------------------------


def run_probe(env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, HostFacts]:
    proc = subprocess.run([SH, "-c", PROBE_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    return proc, parse_host_facts(proc.stdout)


def test_probe_runs_under_dash_on_this_machine():
    proc, facts = run_probe()
    assert proc.returncode == 0 and proc.stderr == ""
    names = list(split_sections(proc.stdout))
    assert names[:12] == list(SECTIONS[:12])
    assert set(names) <= set(SECTIONS)
    assert facts.hostname == os.uname().nodename
    assert facts.kernel == os.uname().release
    assert facts.arch == p.normalise_arch(os.uname().machine)
    assert facts.os_id == p.parse_os_release(Path("/etc/os-release").read_text().splitlines())["ID"]
    assert facts.cpus == os.cpu_count()
    assert facts.memory_mib and facts.memory_mib > 0
    assert set(facts.disk_free_gib) == {"/", "/var/lib/rancher"}
    assert facts.probe_uid == os.getuid()
    if shutil.which("nvidia-smi") is None:
        assert not facts.has_gpu and facts.gpu_error is None
        assert not any(n.startswith("nvidia-smi") for n in names)


def test_probe_with_empty_environment():
    """No PATH at all (as under some sudo/ssh setups): the script sets its own."""
    proc, facts = run_probe(env={})
    assert proc.returncode == 0
    assert facts.hostname == os.uname().nodename and facts.cpus


def test_probe_falls_back_to_proc_net_when_ss_fails(tmp_path):
    (tmp_path / "ss").write_text("#!/bin/sh\necho 'ss: netlink not permitted' >&2\nexit 1\n")
    (tmp_path / "ss").chmod(0o755)
    proc, facts = run_probe(env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    sections = split_sections(proc.stdout)
    assert sections["ss"].rc == 1 and "proc-net" in sections
    expected = {(s.proto, s.port) for s in p.parse_proc_net(sections["proc-net"].lines)}
    assert {(s.proto, s.port) for s in facts.listening_ports} == expected


def test_fact_through_pyinfra_local_connector():
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.facts import get_facts

    from bootstrap.host.facts.pyinfra_fact import HostFactsFact

    state = State(Inventory(([("@local", {})], {})), Config())
    connect_all(state)
    results = get_facts(state, HostFactsFact)
    (host,) = results
    facts = results[host]
    assert isinstance(facts, HostFacts)
    assert facts.hostname == os.uname().nodename
    assert facts.os_id and facts.arch and facts.cpus
    assert not state.failed_hosts


def nested_facts(value):
    """Every facts dataclass instance in `value`, itself included, through fields and lists."""
    if dataclasses.is_dataclass(value):
        yield value
        for f in dataclasses.fields(value):
            yield from nested_facts(getattr(value, f.name))
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from nested_facts(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from nested_facts(item)


def test_every_facts_property_reads_only_fields_its_class_has():
    """Gpu once carried a copy of HostFacts.gpu_hardware, reading fields only HostFacts has."""
    from bootstrap.host.facts import host_facts as model

    facts = dataclasses.replace(parse_host_facts(h200_probe_output()),
                                rdma=[model.RdmaDevice("mlx5_0", 1, "InfiniBand", "ACTIVE", ["ibp26s0"])],
                                k3s=model.K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True,
                                                     [model.SystemdUnit("k3s.service", "loaded", "active")]))
    seen, classes = set(), set()
    for obj in nested_facts(facts):
        classes.add(type(obj))
        for name, attribute in vars(type(obj)).items():
            if isinstance(attribute, property):
                getattr(obj, name)  # raises AttributeError where a property reads a missing field
                seen.add(f"{type(obj).__name__}.{name}")
    with_properties = {cls for cls in vars(model).values() if dataclasses.is_dataclass(cls) and isinstance(cls, type)
                       and cls.__module__ == model.__name__
                       and any(isinstance(a, property) for a in vars(cls).values())}
    assert with_properties and with_properties <= classes, with_properties - classes  # every such class was tried
    assert {"HostFacts.gpu_hardware", "Gpu.mig_capable", "RdmaDevice.active", "PciDevice.is_gpu"} <= seen, seen
    assert "Gpu.gpu_hardware" not in seen
    assert facts.to_dict()["gpu_hardware"] is True and all("gpu_hardware" not in g for g in facts.to_dict()["gpus"])


def test_gpu_without_driver_is_seen_on_pci():
    facts = parse_host_facts(section("pci-nvidia", ["0000:41:00.0 device=0x2330 class=0x030200 driver="]))
    assert not facts.has_gpu and facts.gpu_hardware
    assert facts.nvidia_pci[0].driver is None
    # An NVIDIA audio function or NVSwitch bridge is not a GPU.
    other = parse_host_facts(section("pci-nvidia", ["0000:05:00.0 device=0x22a3 class=0x068000 driver="]))
    assert not other.gpu_hardware


def test_held_packages_count_as_installed():
    from bootstrap.host.facts.parsers import parse_held, parse_packages

    lines = ["hi  nvidia-container-toolkit 1.17.8-1", "ii  nfs-common 1:2.6.2-4", "rc  old-thing 1.0"]
    assert parse_packages(lines) == {"nvidia-container-toolkit": "1.17.8-1", "nfs-common": "1:2.6.2-4"}
    assert parse_held(lines) == ["nvidia-container-toolkit"]
