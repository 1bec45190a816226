"""Does a MIG layout fit a GPU? Checked against the GPU's real profile table (counts and
placements from `nvidia-smi mig -lgip/-lgipp`), not against a table of GPU models.

Layout names follow mig-parted's defaults: `all-disabled`, `all-enabled`, `all-balanced`
and `all-<profile>` (every GPU cut into as many <profile> instances as fit).
"""

from __future__ import annotations

import re
from collections import Counter

from bootstrap.host.facts.host_facts import MigProfile
from bootstrap.inventory.model import Mig


class MigMisfit(ValueError):
    """The request cannot be laid out on this GPU; the message says why, with what it has."""


def table_for_gpu(profiles: list[MigProfile], gpu_index: int = 0) -> dict[str, MigProfile]:
    return {p.name: p for p in profiles if p.gpu_index == gpu_index}


def _slices(name: str) -> int:
    match = re.match(r"(\d+)g\.", name)
    return int(match.group(1)) if match else 0


def balanced(table: dict[str, MigProfile]) -> Counter:
    """mig-parted's all-balanced: 2 x smallest 1g, 1 x 2g, 1 x 3g (H100/H200/A100 alike)."""
    def smallest(slices: int) -> str | None:
        names = [n for n in table if _slices(n) == slices and "+" not in n]
        return min(names, key=lambda n: table[n].memory_gib or 0) if names else None

    wanted = Counter()
    for slices, count in ((1, 2), (2, 1), (3, 1)):
        name = smallest(slices)
        if name is None:
            raise MigMisfit(f"all-balanced needs a {slices}g profile; this GPU has {_names(table)}")
        wanted[name] += count
    return wanted


def requested(mig: Mig, table: dict[str, MigProfile]) -> Counter:
    """Instances per GPU that the layout or profiles ask for."""
    if mig.profiles:
        return Counter(mig.profiles)
    layout = mig.layout or ""
    if layout in ("all-disabled", "all-enabled"):
        return Counter()
    if layout == "all-balanced":
        return balanced(table)
    if layout.startswith("all-"):
        name = profile_of_layout(layout, table)
        if name is None:
            raise MigMisfit(f"layout {layout}: this GPU has no {layout[len('all-'):]} profile; it has {_names(table)}")
        return Counter({name: table[name].instances_total})
    raise MigMisfit(f"unknown MIG layout {layout!r}; use all-disabled, all-balanced or all-<profile> "
                    f"(this GPU: {', '.join(map(layout_name, table))}), or profiles: {{...}}")


def layout_name(profile: str) -> str:
    """mig-parted's name for the layout of one profile on every GPU: '+' is spelled '.'
    (NVIDIA/mig-parted deployments/systemd/config-default.yaml, v0.15.0: `all-1g.5gb.me`)."""
    return "all-" + profile.replace("+", ".")


def profile_of_layout(layout: str, table: dict[str, MigProfile]) -> str | None:
    return next((name for name in table if layout_name(name) == layout), None)


def _names(table: dict[str, MigProfile]) -> str:
    return ", ".join(f"{n} x{p.instances_total}" for n, p in table.items()) or "no MIG profiles"


def place(wanted: Counter, table: dict[str, MigProfile]) -> list[tuple[str, int, int]]:
    """Assign each instance a placement (start, size) with no overlap, or raise MigMisfit.

    Placements are memory slices; an exhaustive search is tiny (at most 7 instances on
    8 slices), and it is what the driver itself will refuse if we get it wrong.
    """
    for name, count in wanted.items():
        if name not in table:
            raise MigMisfit(f"this GPU has no {name} profile; it has {_names(table)}")
        if count > table[name].instances_total:
            raise MigMisfit(f"{count} x {name} asked, this GPU fits at most {table[name].instances_total}")
        if not table[name].placements:
            raise MigMisfit(f"no placements known for {name} (nvidia-smi mig -lgipp printed none)")
    if sum(_slices(n) * c for n, c in wanted.items()) > 7:
        raise MigMisfit(f"{_describe(wanted)} needs {sum(_slices(n) * c for n, c in wanted.items())} "
                        "compute slices; a GPU has 7")
    # Largest first: fewer choices, so failures surface early.
    instances = sorted(wanted.elements(), key=lambda n: -max(s for _, s in table[n].placements))
    chosen: list[tuple[str, int, int]] = []

    def search(i: int, used: int) -> bool:
        if i == len(instances):
            return True
        name = instances[i]
        for start, size in table[name].placements:
            mask = ((1 << size) - 1) << start
            if used & mask:
                continue
            chosen.append((name, start, size))
            if search(i + 1, used | mask):
                return True
            chosen.pop()
        return False

    if not search(0, 0):
        raise MigMisfit(f"{_describe(wanted)} do not fit together on this GPU's memory slices "
                        f"(placements from nvidia-smi mig -lgipp)")
    return chosen


def _describe(wanted: Counter) -> str:
    return " + ".join(f"{c} x {n}" for n, c in wanted.items())


def check_layout(mig: Mig, profiles: list[MigProfile], gpu_index: int = 0) -> Counter:
    """The instances per GPU the layout gives, after proving they fit; raises MigMisfit."""
    table = table_for_gpu(profiles, gpu_index)
    if not table:
        raise MigMisfit("this GPU reports no MIG profiles (not MIG-capable)")
    wanted = requested(mig, table)
    place(wanted, table)
    return wanted
