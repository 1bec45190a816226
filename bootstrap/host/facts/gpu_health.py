"""GPU health from a rented host's own tools: pure parsers, no I/O.

Sources, one probe each (recorded on a real H200 VM in tests/fixtures/gpu-vm-h200/):
- `nvidia-smi -q -x`: ECC counters, retired pages, remapped rows, PCIe link, clock slowdown
  reasons, persistence/compute/MIG mode, per GPU;
- `nvidia-smi nvlink -s`: each link's state;
- `nvidia-smi topo -m`: how many NVLinks join each pair of GPUs;
- the kernel log (dmesg or journalctl -k): the driver's Xid reports.

The host is rented, so everything here is read as hostile: the XML is parsed without DTDs or
entities and with caps on size and depth, strings are cut to printable ASCII, and nothing
raises on garbage (it gives [] / {} / None, like bootstrap.host.facts.parsers).
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .host_facts import _ToDict

MAX_XML_CHARS = 4 * 1024 * 1024  # an 8-GPU `nvidia-smi -q -x` is ~250 KiB
MAX_XML_DEPTH = 16  # nvidia-smi's own nesting is 6 deep
MAX_XML_ELEMENTS = 200_000
MAX_GPUS = 64
MAX_LINES = 200_000
MAX_LINE_CHARS = 4096
MAX_TEXT_CHARS = 300
# The most links one GPU has: 6 (V100), 12 (A100), 18 (H100/H200, B200: NVLink 4 and 5).
MAX_NVLINKS_PER_GPU = 18
# parse_xid keeps at most this many events of one Xid on one GPU (a flood of one kind must
# not crowd out another kind; the count then reads "100 or more").
XID_EVENTS_PER_KIND = 100

_SLOWDOWNS = {  # nvidia-smi's reason name -> ours
    "hw_slowdown": "hw_slowdown",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "hw_power_brake",
    "sw_thermal_slowdown": "sw_thermal",
}

# Short meanings from NVIDIA's Xid catalogue ("Xid Errors", docs.nvidia.com/deploy/xid-errors/:
# the Xid table and, for Ampere and later, analyzing-xid-catalog.html) and the Dynamic Page
# Retirement guide (docs.nvidia.com/deploy/dynamic-page-retirement/: 48, 63, 64).
XID_MEANINGS: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC timeout",
    154: "GPU recovery action changed",
}


@dataclass(frozen=True)
class GpuHealth(_ToDict):
    """One GPU, from nvidia-smi -q -x (+ nvlink -s, topo -m). None: the source says N/A or
    does not say."""

    index: int  # minor_number, else the order in the XML
    uuid: str
    pci_bus_id: str  # as nvidia-smi prints it, e.g. 00000000:3B:00.0
    name: str = ""
    ecc_volatile_uncorrectable: int | None = None  # sum over the volatile *uncorrectable* counters
    ecc_aggregate_uncorrectable: int | None = None
    retired_pages: int | None = None  # both causes; None on GPUs with row remapping instead
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None  # what GPU and host both allow (nvidia-smi's max_link_gen)
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    slowdowns_active: tuple[str, ...] = ()  # of "hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"
    persistence_mode: bool | None = None
    compute_mode: str | None = None  # "Default", "Exclusive_Process", "Prohibited"
    mig_enabled: bool | None = None
    nvlinks_expected: int | None = None  # links topo -m says this GPU has; None: unknown
    nvlinks_inactive: tuple[int, ...] = ()  # link numbers nvlink -s reports inactive
    # Additions to the agreed interface:
    smi_index: int | None = None  # nvidia-smi's own index (order in the XML): what nvlink -s and topo -m print
    nvlinks_active: int | None = None  # links nvlink -s reports up; 0: "all links are inActive"; None: not listed
    performance_state: str | None = None  # "P0" ... (PCIe gen drops in the lower states)
    gpu_idle: bool | None = None  # the "GPU idle" clocks event reason
    temperature_c: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuHealth:
        """The inverse of to_dict (JSON lists back to tuples); unknown keys are ignored."""
        return _from_dict(cls, data)


@dataclass(frozen=True)
class XidEvent(_ToDict):
    pci: str  # "0000:3b:00" as the kernel prints it
    xid: int
    uptime_s: float | None  # dmesg's [seconds] when present
    text: str  # the rest of the line, printable ASCII
    gpu_instance: int | None = None  # the MIG GPU instance ("GPU-I:05") the Xid hit, when MIG is on

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> XidEvent:
        return _from_dict(cls, data)


def _from_dict(cls, data: dict[str, Any]):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(data).items() if k in fields}
    return cls(**values)


# --- input shapes ------------------------------------------------------------------------


def _lines(lines: Iterable[str] | str | bytes | None) -> list[str]:
    """A probe section's lines or one string -> at most MAX_LINES lines, each capped."""
    if lines is None:
        return []
    if isinstance(lines, bytes):
        lines = lines.decode("utf-8", "replace")
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: list[str] = []
    try:
        for line in lines:
            if len(out) >= MAX_LINES:
                break
            out.append(str(line).rstrip("\r\n")[:MAX_LINE_CHARS])
    except TypeError:  # not iterable
        return []
    return out


