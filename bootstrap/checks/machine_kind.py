"""Can this machine run k3s? Pure: a host's facts in, a verdict out.

Several GPU clouds sell containers as "GPU pods" (vllm-project/production-stack#357): no
systemd as PID 1, the cgroup hierarchy read-only, no CAP_NET_ADMIN or CAP_SYS_ADMIN. k3s
cannot run there: it needs to be a privileged process with the kernel's cgroups and network
to itself (k3s-io/docs docs/advanced.md, "Running K3s in Docker": `--privileged`; a k3s
maintainer in k3s-io/k3s discussion #12820: "If you are running k3s sandboxed or within a
container, it needs to be privileged"), and this tool runs it as a systemd service.

So the judgement is by what k3s needs, not by the word "container": a systemd container
with those capabilities (a privileged LXC, the test lab's systemd-nspawn machines) passes,
with a note saying what it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.host.facts.host_facts import HostFacts

RENT_INSTEAD = ("rent a VM or bare-metal offer instead (the provider's VM / bare-metal instance type, not a "
                "\"pod\" or \"container\" one): k3s needs its own systemd, cgroups and network stack")


@dataclass(frozen=True)
class Verdict:
    severity: str  # "error": k3s cannot run here; "info": a container that can run it
    message: str
    fix: str | None = None


def container_evidence(host: HostFacts) -> list[str]:
    """What says this machine is a container, in the words of the source."""
    m = host.machine
    if m is None:
        return []
    found = [f"systemd-detect-virt --container: {m.container}"] if m.container not in (None, "none") else []
    return found + [f"{path} exists" for path in m.markers]


def missing(host: HostFacts) -> list[str]:
    """What k3s needs that this machine lacks (only what the probe could tell)."""
    out = []
    if not host.has_systemd:
        out.append(f"PID 1 is {host.init_process or 'unknown'}, not systemd (k3s runs as a systemd service)")
    m = host.machine
    if m is None:
        return out
    if m.cgroup is None:
        out.append("no cgroup hierarchy is mounted at /sys/fs/cgroup (kubelet puts every pod in a cgroup)")
    elif m.cgroup_writable == "none":
        out.append(f"cgroup {m.cgroup} is mounted read-only (kubelet creates a cgroup per pod)")
    if m.netns is False:
        out.append("no network namespace can be made, even as root (every pod gets its own)")
    if m.netfilter == "denied":
        out.append("iptables is refused even as root (kube-proxy and flannel write netfilter rules: no CAP_NET_ADMIN)")
    return out


def unchecked(host: HostFacts) -> list[str]:
    m = host.machine
    if m is None:
        return ["the container checks (an older probe)"]
    return ([] if m.netns is not None else ["network namespaces"]) + \
        ([] if m.netfilter is not None else ["netfilter"])


def judge(host: HostFacts) -> list[Verdict]:
    """An error naming what was found and what is missing; a note for a container that has
    everything k3s needs; nothing for a plain VM or bare-metal machine."""
    evidence = container_evidence(host)
    lacking = missing(host)
    if lacking:
        kind = f"a container ({'; '.join(evidence)}) " if evidence else "a machine "
        return [Verdict("error", f"{kind}that cannot run k3s: {'; '.join(lacking)}", RENT_INSTEAD)]
    m = host.machine
    if m is not None and m.cgroup_writable == "some":
        # systemd-nspawn on a cgroup-v1 host (the test lab's machines): the container's systemd
        # has its own writable hierarchy, the controllers are read-only. Real k3s's kubelet
        # cannot create its pods' cgroups there; a warning, not a refusal, as such a machine is
        # a deliberate setup rather than a "GPU pod" (which no systemd runs).
        kind = f"a container ({'; '.join(evidence)}) whose " if evidence else ""
        return [Verdict("warning", f"{kind}cgroup v1 controllers are mounted read-only ({', '.join(m.read_only)}): "
                        "kubelet cannot create pod cgroups in them, so real k3s will fail its pods here",
                        "rent a VM or bare-metal offer, or give the container writable cgroups "
                        "(a cgroup v2 host delegates them to a systemd container)")]
    if not evidence:
        return []
    note = (f"a container ({'; '.join(evidence)}) with what k3s needs: systemd as PID 1, writable cgroup "
            f"{m.cgroup}" + ("" if m.netns is None else ", network namespaces")
            + ("" if m.netfilter != "ok" else ", netfilter"))
    not_checked = unchecked(host)
    return [Verdict("info", note + (f" (not checked without root: {', '.join(not_checked)})" if not_checked else ""))]
