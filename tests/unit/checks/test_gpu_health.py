"""GPU health: the parsers on the real H200 recording and on its degraded variants
(tests/fixtures/gpu-vm-h200-variants/, README there), kernel log Xid lines, hostile XML, and the
rules that turn them into errors and warnings with a fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bootstrap.host.facts import gpu_health as gh
from bootstrap.checks.gpu_health import XID_ERRORS, XID_WARNINGS, HealthIssue, health_issues
from repo_paths import TESTS

FIXTURES = TESTS / "fixtures"
REAL = FIXTURES / "gpu-vm-h200"
VARIANTS = FIXTURES / "gpu-vm-h200-variants"
SOURCES = ("nvidia-smi-q-x.txt", "nvidia-smi-nvlink.txt", "nvidia-smi-topo.txt")


def body(path: Path) -> list[str]:
    """A recording's output lines, without its "$ nvidia-smi ..." and "# rc=0" framing."""
    lines = path.read_text().split("\n")
    lines = lines[:-1] if lines[-1] == "" else lines
    assert lines[0].startswith("$ nvidia-smi ") and lines[-1] == "# rc=0", path
    return lines[1:-1]


def recording(variant: str | None = None) -> list[list[str]]:
    """The three health sources: the variant's file where it has one, else the real one."""
    folder = VARIANTS / variant if variant else REAL
    return [body(folder / name if (folder / name).exists() else REAL / name) for name in SOURCES]


def real_gpu(**changes) -> gh.GpuHealth:
    (gpu,) = gh.gpu_health(*recording())
    return dataclasses.replace(gpu, **changes)


def only_issue(gpus, xids=(), **kwargs) -> HealthIssue:
    issues = health_issues(list(gpus), list(xids), **kwargs)
    assert len(issues) == 1, issues
    return issues[0]


# --- the real recording ------------------------------------------------------------------

def test_real_recording_is_one_healthy_gpu():
    (gpu,) = gh.gpu_health(*recording())
    assert gpu == gh.GpuHealth(
        index=0, uuid="GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261", pci_bus_id="00000000:00:06.0", name="NVIDIA H200",
        ecc_volatile_uncorrectable=0, ecc_aggregate_uncorrectable=0,
        retired_pages=None, retired_pages_pending=None,  # N/A: Hopper remaps rows instead
        remapped_rows_uncorrectable=0, remapped_rows_pending=False, remapped_rows_failure=False,
        pcie_gen_current=5, pcie_gen_max=5, pcie_width_current=16, pcie_width_max=16,
        slowdowns_active=(), persistence_mode=True, compute_mode="Default", mig_enabled=False,
        nvlinks_expected=0, nvlinks_inactive=(),  # topo -m: no NVLink peer; nvlink -s: empty
        smi_index=0, nvlinks_active=None, performance_state="P0", gpu_idle=True, temperature_c=38)
    assert health_issues([gpu], []) == []
    assert health_issues([gpu], [], expected_gpus=1, wants_mig=False) == []


def test_parsers_take_a_string_or_lines_and_the_framing():
    xml_lines = recording()[0]
    text = "\n".join(xml_lines)
    framed = (REAL / "nvidia-smi-q-x.txt").read_text()  # "$ nvidia-smi -q -x" ... "# rc=0" around it
    assert gh.parse_nvsmi_xml(text) == gh.parse_nvsmi_xml(xml_lines) == gh.parse_nvsmi_xml(framed)
    assert gh.parse_nvsmi_xml(text.encode()) == gh.parse_nvsmi_xml(xml_lines)
    assert len(gh.parse_nvsmi_xml(xml_lines)) == 1


def test_to_dict_is_json_and_from_dict_reads_it_back():
    gpu = gh.gpu_health(*recording("nvlink-down"))[0]
    data = json.loads(json.dumps(gpu.to_dict()))
    assert data["nvlinks_inactive"] == [17] and data["slowdowns_active"] == []
    assert gh.GpuHealth.from_dict(data) == gpu
    event = gh.XidEvent("0000:00:06", 79, 8123.456801, "GPU has fallen off the bus.")
    assert gh.XidEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
    issue = only_issue([gpu])
    assert json.loads(json.dumps(issue.to_dict()))["check"] == "nvlink"


# --- the variants: exactly one issue each ------------------------------------------------