def _joined(text: Iterable[str] | str | bytes | None, limit: int) -> str | None:
    """The whole input as one string, or None when it is longer than `limit` characters."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if isinstance(text, str):
        return text if len(text) <= limit else None
    parts: list[str] = []
    size = 0
    try:
        for line in text:
            line = str(line)
            size += len(line) + 1
            if size > limit + 1:
                return None
            parts.append(line)
    except TypeError:
        return ""
    return "\n".join(parts)


def _printable(text: str | None, limit: int = 128) -> str:
    """Printable ASCII only (anything else becomes '?'), trimmed and cut to `limit`."""
    return re.sub(r"[^\x20-\x7e]", "?", str(text or "")).strip()[:limit]


# --- nvidia-smi -q -x --------------------------------------------------------------------

_NA = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]"}
_DOCTYPE = re.compile(
    r"<!DOCTYPE\s+[A-Za-z_][\w.:-]*"
    r"(?:\s+SYSTEM\s+(?:\"[^\"<>\[\]]*\"|'[^'<>\[\]]*')"
    r"|\s+PUBLIC\s+(?:\"[^\"<>\[\]]*\"|'[^'<>\[\]]*')\s+(?:\"[^\"<>\[\]]*\"|'[^'<>\[\]]*'))?\s*>"
)


def _safe_root(text: Iterable[str] | str | bytes | None) -> ET.Element | None:
    """The <nvidia_smi_log> element, or None. Hostile input: over MAX_XML_CHARS, any entity
    declaration, a DOCTYPE with an internal subset, nesting deeper than MAX_XML_DEPTH or more
    than MAX_XML_ELEMENTS elements are refused. The plain DOCTYPE nvidia-smi prints
    (`<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">`) is removed and never loaded;
    an entity reference then is undefined and the parse fails."""
    data = _joined(text, MAX_XML_CHARS)
    if not data or re.search(r"<!ENTITY", data, re.IGNORECASE):
        return None
    data = _DOCTYPE.sub("", data, count=1)
    if re.search(r"<!DOCTYPE", data, re.IGNORECASE):
        return None
    # Lines around the document (the fixtures' "$ nvidia-smi -q -x" / "# rc=0" framing, a
    # chatty shell) are not XML; the declaration is dropped too (the text is already str).
    start, end = data.find("<nvidia_smi_log"), data.rfind("</nvidia_smi_log>")
    if start < 0 or end < start:
        return None
    data = data[start : end + len("</nvidia_smi_log>")]
    parser = ET.XMLPullParser(events=("start", "end"))
    root, depth, count = None, 0, 0
    try:
        for offset in range(0, len(data), 65536):
            parser.feed(data[offset : offset + 65536])
            for event, element in parser.read_events():
                if event == "start":
                    depth, count = depth + 1, count + 1
                    root = element if root is None else root
                    if depth > MAX_XML_DEPTH or count > MAX_XML_ELEMENTS:
                        return None
                else:
                    depth -= 1
        parser.close()
        for _ in parser.read_events():
            pass
    except (ET.ParseError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return root if root is not None and root.tag == "nvidia_smi_log" else None


def _value(element: ET.Element | None, path: str) -> str | None:
    """Text at `path`, None when absent or N/A."""
    if element is None:
        return None
    found = element.find(path)
    if found is None or len(found):
        return None
    text = (found.text or "").strip()
    return None if text.lower() in _NA else text


def _int(text: str | None) -> int | None:
    match = re.fullmatch(r"(\d{1,12})\s*(?:x|C)?", (text or "").strip())  # "16x", "38 C"
    return int(match.group(1)) if match else None


def _flag(text: str | None) -> bool | None:
    value = (text or "").strip().lower()
    if value in ("yes", "enabled", "active"):
        return True
    if value in ("no", "disabled", "not active"):
        return False
    return None


def _uncorrectable(counters: ET.Element | None) -> int | None:
    """Sum of a volatile/aggregate block's uncorrectable counters, None when all are N/A.
    Three schemas: sram_uncorrectable_parity/_secded + dram_uncorrectable (R550+, the
    recording), sram_uncorrectable + dram_uncorrectable (Ampere-era drivers), and
    double_bit/total (Volta and older)."""
    if counters is None:
        return None
    values = [_int(_value(child, ".")) for child in counters if "uncorrectable" in child.tag and not len(child)]
    values.append(_int(_value(counters, "double_bit/total")))
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _retired(gpu: ET.Element) -> tuple[int | None, bool | None]:
    block = gpu.find("retired_pages")
    counts = [_int(_value(block, f"{cause}/retired_count"))
              for cause in ("multiple_single_bit_retirement", "double_bit_retirement")]
    known = [c for c in counts if c is not None]
    # Drivers name the pending flag pending_blacklist (older) or pending_retirement, or both.
    pending = [_flag(_value(block, name)) for name in ("pending_retirement", "pending_blacklist")]
    flags = [p for p in pending if p is not None]
    return (sum(known) if known else None), (any(flags) if flags else None)


def _slowdowns(gpu: ET.Element) -> tuple[tuple[str, ...], bool | None]:
    """Active slowdown reasons and whether "GPU idle" is one. R535+ name the block
    clocks_event_reasons (clocks_event_reason_*), older drivers clocks_throttle_reasons."""
    active: list[str] = []
    idle = None
    for block_name, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                               ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        block = gpu.find(block_name)
        if block is None:
            continue
        for child in block:
            reason = child.tag[len(prefix):] if child.tag.startswith(prefix) else ""
            state = _flag(_value(child, "."))
            if reason == "gpu_idle":
                idle = state
            elif reason in _SLOWDOWNS and state and _SLOWDOWNS[reason] not in active:
                active.append(_SLOWDOWNS[reason])
        break
    order = list(_SLOWDOWNS.values())
    return tuple(sorted(active, key=order.index)), idle


def _gpu(element: ET.Element, order: int) -> GpuHealth:
    minor = _int(_value(element, "minor_number"))
    link = element.find("pci/pci_gpu_link_info")
    slowdowns, idle = _slowdowns(element)
    retired, retired_pending = _retired(element)
    compute = _value(element, "compute_mode")
    return GpuHealth(
        index=minor if minor is not None and minor < 4096 else order,
        uuid=_printable(_value(element, "uuid")),
        pci_bus_id=_printable(_value(element, "pci/pci_bus_id") or element.get("id"), 32),
        name=_printable(_value(element, "product_name")),
        ecc_volatile_uncorrectable=_uncorrectable(element.find("ecc_errors/volatile")),
        ecc_aggregate_uncorrectable=_uncorrectable(element.find("ecc_errors/aggregate")),
        retired_pages=retired,
        retired_pages_pending=retired_pending,
        remapped_rows_uncorrectable=_int(_value(element, "remapped_rows/remapped_row_unc")),
        remapped_rows_pending=_flag(_value(element, "remapped_rows/remapped_row_pending")),
        remapped_rows_failure=_flag(_value(element, "remapped_rows/remapped_row_failure")),
        pcie_gen_current=_int(_value(link, "pcie_gen/current_link_gen")),
        pcie_gen_max=_int(_value(link, "pcie_gen/max_link_gen")),
        pcie_width_current=_int(_value(link, "link_widths/current_link_width")),
        pcie_width_max=_int(_value(link, "link_widths/max_link_width")),
        slowdowns_active=slowdowns,
        persistence_mode=_flag(_value(element, "persistence_mode")),
        compute_mode=_printable(compute, 32) if compute else None,
        mig_enabled=_flag(_value(element, "mig_mode/current_mig")),
        smi_index=order,
        performance_state=_printable(_value(element, "performance_state"), 8) or None,
        gpu_idle=idle,
        temperature_c=_int(_value(element, "temperature/gpu_temp")),
    )


def parse_nvsmi_xml(text: Iterable[str] | str | None) -> list[GpuHealth]:
    """`nvidia-smi -q -x` -> one GpuHealth per <gpu>, in nvidia-smi's order. Never raises:
    garbage, hostile or truncated XML gives []."""
    root = _safe_root(text)
    if root is None:
        return []
    gpus = []
    for order, element in enumerate(root.findall("gpu")[:MAX_GPUS]):
        try:
            gpus.append(_gpu(element, order))
        except (ValueError, TypeError, AttributeError):
            continue
    return gpus


# --- nvidia-smi nvlink -s ----------------------------------------------------------------

# The format, per GPU: a header line, then one line per link, its speed or "<inactive>":
#   GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
#            Link 0: 26.562 GB/s
#            Link 3: <inactive>
# (stas00/ml-engineering compute/accelerator/nvidia/debug.md: H100, 18 links at 26.562 GB/s;
# Azure/azhpc-diagnostics issue 73: V100 with "Link 3: <inactive>"; NVIDIA/k8s-test-infra
# issue 371: GB200, 18 links at 53.125 GB/s). A GPU whose links are all down prints, under
# its header, "NVML: Unable to retrieve NVLink information as all links are inActive"
# (leptonai/gpud issue 1085 on a B200; Azure/azurehpc-health-checks PR 132 fails a node on
# it). On the recorded 1-GPU VM the output is empty.
_NVLINK_GPU = re.compile(r"^GPU (\d{1,3}): (.*?)(?: \(UUID: ([^()]*)\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s*Link (\d{1,3}): (.*?)\s*$")
_NVLINK_SPEED = re.compile(r"^\d+(?:\.\d+)? ?[GMK]B/s$")


def parse_nvlink_status(lines: Iterable[str] | str | None) -> dict[int, dict]:
    """`nvidia-smi nvlink -s` -> {gpu index: {"active": [links], "inactive": [links],
    "all_inactive": bool, "uuid": str | None}}."""
    result: dict[int, dict] = {}
    current: dict | None = None
    for line in _lines(lines):
        header = _NVLINK_GPU.match(line)
        if header:
            current = result.setdefault(int(header.group(1)), {
                "active": [], "inactive": [], "all_inactive": False,
                "uuid": _printable(header.group(3)) or None})
            continue
        if current is None:
            continue
        if "all links are inactive" in line.lower():
            current["all_inactive"] = True
            continue
        link = _NVLINK_LINK.match(line)
        if not link:
            continue
        number, state = int(link.group(1)), link.group(2)
        if state.lower() == "<inactive>":
            bucket = current["inactive"]
        elif _NVLINK_SPEED.match(state):
            bucket = current["active"]
        else:
            continue
        if number not in current["active"] and number not in current["inactive"]:
            bucket.append(number)
    for entry in result.values():
        entry["active"].sort()
        entry["inactive"].sort()
    return result


# --- nvidia-smi topo -m ------------------------------------------------------------------

# The matrix: a header of column names, then one row per GPU (and NIC) whose cells say how
# it reaches each other device; "NV<n>" = "a bonded set of <n> NVLinks" (the legend). On the
# recorded VM the header is underlined with ANSI escapes and the row is
# "GPU0\t X \t0-15\t0\t\tN/A". Rows on 8-GPU machines (HazyResearch/ThunderKittens issue 167,
# 8 x H100: "GPU0\t X \tNV18\tNV18 ..."; NVIDIA/DCGM issue 149, DGX A100: NV12 to each peer
# then PXB/SYS to the NICs; NVIDIA/nccl issue 1617, 4 x H100 without a switch: NV6 to each
# of 3 peers).
_ANSI = re.compile(r"(?:\x1b|\?)\[[0-9;]*m")  # the probe turns ESC into "?"
_TOPO_ROW = re.compile(r"^GPU(\d{1,3})\s+(.*)$")


def parse_topo_nvlinks(lines: Iterable[str] | str | None) -> dict[int, int]:
    """`nvidia-smi topo -m` -> {gpu index: NVLinks it should have}, 0 for a GPU without
    NVLink peers. Direct links to different peers are different links, so their NV<n> add up
    (4 x H100, NV6 to each of 3 peers: 18). Behind an NVSwitch every peer is reached over
    all of the GPU's links, so each shows the full count (8 x H100: NV18 to each of 7
    peers, still 18 links): a sum above MAX_NVLINKS_PER_GPU can only be that, and the
    largest cell is the count. gpu_health() also caps it at the links nvlink -s lists."""
    result: dict[int, int] = {}
    for line in _lines(lines):
        row = _TOPO_ROW.match(_ANSI.sub("", line))  # the header row starts with a tab
        if not row:
            continue
        counts = [int(cell[2:]) for cell in row.group(2).split() if re.fullmatch(r"NV\d{1,3}", cell)]
        total = sum(counts)
        result.setdefault(int(row.group(1)), total if total <= MAX_NVLINKS_PER_GPU else max(counts))
    return result


# --- the kernel log ----------------------------------------------------------------------

# The driver's report, after dmesg's "[ 1234.567890] " or journalctl's "Dec 02 06:00:01 host
# kernel: " (or both, in syslog files):
#   NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
#   NVRM: Xid (PCI:0000:18:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s ...
#   NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.   (NVIDIA/open-gpu-kernel-modules issue 1151)
#   NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 ...          (older drivers: no "PCI:")
#   NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: ... (a MIG GPU instance: NVIDIA's
#       GPU Memory Error Management guide, table 3; a compute instance may follow as GPU-C:NN)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
    r"(?: GPU-I:([0-9]{1,3}))?(?: GPU-C:[0-9]{1,3})?\): (\d{1,5})\b,?\s?(.*)$")
_UPTIME = re.compile(r"\[\s*(\d{1,10}\.\d{1,9})\]")


def parse_xid(lines: Iterable[str] | str | None) -> list[XidEvent]:
    """Xid reports in kernel log lines, in order (at most XID_EVENTS_PER_KIND per GPU and Xid)."""
    events: list[XidEvent] = []
    seen: Counter = Counter()
    for line in _lines(lines):
        match = _XID.search(line)
        if not match:
            continue
        pci, xid = match.group(1).lower(), int(match.group(3))
        seen[(pci, xid)] += 1
        if seen[(pci, xid)] > XID_EVENTS_PER_KIND:
            continue
        uptimes = _UPTIME.findall(line[: match.start()])
        instance = match.group(2)
        events.append(XidEvent(pci=_printable(match.group(1), 16), xid=xid,
                               uptime_s=float(uptimes[-1]) if uptimes else None,
                               text=_printable(match.group(4), MAX_TEXT_CHARS),
                               gpu_instance=int(instance) if instance else None))
    return events


def pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as nvidia-smi ("00000000:3B:00.0") or the
    kernel ("0000:3b:00") prints it; None when it is neither."""
    match = re.fullmatch(r"\s*(?:PCI:)?([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.[0-7])?\s*",
                         str(bus_id or ""))
    return tuple(int(part, 16) for part in match.groups()) if match else None  # type: ignore[return-value]


