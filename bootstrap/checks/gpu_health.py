"""Is a rented machine's GPU fit to pay for? Pure rules over bootstrap.host.facts.gpu_health.

Each finding is an error (the GPU is faulty or will lose work: strict mode leaves the node
out) or a warning (worth fixing, or a sign to look closer), with the action that fixes it.
At most one issue per GPU and check, so a caller can show, block or label per check.

Severities and why:
- ecc, error: an uncorrectable ECC error lost data; NVIDIA's guidance is to reset the GPU and
  to replace it when they recur (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/). Aggregate
  counts are the GPU's lifetime, so a machine that had them before is flagged too.
- remap: a failure (a bank without spare rows), error: NVIDIA's RMA criterion for
  row-remapping GPUs (same guide, "Row Remapping", "RMA Policy"). A remap pending alone,
  warning: it takes effect at the next GPU reset, and NVML says it "won't affect future work
  on the GPU since error-containment and dynamic page blacklisting will take care of that"
  (nvmlDeviceGetRemappedRows); the guide's "Error Recovery and Response Flags": with the
  flag set "new workloads can be launched". So `gpu.health: strict` keeps such a node.
- retired-pages: pending, warning (a reset or driver reload retires the page); 64 or more,
  error: legacy page retirement "supported a maximum of 64 retirements for the frame buffer"
  (same guide's table; docs.nvidia.com/deploy/dynamic-page-retirement/), so at 64 the next
  bad page stays in use.
- pcie, warning: the GPU still works, but every copy to or from it is slower. The maxima
  nvidia-smi reports already are what GPU *and* host allow ("max_link_gen": "possible with
  this GPU and system configuration", `nvidia-smi --help-query-gpu`), so a GPU in an x8 slot
  by design is not flagged. Width below that maximum is flagged always: data center GPUs
  keep their width at idle, and a narrower link is a seating, riser or lane fault. The
  generation, though, follows the performance state: GPUs drop to Gen1-3 in lower P-states
  to save power (NVIDIA/open-gpu-kernel-modules issue 731, an NVIDIA engineer: P8 Gen1, P5
  Gen2, P2/P0 full; `--help-query-gpu`: "may be reduced when the GPU is not in use"). So a
  lower generation is flagged only in P0, where the link runs at its best (the recorded
  H200 sits idle in P0 at Gen5 of 5).
- nvlink, error: a link down halves or worse the bandwidth between GPUs (or makes NCCL fall
  back to PCIe); checked only when the machine has NVLink at all (a link up, or topo -m
  naming NVLink peers), so PCIe cards without a bridge and 1-GPU VMs are not flagged.
- slowdown: HW slowdown, HW thermal and HW power brake, error: the hardware halves the
  clocks or more for heat or power (NVML's clocks event reasons); SW thermal, warning: the
  driver trims clocks to stay under its temperature target, worth a look at the cooling.
- xid: those that mean the hardware (48, 63, 64, 74, 79, 92, 94, 95, 119, and 154: the
  driver says the GPU needs a reset or the node a reboot), error; 13, 31, 43, 45, warning:
  usually the application's fault (the catalogue's resolution for them is to restart or
  check the application); any other, warning, to look up in NVIDIA's catalogue.
- gpu-count, error: fewer GPUs than the inventory (gpu.count) or the node's own PCI bus say
  means one fell off the bus or was never attached, and the machine costs the same. A peer
  of the same model showing more is at most a warning (bootstrap.checks.preflight): a host
  may claim any number of GPUs, and it must not fail the honest ones.
- mig-mode, compute-mode, persistence, warning: settings the last tenant can leave; none
  breaks the hardware, each makes pods fail or start slowly. Persistence off is a warning
  because without it the driver tears a GPU down whenever no process holds it, and every
  pod start waits for it to come up again (docs.nvidia.com/deploy/driver-persistence/; the
  daemon is NVIDIA's recommended way, `nvidia-smi -pm 1` the legacy one).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from bootstrap.host.facts.gpu_health import XID_EVENTS_PER_KIND, XID_MEANINGS, GpuHealth, XidEvent, pci_key
from bootstrap.host.facts.host_facts import _ToDict

XID_ERRORS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 154})
XID_WARNINGS = frozenset({13, 31, 43, 45})
RETIRED_PAGES_LIMIT = 64
XID_CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/"

_SLOWDOWN_TEXT = {
    "hw_slowdown": "HW slowdown (clocks cut by half or more)",
    "hw_thermal": "HW thermal slowdown (the GPU is too hot)",
    "hw_power_brake": "HW power brake slowdown (the machine's power supply asserted the brake)",
    "sw_thermal": "SW thermal slowdown (the driver keeps the GPU under its temperature limit)",
}
_COMPUTE_MODE_TEXT = {
    "Exclusive_Process": "only one process at a time can use it",
    "Exclusive_Thread": "only one thread at a time can use it",
    "Prohibited": "no process can use it",
}


@dataclass(frozen=True)
class HealthIssue(_ToDict):
    gpu: int | None  # GPU index, None for the node as a whole
    severity: str  # "error" | "warning"
    check: str  # "ecc", "remap", "retired-pages", "pcie", "nvlink", "slowdown", "xid", "gpu-count",
    #             "mig-mode", "compute-mode", "persistence"
    message: str
    fix: str


def _label(gpu: GpuHealth) -> str:
    return f"GPU {gpu.index} ({gpu.pci_bus_id})" if gpu.pci_bus_id else f"GPU {gpu.index}"


def _target(gpu: GpuHealth) -> str:
    """What `nvidia-smi -i` takes: the bus id names the GPU whatever the enumeration order."""
    return gpu.pci_bus_id or str(gpu.index)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _reset_command(gpu: GpuHealth) -> str:
    return f"sudo nvidia-smi -r -i {_target(gpu)}"


def _reset(gpu: GpuHealth) -> str:
    return f"reset the GPU when no process uses it ({_reset_command(gpu)}) or reboot"


def _ecc(gpu: GpuHealth) -> HealthIssue | None:
    volatile, aggregate = gpu.ecc_volatile_uncorrectable or 0, gpu.ecc_aggregate_uncorrectable or 0
    if not volatile and not aggregate:
        return None
    if volatile:
        what = f"{_plural(volatile, 'uncorrectable ECC error')} since the last reset (volatile)"
        what += f", {aggregate} in its lifetime (aggregate)" if aggregate else ""
    else:
        what = f"{_plural(aggregate, 'uncorrectable ECC error')} in its lifetime (aggregate), none since the last reset"
    return HealthIssue(gpu.index, "error", "ecc", f"{_label(gpu)}: {what}",
                       f"ask the provider for another machine: {_label(gpu)} has uncorrectable ECC errors "
                       f"(its memory lost data); to keep using it meanwhile, {_reset(gpu)}")


def _remap(gpu: GpuHealth) -> HealthIssue | None:
    if not gpu.remapped_rows_failure and not gpu.remapped_rows_pending:
        return None
    parts = []
    if gpu.remapped_rows_failure:
        parts.append("row remapping failed (a memory bank has no spare rows left)")
    if gpu.remapped_rows_pending:
        rows = gpu.remapped_rows_uncorrectable
        parts.append("a row remap pending" + (f" ({_plural(rows, 'row')} remapped for uncorrectable errors)"
                                              if rows else ""))
    if gpu.remapped_rows_failure:
        fix = (f"ask the provider for another machine: {_label(gpu)} could not remap a failing memory row, "
               f"NVIDIA's criterion for replacing the GPU")
    else:
        fix = (f"{_reset(gpu)}: a pending row remap takes effect only then; ask the provider for another "
               f"machine if remaps keep coming")
    severity = "error" if gpu.remapped_rows_failure else "warning"
    return HealthIssue(gpu.index, severity, "remap", f"{_label(gpu)}: {' and '.join(parts)}", fix)


def _retired_pages(gpu: GpuHealth) -> HealthIssue | None:
    count = gpu.retired_pages or 0
    if count >= RETIRED_PAGES_LIMIT:
        pending = ", and a retirement pending" if gpu.retired_pages_pending else ""
        return HealthIssue(gpu.index, "error", "retired-pages",
                           f"{_label(gpu)}: {count} retired memory pages{pending}; {RETIRED_PAGES_LIMIT} is the most "
                           f"a GPU can retire, so the next bad page stays in use",
                           f"ask the provider for another machine: {_label(gpu)} has retired {count} memory pages")
    if gpu.retired_pages_pending:
        return HealthIssue(gpu.index, "warning", "retired-pages",
                           f"{_label(gpu)}: a page retirement pending ({_plural(count, 'page')} retired so far)",
                           f"{_reset(gpu)}, so the bad page is retired")
    return None


def _pcie(gpu: GpuHealth) -> HealthIssue | None:
    parts = []
    if gpu.pcie_width_current and gpu.pcie_width_max and gpu.pcie_width_current < gpu.pcie_width_max:
        parts.append(f"PCIe link width x{gpu.pcie_width_current}, the GPU and its slot allow x{gpu.pcie_width_max}")
    if (gpu.pcie_gen_current and gpu.pcie_gen_max and gpu.pcie_gen_current < gpu.pcie_gen_max
            and gpu.performance_state == "P0"):
        parts.append(f"PCIe Gen{gpu.pcie_gen_current} in performance state P0, the GPU and its slot allow "
                     f"Gen{gpu.pcie_gen_max}")
    if not parts:
        return None
    return HealthIssue(gpu.index, "warning", "pcie", f"{_label(gpu)}: {'; '.join(parts)}",
                       f"ask the provider to reseat {_label(gpu)} or its riser (or to check the BIOS PCIe "
                       f"settings), or for another machine: every copy between host and GPU is slower on this link")


def _nvlink(gpu: GpuHealth, machine_has_nvlink: bool) -> HealthIssue | None:
    if not machine_has_nvlink:
        return None
    active, inactive, expected = gpu.nvlinks_active, gpu.nvlinks_inactive, gpu.nvlinks_expected or 0
    if active is None:  # nvlink -s did not list this GPU's links
        return None
    total = max(expected, active + len(inactive))
    if active == 0 and not inactive:
        what = "all NVLink links inactive, while the machine has NVLink"
    elif inactive or active < expected:
        what = f"{active} of {total} NVLink links active"
        if inactive:
            what += f"; {'link' if len(inactive) == 1 else 'links'} {', '.join(map(str, inactive))} inactive"
    else:
        return None
    return HealthIssue(gpu.index, "error", "nvlink", f"{_label(gpu)}: {what}",
                       f"ask the provider for another machine: {_label(gpu)} has NVLink links down, so traffic "
                       f"between GPUs runs slower or over PCIe (a reboot sometimes retrains them; check with "
                       f"nvidia-smi nvlink -s)")


def _slowdown(gpu: GpuHealth) -> HealthIssue | None:
    active = [r for r in gpu.slowdowns_active if r in _SLOWDOWN_TEXT]
    if not active:
        return None
    hardware = [r for r in active if r != "sw_thermal"]
    temperature = f" at {gpu.temperature_c} C" if gpu.temperature_c is not None else ""
    message = f"{_label(gpu)}: clocks held down by {' and '.join(_SLOWDOWN_TEXT[r] for r in active)}{temperature}"
    if not hardware:
        return HealthIssue(gpu.index, "warning", "slowdown", message,
                           f"ask the provider to check the machine's cooling (fans, airflow): the driver is slowing "
                           f"{_label(gpu)} to stay under its temperature limit")
    if "hw_power_brake" in hardware and "hw_thermal" not in hardware:
        cause = "power supply"
    elif "hw_thermal" in hardware and "hw_power_brake" not in hardware:
        cause = "cooling"
    else:
        cause = "cooling and power supply"
    return HealthIssue(gpu.index, "error", "slowdown", message,
                       f"ask the provider to check the machine's {cause}, or for another machine: {_label(gpu)} "
                       f"runs at a fraction of its speed (if nvidia-smi -q -d PERFORMANCE still shows it a minute "
                       f"later, it is not a passing clock change)")


def _mig(gpu: GpuHealth, wants_mig: bool) -> HealthIssue | None:
    if not gpu.mig_enabled or wants_mig:
        return None
    return HealthIssue(gpu.index, "warning", "mig-mode",
                       f"{_label(gpu)}: MIG mode is enabled but this node is not configured for MIG (left over by "
                       f"the last tenant?): whole-GPU pods cannot use it",
                       f"sudo nvidia-smi -i {_target(gpu)} -mig 0, then {_reset(gpu)}")


def _compute_mode(gpu: GpuHealth) -> HealthIssue | None:
    if gpu.compute_mode is None or gpu.compute_mode == "Default":
        return None
    effect = _COMPUTE_MODE_TEXT.get(gpu.compute_mode, "pods may not be able to share or use it")
    return HealthIssue(gpu.index, "warning", "compute-mode",
                       f"{_label(gpu)}: compute mode {gpu.compute_mode}, not Default (left over by the last "
                       f"tenant?): {effect}",
                       f"sudo nvidia-smi -i {_target(gpu)} -c DEFAULT")


def _persistence(gpu: GpuHealth) -> HealthIssue | None:
    if gpu.persistence_mode is not False:
        return None
    return HealthIssue(gpu.index, "warning", "persistence",
                       f"{_label(gpu)}: persistence mode off: the driver tears the GPU down whenever no process "
                       f"holds it, and each pod start waits for it to come up again",
                       f"sudo systemctl enable --now nvidia-persistenced (or, until the next reboot, "
                       f"sudo nvidia-smi -i {_target(gpu)} -pm 1)")


def _xid_fix(xid: int, label: str, gpu: GpuHealth | None, sample: str) -> str:
    meaning = XID_MEANINGS.get(xid)
    named = f"Xid {xid} ({meaning})" if meaning else f"Xid {xid}"
    reset = _reset(gpu) if gpu is not None else "reboot"
    a_reset = f"a GPU reset ({_reset_command(gpu)}) or a reboot" if gpu is not None else "a reboot"
    if xid in XID_ERRORS:
        hint = {
            63: f"; to keep using it meanwhile, {reset} so the remap or retirement takes effect",
            79: "; it is gone from the bus until a reboot, and a GPU that fell off once usually does again",
            119: f"; {a_reset} may clear it, a driver update if it recurs",
            154: f"; its log line says what clears it: {a_reset}",
        }.get(xid, "")
        return (f"ask the provider for another machine: {label} logged {named}{hint} "
                f"(the kernel log keeps the line until the next reboot)")
    if xid in XID_WARNINGS:
        program = f" ({sample})" if sample else ""
        return (f"check the program named in the kernel log line{program}: {named} is usually the application's "
                f"fault; if it keeps coming with programs that run fine elsewhere, ask the provider for another "
                f"machine")
    return f"see NVIDIA's Xid catalogue ({XID_CATALOGUE}) for Xid {xid}; ask the provider about {label} if it repeats"


def _xids(gpus: list[GpuHealth], xids: list[XidEvent]) -> list[HealthIssue]:
    by_pci = {pci_key(g.pci_bus_id): g for g in gpus if pci_key(g.pci_bus_id) is not None}
    groups: OrderedDict[tuple, list[XidEvent]] = OrderedDict()
    for event in xids:
        groups.setdefault((pci_key(event.pci) or event.pci, event.xid), []).append(event)
    issues = []
    for (key, xid), events in groups.items():
        gpu = by_pci.get(key)
        meaning = XID_MEANINGS.get(xid)
        named = f"Xid {xid} ({meaning})" if meaning else f"Xid {xid}"
        count = len(events)
        times = "once" if count == 1 else (f"{count} or more times" if count >= XID_EVENTS_PER_KIND
                                           else f"{count} times")
        instances = sorted({e.gpu_instance for e in events if e.gpu_instance is not None})
        where = f" (MIG GPU instance {', '.join(map(str, instances))})" if instances else ""
        if gpu is not None:
            label = _label(gpu)
            message = f"{label}: {named} in the kernel log, {times}{where}"
        else:
            label = f"the GPU at PCI {events[0].pci}"
            message = (f"{named} in the kernel log, {times}{where}, for PCI {events[0].pci}, a GPU nvidia-smi "
                       f"does not list")
        severity = "error" if xid in XID_ERRORS else "warning"
        issues.append(HealthIssue(gpu.index if gpu is not None else None, severity, "xid", message,
                                  _xid_fix(xid, label, gpu, _program(events[-1].text))))
    return issues


def _program(text: str) -> str:
    """The "pid=..., name=..." of an Xid line's text, when it has them."""
    fields = [part.strip() for part in text.split(",")[:2]]
    return ", ".join(f for f in fields if f.startswith(("pid=", "name="))) if fields else ""