VARIANT_ISSUES = {
    # variant: (check, severity, words in the message, words in the fix)
    "pcie-x8": ("pcie", "warning",
                ["GPU 0 (00000000:00:06.0)", "PCIe link width x8", "allow x16"],
                ["reseat GPU 0 (00000000:00:06.0)", "another machine"]),
    "ecc-uncorrectable": ("ecc", "error",
                          ["GPU 0 (00000000:00:06.0)", "2 uncorrectable ECC errors since the last reset (volatile)",
                           "2 in its lifetime (aggregate)"],
                          ["ask the provider for another machine", "sudo nvidia-smi -r -i 00000000:00:06.0"]),
    "remap-pending": ("remap", "warning",  # NVML: a pending remap "won't affect future work on the GPU"
                      ["GPU 0 (00000000:00:06.0)", "a row remap pending", "1 row remapped for uncorrectable errors"],
                      ["sudo nvidia-smi -r -i 00000000:00:06.0", "takes effect only then"]),
    "slowdown-hw-thermal": ("slowdown", "error",
                            ["GPU 0 (00000000:00:06.0)", "HW thermal slowdown", "38 C"],
                            ["cooling", "another machine"]),
    "nvlink-down": ("nvlink", "error",
                    ["GPU 0 (00000000:00:06.0)", "17 of 18 NVLink links active", "link 17 inactive"],
                    ["another machine", "nvidia-smi nvlink -s"]),
}


@pytest.mark.parametrize("variant", sorted(VARIANT_ISSUES))
def test_each_variant_gives_its_one_issue(variant):
    assert (VARIANTS / variant).is_dir()
    check, severity, message_words, fix_words = VARIANT_ISSUES[variant]
    issue = only_issue(gh.gpu_health(*recording(variant)))
    assert (issue.gpu, issue.check, issue.severity) == (0, check, severity)
    for words in message_words:
        assert words in issue.message, (words, issue.message)
    for words in fix_words:
        assert words in issue.fix, (words, issue.fix)


def test_leftover_modes_variant_gives_mig_and_compute_mode_warnings():
    (gpu,) = gh.gpu_health(*recording("leftover-modes"))
    assert (gpu.mig_enabled, gpu.compute_mode) == (True, "Exclusive_Process")
    mig, compute = health_issues([gpu], [])
    assert (mig.check, mig.severity) == ("mig-mode", "warning")
    assert (compute.check, compute.severity) == ("compute-mode", "warning")
    assert "MIG mode is enabled" in mig.message and "last tenant" in mig.message
    assert mig.fix == ("sudo nvidia-smi -i 00000000:00:06.0 -mig 0, then reset the GPU when no process uses it "
                       "(sudo nvidia-smi -r -i 00000000:00:06.0) or reboot")
    assert "compute mode Exclusive_Process, not Default" in compute.message
    assert compute.fix == "sudo nvidia-smi -i 00000000:00:06.0 -c DEFAULT"
    assert health_issues([gpu], [], wants_mig=True) == [compute]  # a MIG node keeps its MIG mode


def test_every_variant_folder_is_tested_and_holds_only_changed_recordings():
    folders = sorted(p.name for p in VARIANTS.iterdir() if p.is_dir())
    assert folders == sorted([*VARIANT_ISSUES, "leftover-modes"])
    readme = (VARIANTS / "README.md").read_text()
    for folder in folders:
        assert f"`{folder}`" in readme
        files = sorted((VARIANTS / folder).iterdir())
        assert files
        for path in files:
            assert (REAL / path.name).exists(), path
            assert path.read_text() != (REAL / path.name).read_text(), path
            assert path.read_text().split("\n")[0] == (REAL / path.name).read_text().split("\n")[0]


def test_nvlink_down_variant_parses_the_real_formats():
    _, nvlink, topo = recording("nvlink-down")
    status = gh.parse_nvlink_status(nvlink)
    assert status[0]["active"] == list(range(17)) and status[0]["inactive"] == [17]
    assert status[0]["uuid"] == "GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261"
    assert status[1]["active"] == list(range(18)) and status[1]["inactive"] == []
    assert gh.parse_topo_nvlinks(topo) == {0: 18, 1: 18}
    (gpu,) = gh.gpu_health(*recording("nvlink-down"))
    assert (gpu.nvlinks_expected, gpu.nvlinks_active, gpu.nvlinks_inactive) == (18, 17, (17,))