# --- combined ----------------------------------------------------------------------------


def gpu_health(xml_lines: Iterable[str] | str | None, nvlink_lines: Iterable[str] | str | None = None,
               topo_lines: Iterable[str] | str | None = None) -> list[GpuHealth]:
    """The GPUs of `nvidia-smi -q -x` with what nvlink -s and topo -m say of their links.
    nvlink -s is matched by UUID (else nvidia-smi's index), topo -m by nvidia-smi's index."""
    links = parse_nvlink_status(nvlink_lines)
    topo = parse_topo_nvlinks(topo_lines)
    by_uuid = {entry["uuid"]: entry for entry in links.values() if entry.get("uuid")}
    result = []
    for gpu in parse_nvsmi_xml(xml_lines):
        entry = by_uuid.get(gpu.uuid) if gpu.uuid else None
        if entry is None:
            entry = links.get(gpu.smi_index) if gpu.smi_index is not None else None
        expected = topo.get(gpu.smi_index) if gpu.smi_index is not None else None
        active, inactive = None, ()
        if entry is not None:
            listed = len(entry["active"]) + len(entry["inactive"])
            if listed:
                active, inactive = len(entry["active"]), tuple(entry["inactive"])
                if expected:
                    expected = min(expected, listed)
            elif entry["all_inactive"]:
                active = 0
        result.append(dataclasses.replace(gpu, nvlinks_expected=expected, nvlinks_active=active,
                                          nvlinks_inactive=inactive))
    return result