def _coerce(cls, value):
    """`value` as a `cls` (GpuHealth or XidEvent), also from its to_dict(); None if neither."""
    if isinstance(value, cls):
        return value
    try:
        return cls.from_dict(value) if isinstance(value, dict) else None
    except TypeError:
        return None


def health_issues(gpus: list[GpuHealth], xids: list[XidEvent], *, wants_mig: bool = False,
                  expected_gpus: int | None = None, expected_from: str = "") -> list[HealthIssue]:
    """The node's issues: the GPU count first, then each GPU's in check order, then the Xids.
    `expected_from`: who says `expected_gpus` (the inventory, the node's own PCI bus).
    GpuHealth/XidEvent as dicts (their to_dict(), e.g. facts read back from JSON) are taken too."""
    gpus = [g for g in (_coerce(GpuHealth, g) for g in gpus or []) if g is not None]
    xids = [x for x in (_coerce(XidEvent, x) for x in xids or []) if x is not None]
    issues: list[HealthIssue] = []
    if expected_gpus is not None and len(gpus) < expected_gpus:
        issues.append(HealthIssue(None, "error", "gpu-count",
                                  f"{_plural(len(gpus), 'GPU')} visible to nvidia-smi, {expected_gpus} expected"
                                  + (f" ({expected_from})" if expected_from else ""),
                                  "ask the provider for another machine, or to attach the missing GPU: compare "
                                  "`lspci -d 10de:` (every NVIDIA device, NVSwitches too) with `nvidia-smi -L`; a "
                                  "GPU that fell off the bus comes back only after a reboot, if at all"))
    machine_has_nvlink = any(g.nvlinks_active for g in gpus) or any(g.nvlinks_expected for g in gpus)
    for gpu in gpus:
        for issue in (_ecc(gpu), _remap(gpu), _retired_pages(gpu), _pcie(gpu), _nvlink(gpu, machine_has_nvlink),
                      _slowdown(gpu), _mig(gpu, wants_mig), _compute_mode(gpu), _persistence(gpu)):
            if issue is not None:
                issues.append(issue)
    issues += _xids(gpus, xids)
    return issues