# --- the kernel log ----------------------------------------------------------------------

def test_dmesg_fixture_has_one_xid_79_for_the_recorded_gpu():
    events = gh.parse_xid((VARIANTS / "dmesg-xid79.txt").read_text())
    assert events == [gh.XidEvent("0000:00:06", 79, 8123.456801, "pid=4242, name=python3, GPU has fallen off the bus.")]
    issue = only_issue([real_gpu()], events)
    assert (issue.gpu, issue.check, issue.severity) == (0, "xid", "error")
    assert issue.message == "GPU 0 (00000000:00:06.0): Xid 79 (GPU has fallen off the bus) in the kernel log, once"
    assert issue.fix.startswith("ask the provider for another machine: GPU 0 (00000000:00:06.0) logged Xid 79")


@pytest.mark.parametrize("line, expected", [
    ("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     ("0000:3b:00", 79, 1234.56789, "pid=1234, name=python, GPU has fallen off the bus.")),
    ("Dec 02 06:00:01 host kernel: NVRM: Xid (PCI:0000:18:00): 119, pid='<unknown>', name=<unknown>, "
     "Timeout after 6s of waiting for RPC response from GPU1 GSP!",
     ("0000:18:00", 119, None, "pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC response "
                               "from GPU1 GSP!")),
    ("Jan 18 11:38:05 localhost kernel: [ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007",
     ("0000:01:00", 3, 269.517039, "C 00000005 SC 00000007")),  # older drivers: no "PCI:"
    ("[Tue Dec  2 06:00:01 2025] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
     "remapping, reset gpu to activate.",
     ("0000:10:1c", 63, None, "pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.")),
    ("<4>[   12.000001] NVRM: Xid (PCI:0000:65:00): 94, pid=12345, Contained: ECC error\x1b[0m\x00",
     ("0000:65:00", 94, 12.000001, "pid=12345, Contained: ECC error?[0m?")),
])
def test_xid_line_shapes(line, expected):
    (event,) = gh.parse_xid([line])
    assert (event.pci, event.xid, event.uptime_s, event.text) == expected


def test_xid_ignores_other_lines_and_garbage():
    assert gh.parse_xid([
        "[  1.0] nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up",
        "NVRM: GPU at PCI:0000:00:06: GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261",
        "NVRM: Xid (PCI:zzzz:00:06): 79, bad address", "", "NVRM: Xid", "\xff\xfe",
    ]) == []
    for garbage in (None, "", 42, [None, 7, b"x"], b"\x00\xff"):
        assert gh.parse_xid(garbage) == []


def test_xid_pci_matching_across_the_two_spellings():
    gpus = [real_gpu(index=3, smi_index=3, pci_bus_id="00000000:3B:00.0"),
            real_gpu(index=1, pci_bus_id="00000000:18:00.0")]
    events = gh.parse_xid(["[ 5.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE",
                           "[ 6.0] NVRM: Xid (PCI:0000:3B:00.0): 48, pid=2, name=x, DBE",
                           "[ 7.0] NVRM: Xid (PCI:0000:18:00): 13, pid=9, name=train.py, Graphics Exception"])
    dbe, exc = health_issues(gpus, events)
    assert (dbe.gpu, dbe.severity, exc.gpu, exc.severity) == (3, "error", 1, "warning")
    assert dbe.message == "GPU 3 (00000000:3B:00.0): Xid 48 (Double Bit ECC Error) in the kernel log, 2 times"
    assert "usually the application's fault" in exc.fix and "pid=9, name=train.py" in exc.fix
    assert gh.pci_key("00000000:3B:00.0") == gh.pci_key("0000:3b:00") == gh.pci_key("PCI:0000:3b:00") == (0, 0x3B, 0)
    assert gh.pci_key("3b:00") is None


def test_xid_of_a_gpu_nvidia_smi_does_not_list_and_unknown_xids():
    events = gh.parse_xid(["NVRM: Xid (PCI:0000:9a:00): 79, GPU has fallen off the bus.",
                           "NVRM: Xid (PCI:0000:00:06): 150, pid=1, something new"])
    gone, unknown = health_issues([real_gpu()], events)
    assert (gone.gpu, gone.severity) == (None, "error")
    assert "for PCI 0000:9a:00, a GPU nvidia-smi does not list" in gone.message
    assert (unknown.gpu, unknown.severity) == (0, "warning")
    assert unknown.message == "GPU 0 (00000000:00:06.0): Xid 150 in the kernel log, once"
    assert "see NVIDIA's Xid catalogue" in unknown.fix


def test_xid_severity_sets_and_meanings():
    assert {48, 63, 64, 74, 79, 92, 94, 95, 119} <= XID_ERRORS and {13, 31, 43, 45} == XID_WARNINGS
    for xid in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119):
        assert gh.XID_MEANINGS[xid]
        events = [gh.XidEvent("0000:00:06", xid, None, "pid=1, name=a")]
        (issue,) = health_issues([real_gpu()], events)
        assert issue.severity == ("error" if xid in XID_ERRORS else "warning")
        assert f"Xid {xid} ({gh.XID_MEANINGS[xid]})" in issue.message


