"""Host facts as text for people: one block per host, the facts that decide what `up` does."""

from __future__ import annotations

from collections import Counter

from bootstrap.console_text import printable
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.checks.gpu_health import health_issues
from bootstrap.checks.node_addresses import host_interface


def _gib(mib: int | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.0f} GiB"


def describe_gpus(facts: HostFacts) -> str:
    if facts.gpu_error:
        return f"nvidia-smi fails: {facts.gpu_error}"
    if not facts.gpus:
        return "none"
    models = Counter((g.name, g.memory_mib) for g in facts.gpus)
    parts = [f"{count} x {name} ({mem} MiB)" for (name, mem), count in models.items()]
    first = facts.gpus[0]
    mig = "MIG " + ("on" if first.mig_current else "off")
    if first.mig_pending is not None and first.mig_pending != first.mig_current:
        mig += f" (pending {'on' if first.mig_pending else 'off'})"
    if not facts.mig_capable:
        mig = "no MIG"
    return (f"{', '.join(parts)}; driver {facts.driver_version or '?'}, CUDA {facts.cuda_version or '?'}, "
            f"compute {first.compute_capability or '?'}, {mig}")


def describe_mig_profiles(facts: HostFacts) -> str | None:
    seen: dict[str, str] = {}
    for profile in facts.mig_profiles:
        seen.setdefault(profile.name, f"{profile.name} x{profile.instances_total}")
    return ", ".join(seen.values()) or None


def describe_rdma(facts: HostFacts) -> str:
    if not facts.rdma:
        return "none"
    return ", ".join(f"{d.name}/{d.port} {d.link_layer or '?'} {d.state or '?'}"
                     + (f" ({', '.join(d.netdevs)})" if d.netdevs else "") for d in facts.rdma)


def describe_k3s(facts: HostFacts) -> str:
    if facts.k3s is None:
        return "not installed"
    units = ", ".join(f"{u.name} {u.active_state}" for u in facts.k3s.units) or "no unit"
    return f"{facts.k3s.version or 'unknown version'} at {facts.k3s.binary or '?'}; {units}"


def describe_addresses(facts: HostFacts) -> str:
    if facts.addresses is None:
        return "unknown (ip failed)"
    own = [f"{a.interface} {a.address}/{a.prefix}" for a in facts.addresses
           if a.scope == "global" and host_interface(a.interface)]
    return ", ".join(own) or "none"


def describe_health(facts: HostFacts) -> list[str]:
    """The GPUs' health on their own (preflight also compares a node with its siblings)."""
    if facts.gpu_health is None:
        return []
    issues = health_issues(facts.gpu_health, facts.xids or [])
    if not issues:
        return [f"ok ({len(facts.gpu_health)} GPU(s): ECC, row remaps, PCIe, NVLink, slowdowns, Xid)"]
    return [f"{i.severity}: {i.message}" for i in issues]


def render_host(name: str, address: str, facts: HostFacts) -> str:
    disk = facts.disk_free_gib.get("/")
    rows = [
        ("os", f"{facts.os_pretty or facts.os_id or '?'} {facts.arch or '?'}, kernel {facts.kernel or '?'}"),
        ("machine", f"{facts.cpus or '?'} CPUs, {_gib(facts.memory_mib)} RAM, "
                    f"{'?' if disk is None else f'{disk:.0f} GiB'} free on /, swap {_gib(facts.swap_mib)}"),
        ("gpus", describe_gpus(facts)),
    ]
    profiles = describe_mig_profiles(facts)
    if profiles:
        rows.append(("mig profiles", profiles))
    health = describe_health(facts)
    if health:
        rows += [("health" if i == 0 else "", line) for i, line in enumerate(health)]
    rows += [("addresses", describe_addresses(facts)), ("rdma", describe_rdma(facts)), ("k3s", describe_k3s(facts))]
    if facts.sudo_ok is False:
        rows.append(("sudo", f"not usable without a password: {facts.sudo_error}"))
    if facts.manifest_error:
        rows.append(("manifest", f"refused: {facts.manifest_error}"))
    width = max(len(label) for label, _ in rows)
    # Every value is what the host answered: one printable line each, whatever it holds.
    lines = [f"{name} ({address}) hostname {printable(facts.hostname or '?')}"]
    lines += [f"  {label.ljust(width)}  {printable(value)}" for label, value in rows]
    return "\n".join(lines)