def test_a_flood_of_one_xid_does_not_crowd_out_another():
    lines = ["NVRM: Xid (PCI:0000:00:06): 45, pid=1, name=a, Ch 00000001"] * 5000
    lines.append("NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.")
    events = gh.parse_xid(lines)
    assert len(events) == gh.XID_EVENTS_PER_KIND + 1 and events[-1].xid == 79
    flood, gone = health_issues([real_gpu()], events)
    assert "100 or more times" in flood.message and gone.severity == "error"


# --- hostile and odd XML -----------------------------------------------------------------

BOMB = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
 <!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">
 <!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;"><!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;">
]>
<nvidia_smi_log><gpu id="00000000:00:06.0"><uuid>&e;</uuid></gpu></nvidia_smi_log>"""

HOSTILE = {
    "entity bomb": BOMB,
    "external entity": '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY f SYSTEM "file:///etc/passwd">]>'
                       '<nvidia_smi_log><gpu><uuid>&f;</uuid></gpu></nvidia_smi_log>',
    "entity in lower case": '<!doctype x [<!entity f "x">]><nvidia_smi_log><gpu/></nvidia_smi_log>',
    "internal subset without entities": '<!DOCTYPE x [<!ELEMENT x ANY>]><nvidia_smi_log><gpu/></nvidia_smi_log>',
    "undefined entity": '<nvidia_smi_log><gpu><uuid>&e;</uuid></gpu></nvidia_smi_log>',
    "truncated": "\n".join(recording()[0])[:20000],
    "only the start": '<?xml version="1.0" ?>\n<nvidia_smi_log><gpu id="0">',
    "another root": "<other><nvidia_smi_log></nvidia_smi_log></other>x</nvidia_smi_log>",
    "too deep": "<nvidia_smi_log>" + "<gpu>" * 100 + "</gpu>" * 100 + "</nvidia_smi_log>",
    "too large": "<nvidia_smi_log>" + " " * (gh.MAX_XML_CHARS + 1) + "</nvidia_smi_log>",
    "binary": "\x00\x01<nvidia_smi_log>\xff\ufffe</nvidia_smi_log",
    "not xml": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    "empty": "",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_xml_gives_nothing(name):
    assert gh.parse_nvsmi_xml(HOSTILE[name]) == []
    assert gh.parse_nvsmi_xml(HOSTILE[name].splitlines()) == []
    assert gh.gpu_health(HOSTILE[name], HOSTILE[name], HOSTILE[name]) == []


def test_the_recorded_doctype_is_dropped_not_loaded():
    xml = recording()[0]
    assert xml[1] == '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">'
    assert len(gh.parse_nvsmi_xml(xml)) == 1
    assert gh.parse_nvsmi_xml([xml[0], xml[1], xml[1], *xml[2:]]) == []  # a second DOCTYPE is not ours


def test_garbage_of_any_type_never_raises():
    for garbage in (None, 0, 3.5, [], [None, 1, b"<x>"], object(), "<<<>>>", "\n" * 10, ["<nvidia_smi_log>"]):
        assert gh.parse_nvsmi_xml(garbage) == []
        assert isinstance(gh.parse_nvlink_status(garbage), dict)
        assert isinstance(gh.parse_topo_nvlinks(garbage), dict)
        assert gh.gpu_health(garbage, garbage, garbage) == []


def test_strings_from_the_host_are_printable_and_short():
    xml = "\n".join(recording()[0]).replace("<product_name>NVIDIA H200</product_name>",
                                            "<product_name>\u202eEvil\u00e9" + "A" * 500 + "</product_name>")
    (gpu,) = gh.parse_nvsmi_xml(xml)
    assert gpu.name.startswith("?Evil?A") and len(gpu.name) == 128


def xml_of(gpu_body: str, count: int = 1) -> str:
    return "<nvidia_smi_log>" + "".join(
        f'<gpu id="00000000:0{i}:00.0"><minor_number>{i}</minor_number>{gpu_body}</gpu>' for i in range(count)
    ) + "</nvidia_smi_log>"


def test_older_driver_schemas():
    (gpu,) = gh.parse_nvsmi_xml(xml_of(
        "<clocks_throttle_reasons><clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>"
        "<clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>"
        "<clocks_throttle_reason_sw_thermal_slowdown>Active</clocks_throttle_reason_sw_thermal_slowdown>"
        "<clocks_throttle_reason_hw_power_brake_slowdown>N/A</clocks_throttle_reason_hw_power_brake_slowdown>"
        "</clocks_throttle_reasons>"
        "<ecc_errors><volatile><single_bit><device_memory>5</device_memory><total>5</total></single_bit>"
        "<double_bit><device_memory>1</device_memory><register_file>0</register_file><total>1</total></double_bit>"
        "</volatile><aggregate><single_bit><total>N/A</total></single_bit><double_bit><total>N/A</total></double_bit>"
        "</aggregate></ecc_errors>"
        "<retired_pages><multiple_single_bit_retirement><retired_count>60</retired_count>"
        "</multiple_single_bit_retirement>"
        "<double_bit_retirement><retired_count>4</retired_count></double_bit_retirement>"
        "<pending_blacklist>Yes</pending_blacklist></retired_pages><remapped_rows>N/A</remapped_rows>"))
    assert gpu.pci_bus_id == "00000000:00:00.0"  # the <gpu id=...> when <pci> is absent
    assert gpu.slowdowns_active == ("hw_slowdown", "sw_thermal") and gpu.gpu_idle is False
    assert (gpu.ecc_volatile_uncorrectable, gpu.ecc_aggregate_uncorrectable) == (1, None)
    assert (gpu.retired_pages, gpu.retired_pages_pending) == (64, True)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_uncorrectable) == (None, None)
    (gpu,) = gh.parse_nvsmi_xml(xml_of(  # Ampere-era drivers: sram_uncorrectable in one counter
        "<ecc_errors><volatile><sram_correctable>9</sram_correctable><sram_uncorrectable>1</sram_uncorrectable>"
        "<dram_uncorrectable>2</dram_uncorrectable></volatile></ecc_errors>"))
    assert gpu.ecc_volatile_uncorrectable == 3


def test_several_gpus_keep_nvidia_smi_order_and_minor_numbers():
    gpus = gh.parse_nvsmi_xml(xml_of("<uuid>GPU-x</uuid>", 3).replace("<minor_number>0<", "<minor_number>7<"))
    assert [(g.index, g.smi_index) for g in gpus] == [(7, 0), (1, 1), (2, 2)]
    gpus = gh.parse_nvsmi_xml(xml_of("", 2).replace("<minor_number>1</minor_number>", ""))
    assert [g.index for g in gpus] == [0, 1]  # no minor number: the order in the XML


# --- nvlink -s and topo -m on multi-GPU machines -----------------------------------------

H100_TOPO = """\
        GPU0    GPU1    GPU2    GPU3    GPU4    GPU5    GPU6    GPU7    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    NV18    NV18    NV18    NV18    NV18    NV18    PXB     0-47,96-143     0               N/A
GPU1    NV18     X      NV18    NV18    NV18    NV18    NV18    NV18    PXB     0-47,96-143     0               N/A
NIC0    PXB     PXB     SYS     SYS     SYS     SYS     SYS     SYS      X

Legend:
  NV#  = Connection traversing a bonded set of # NVLinks"""

MESH_TOPO = """\
\t?[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID?[0m
GPU0\t X \tNV6\tNV6\tNV6\tPIX\t6,14,22,30\t3\t\tN/A
GPU1\tNV6\t X \tNV6\tNV6\tSYS\t4,12,20,28\t1\t\tN/A
GPU2\tNV6\tNV6\t X \tSYS\tSYS\t7,15,23,31\t7\t\tN/A
GPU3\tSYS\tSYS\tSYS\t X \tSYS\t5,13,21,29\t5\t\tN/A"""


def test_topo_counts_links_behind_a_switch_once_and_adds_up_a_mesh():
    assert gh.parse_topo_nvlinks(H100_TOPO) == {0: 18, 1: 18}  # NVSwitch: NV18 to each of 7 peers
    assert gh.parse_topo_nvlinks(MESH_TOPO) == {0: 18, 1: 18, 2: 12, 3: 0}  # direct links add up


def test_nvlink_status_shapes():
    status = gh.parse_nvlink_status([
        "GPU 0: NVIDIA B200 (UUID: GPU-aaaa)", "\t Link 0: 53.125 GB/s", "\t Link 1: <inactive>",
        "\t Link 1: 53.125 GB/s", "\t Link 2: N/A",
        "GPU 2: NVIDIA B200 (UUID: GPU-cccc)", "NVML: Unable to retrieve NVLink information as all links are inActive",
        "stray line", "         Link 9: 1 GB/s",
    ])
    assert status == {0: {"active": [0], "inactive": [1], "all_inactive": False, "uuid": "GPU-aaaa"},
                      2: {"active": [9], "inactive": [], "all_inactive": True, "uuid": "GPU-cccc"}}
    assert gh.parse_nvlink_status(recording()[1]) == {}  # the recorded 1-GPU VM prints nothing


def two_gpu_xml() -> list[str]:
    xml = "\n".join(recording()[0])
    second = xml[xml.index("<gpu id="): xml.index("</gpu>") + len("</gpu>")]
    second = (second.replace("00000000:00:06.0", "00000000:00:07.0").replace("<minor_number>0<", "<minor_number>1<")
              .replace("GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261", "GPU-00000000-0000-0000-0000-000000000001"))
    return xml.replace("</gpu>", "</gpu>" + second, 1).splitlines()


def test_nvlink_a_gpu_with_all_links_down_beside_one_with_nvlink():
    nvlink = ["GPU 0: NVIDIA H200 (UUID: GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261)",
              "NVML: Unable to retrieve NVLink information as all links are inActive",
              "GPU 1: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000001)",
              *[f"\t Link {i}: 26.562 GB/s" for i in range(18)]]
    topo = ["\tGPU0\tGPU1", "GPU0\t X \tSYS", "GPU1\tSYS\t X "]
    gpus = gh.gpu_health(two_gpu_xml(), nvlink, topo)
    assert [(g.index, g.nvlinks_active, g.nvlinks_expected) for g in gpus] == [(0, 0, 0), (1, 18, 0)]
    issue = only_issue(gpus)
    assert (issue.gpu, issue.check, issue.severity) == (0, "nvlink", "error")
    assert "all NVLink links inactive" in issue.message


def test_nvlink_not_flagged_on_a_machine_without_nvlink():
    # PCIe cards without a bridge list their links as inactive; topo -m shows no NV# peer.
    nvlink = ["GPU 0: NVIDIA A100 80GB PCIe (UUID: GPU-0cb55614-f19b-b5ec-e96f-134d60bf4261)",
              *[f"\t Link {i}: <inactive>" for i in range(12)]]
    (gpu,) = gh.gpu_health(recording()[0], nvlink, recording()[2])
    assert gpu.nvlinks_inactive == tuple(range(12)) and gpu.nvlinks_active == 0
    assert health_issues([gpu], []) == []


def test_nvlink_fewer_active_than_topo_expects():
    issue = only_issue([real_gpu(nvlinks_expected=18, nvlinks_active=12, nvlinks_inactive=())])
    assert issue.message == "GPU 0 (00000000:00:06.0): 12 of 18 NVLink links active"


# --- the other rules ---------------------------------------------------------------------

def test_gpu_count():
    issue = only_issue([real_gpu()], expected_gpus=8)
    assert (issue.gpu, issue.check, issue.severity) == (None, "gpu-count", "error")
    assert issue.message == "1 GPU visible to nvidia-smi, 8 expected"
    assert "lspci -d 10de:" in issue.fix and "nvidia-smi -L" in issue.fix
    assert health_issues([real_gpu()], [], expected_gpus=1) == []


def test_persistence_off_is_a_warning_with_the_daemon_as_fix():
    issue = only_issue([real_gpu(persistence_mode=False)])
    assert (issue.check, issue.severity) == ("persistence", "warning")
    assert issue.fix == ("sudo systemctl enable --now nvidia-persistenced (or, until the next reboot, "
                         "sudo nvidia-smi -i 00000000:00:06.0 -pm 1)")


@pytest.mark.parametrize("state, flagged", [("P0", True), ("P8", False), (None, False)])
def test_pcie_generation_is_flagged_only_in_p0(state, flagged):
    gpus = [real_gpu(pcie_gen_current=1, performance_state=state)]
    issues = health_issues(gpus, [])
    assert bool(issues) == flagged
    if flagged:
        assert issues[0].message == ("GPU 0 (00000000:00:06.0): PCIe Gen1 in performance state P0, the GPU and "
                                     "its slot allow Gen5")


def test_retired_pages():
    pending = only_issue([real_gpu(retired_pages=3, retired_pages_pending=True)])
    assert (pending.check, pending.severity) == ("retired-pages", "warning")
    assert "sudo nvidia-smi -r -i 00000000:00:06.0" in pending.fix
    full = only_issue([real_gpu(retired_pages=64, retired_pages_pending=True)])
    assert (full.check, full.severity) == ("retired-pages", "error")
    assert "64 retired memory pages, and a retirement pending" in full.message
    assert health_issues([real_gpu(retired_pages=63, retired_pages_pending=False)], []) == []


def test_remap_failure_and_slowdown_kinds():
    failed = only_issue([real_gpu(remapped_rows_failure=True, remapped_rows_pending=True)])
    assert "row remapping failed" in failed.message and "a row remap pending" in failed.message
    assert failed.fix.startswith("ask the provider for another machine") and failed.severity == "error"
    pending = only_issue([real_gpu(remapped_rows_pending=True, remapped_rows_uncorrectable=1)])
    assert (pending.check, pending.severity) == ("remap", "warning")
    soft = only_issue([real_gpu(slowdowns_active=("sw_thermal",))])
    assert (soft.check, soft.severity) == ("slowdown", "warning")
    brake = only_issue([real_gpu(slowdowns_active=("hw_slowdown", "hw_power_brake"))])
    assert brake.severity == "error" and "power supply" in brake.fix


def test_aggregate_only_ecc_and_dict_input():
    gpu = real_gpu(ecc_aggregate_uncorrectable=5)
    issue = only_issue([gpu.to_dict()], [])  # facts read back from JSON
    assert issue.message == ("GPU 0 (00000000:00:06.0): 5 uncorrectable ECC errors in its lifetime (aggregate), "
                             "none since the last reset")
    xid = gh.XidEvent("0000:00:06", 48, None, "").to_dict()
    assert [i.check for i in health_issues([gpu], [xid])] == ["ecc", "xid"]


def test_xid_lines_of_mig_gpu_instances_are_kept():
    """With MIG on, the driver names the GPU instance after the bus id ("GPU-I:05"): such
    lines were dropped before, so Xid 94/95 on MIG nodes never reached preflight or health."""
    events = gh.parse_xid((VARIANTS / "dmesg-xid-mig.txt").read_text())
    assert [(e.pci, e.xid, e.gpu_instance) for e in events] == [
        ("0000:00:06", 94, 5), ("0000:00:06", 94, 5), ("0000:00:06", 95, 2), ("0000:00:06", 48, None)]
    assert events[0].text == "pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert gh.XidEvent.from_dict(json.loads(json.dumps(events[0].to_dict()))) == events[0]
    contained, uncontained, dbe = health_issues([real_gpu()], events)
    assert contained.message == ("GPU 0 (00000000:00:06.0): Xid 94 (" + gh.XID_MEANINGS[94] + ") in the kernel "
                                 "log, 2 times (MIG GPU instance 5)")
    assert (contained.severity, uncontained.severity, dbe.severity) == ("error", "error", "error")
    assert "(MIG GPU instance" not in dbe.message
    (compute,) = gh.parse_xid(["NVRM: Xid (PCI:0000:00:06 GPU-I:01 GPU-C:00): 43, pid=1, name=a, Ch 00000008"])
    assert (compute.xid, compute.gpu_instance) == (43, 1)
    assert gh.parse_xid(["NVRM: Xid (PCI:0000:00:06 GPU-I:xx): 94, pid=1"]) == []
