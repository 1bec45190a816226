"""Pure parsers, one per probe source. Input: the output lines of one command.

They never raise on unexpected input: hosts are rented from many providers, and a fact that
crashes on one odd line would fail the whole host. Lines that do not fit are skipped, and
empty or garbage input gives the empty/None result.
"""

from __future__ import annotations

import csv
import ipaddress
import re
import shlex
from collections.abc import Iterable
from dataclasses import replace
from typing import NamedTuple

from .host_facts import (ContainerdConfig, FileState, Gpu, InterfaceAddress, ListeningPort, MachineKind, MigProfile,
                         PciDevice, RdmaDevice, Route, SystemdUnit)

# What nvidia-smi prints for a value the GPU or driver does not have.
_NA = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]"}


# A number a host prints: ASCII digits, at most 20 (int() would take '١٢', '1_000' and, past
# 4300 digits, raise ValueError).
_INT = re.compile(r"[+-]?[0-9]{1,20}")


def _int(text: str | None) -> int | None:
    text = str(text).strip() if text is not None else ""
    return int(text) if _INT.fullmatch(text) else None


def _clean(lines: Iterable[str] | None) -> list[str]:
    return [str(line).rstrip("\r\n") for line in (lines or [])]


def _natural_key(text: str) -> list:
    # mlx5_2 before mlx5_10
    # (kind, value) pairs: a digit run the host made too long stays text and still compares.
    return [(0, int(part)) if re.fullmatch(r"[0-9]{1,18}", part) else (1, part)
            for part in re.split(r"([0-9]+)", text)]


def first_meaningful_line(lines: Iterable[str] | None) -> str | None:
    """First line with words in it (skips blank lines and table borders)."""
    for line in _clean(lines):
        text = line.strip().strip("|").strip()
        if re.search(r"[A-Za-z0-9]", text):
            return text
    return None


# --- system -------------------------------------------------------------------------


def parse_os_release(lines: Iterable[str] | None) -> dict[str, str]:
    """/etc/os-release: KEY=value, value optionally shell-quoted."""
    result: dict[str, str] = {}
    for line in _clean(lines):
        key, sep, value = line.strip().partition("=")
        if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            continue
        try:
            parts = shlex.split(value)
            result[key] = parts[0] if len(parts) == 1 else value.strip("\"'")
        except ValueError:
            result[key] = value.strip("\"'")
    return result


class Uname(NamedTuple):
    hostname: str
    kernel: str
    machine: str


def parse_uname(lines: Iterable[str] | None) -> Uname | None:
    """`uname -n -r -m` ("vm 6.8.0 x86_64"), or `uname -a` as recorded in the fixtures."""
    for line in _clean(lines):
        fields = line.split()
        if len(fields) == 3:
            return Uname(*fields)
        # uname -a: s n r v... m [p i] o. The version has spaces and GNU leaves out p and i
        # when they are "unknown", but the field before the OS name is always m (or i == m).
        if len(fields) >= 6 and fields[0] == "Linux":
            return Uname(fields[1], fields[2], fields[-2])
    return None


_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def normalise_arch(machine: str | None) -> str | None:
    """`uname -m` to the Go/Kubernetes name used in download URLs; unknown ones as is."""
    if not machine:
        return None
    return _ARCH.get(machine, machine)


def parse_first_int(lines: Iterable[str] | None) -> int | None:
    """`nproc`, `id -u`: the first line that is a whole number."""
    for line in _clean(lines):
        value = _int(line)
        if value is not None:
            return value
    return None


def parse_first_word(lines: Iterable[str] | None) -> str | None:
    """`cat /proc/1/comm`."""
    for line in _clean(lines):
        if line.strip():
            return line.split()[0]
    return None


def parse_machine_id(lines: Iterable[str] | None) -> str | None:
    """`cat /etc/machine-id`: 32 lowercase hex digits; "uninitialized" (a first boot) or
    anything else is unknown."""
    word = parse_first_word(lines)
    return word if word and re.fullmatch(r"[0-9a-f]{32}", word) else None


_CONTAINER = re.compile(r"[a-z][a-z0-9-]{0,31}")
_MARKERS = ("/.dockerenv", "/run/.containerenv")
_CGROUP_ROOT = "/sys/fs/cgroup"
_VERDICTS = {"ok": True, "denied": False}


def _cgroup_mount(words: list[str]) -> tuple[str, str, bool] | None:
    """One /proc/self/mountinfo line ("36 25 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2
    rw"): (mount point, fstype, read-write), or None when it is not such a line."""
    if "-" not in words[6:]:
        return None
    dash = words.index("-", 6)
    if len(words) < dash + 2 or not (words[4] == _CGROUP_ROOT or words[4].startswith(_CGROUP_ROOT + "/")):
        return None
    return words[4], words[dash + 1], "rw" in words[5].split(",")


def _cgroup(mounts: list[tuple[str, str, bool]]) -> tuple[str | None, str | None, list[str]]:
    """v2: /sys/fs/cgroup is cgroup2, writable as that mount is. v1 (or hybrid): the cgroup
    mounts below it (controllers, name=systemd, unified): "all", "none" or "some" writable."""
    root = next((m for m in mounts if m[0] == _CGROUP_ROOT), None)
    if root and root[1] == "cgroup2":
        return "v2", "all" if root[2] else "none", [] if root[2] else ["/"]
    below = [m for m in mounts if m[1] in ("cgroup", "cgroup2") and m[0] != _CGROUP_ROOT]
    if not any(m[1] == "cgroup" for m in below):
        return None, None, []
    read_only = sorted(m[0][len(_CGROUP_ROOT) + 1:] for m in below if not m[2])
    return "v1", "all" if not read_only else "none" if len(read_only) == len(below) else "some", read_only


def parse_machine(lines: Iterable[str] | None) -> MachineKind:
    """The probe's "machine" section: "virt <word>", "marker <path>", "cgroup <mountinfo
    line>", "netns ok|denied|unknown", "netfilter ok|denied|missing|unknown". Each word is
    one the probe prints or it is unknown: a host cannot make a container look like a VM by
    printing something else, only by printing the VM's words (its own machine, its own risk)."""
    container, markers, mounts, netns, netfilter = None, set(), [], None, None
    for line in _clean(lines):
        words = line.split()
        if len(words) == 2 and words[0] == "virt" and _CONTAINER.fullmatch(words[1]):
            container = words[1]
        elif len(words) == 2 and words[0] == "marker" and words[1] in _MARKERS:
            markers.add(words[1])
        elif len(words) >= 2 and words[0] == "cgroup" and len(mounts) < 64:
            mount = _cgroup_mount(words[1:])
            if mount:
                mounts.append(mount)
        elif len(words) == 2 and words[0] == "netns":
            netns = _VERDICTS.get(words[1])
        elif len(words) == 2 and words[0] == "netfilter" and words[1] in ("ok", "denied", "missing"):
            netfilter = words[1]
    cgroup, writable, read_only = _cgroup(mounts)
    return MachineKind(container, sorted(markers), cgroup, writable, read_only, netns, netfilter)


def parse_meminfo(lines: Iterable[str] | None) -> dict[str, int]:
    """/proc/meminfo: {"MemTotal": kB, "SwapTotal": kB, ...}."""
    result: dict[str, int] = {}
    for line in _clean(lines):
        match = re.match(r"^(\w+(?:\(\w+\))?):\s+([0-9]{1,20})(?:\s+kB)?\s*$", line)
        if match:
            result[match[1]] = int(match[2])
    return result


class DfEntry(NamedTuple):
    filesystem: str
    size_kib: int
    avail_kib: int
    mount: str


def parse_df(lines: Iterable[str] | None) -> list[DfEntry]:
    """`df -P -k PATH...`: one line per PATH, in argument order."""
    entries = []
    for line in _clean(lines):
        fields = line.split()
        # Anchor on the "NN%" capacity column so spaces in the device or mount still parse.
        cap = next((i for i, f in enumerate(fields) if re.fullmatch(r"\d+%|-", f)), None)
        if cap is None or cap < 4 or cap + 1 >= len(fields):
            continue
        size, avail = _int(fields[cap - 3]), _int(fields[cap - 1])
        if size is None or avail is None:
            continue
        fs = " ".join(fields[: cap - 3])
        entries.append(DfEntry(fs, size, avail, " ".join(fields[cap + 1 :])))
    return entries


def parse_commands(lines: Iterable[str] | None) -> dict[str, str]:
    """`printf '%s: ' c; command -v c || echo missing` lines -> {found name: path}."""
    result = {}
    for line in _clean(lines):
        name, sep, path = line.partition(": ")
        path = path.strip()
        if sep and name and " " not in name and path.startswith("/"):
            result[name] = path
    return result


_PACKAGE_MANAGERS = (("apt-get", "apt"), ("dnf", "dnf"), ("yum", "yum"), ("zypper", "zypper"), ("apk", "apk"))


def package_manager(commands: dict[str, str]) -> str | None:
    return next((pm for tool, pm in _PACKAGE_MANAGERS if tool in commands), None)


# --- NVIDIA ---------------------------------------------------------------------------


def parse_nvidia_smi_header(lines: Iterable[str] | None) -> tuple[str | None, str | None]:
    """Plain `nvidia-smi`: (driver version, CUDA version) from its banner."""
    text = "\n".join(_clean(lines))
    driver = re.search(r"Driver Version:\s*(\d[\w.-]*)", text)
    cuda = re.search(r"CUDA Version:\s*(\d[\d.]*)", text)
    return (driver[1] if driver else None, cuda[1] if cuda else None)


def _na(value: str | None) -> str | None:
    if value is None or value.strip().lower() in _NA:
        return None
    return value.strip()


def _mode(value: str | None) -> bool | None:
    value = _na(value)
    return None if value is None else value.lower() == "enabled"


def _mib(value: str | None) -> int | None:
    value = _na(value)
    return _int(value.split()[0]) if value else None


def parse_gpu_query(lines: Iterable[str] | None) -> list[Gpu]:
    """`nvidia-smi --query-gpu=... --format=csv`: header names pick the columns, so any
    field order or subset works ("memory.total [MiB]" -> "memory.total")."""
    header: list[str] | None = None
    gpus = []
    for line in _clean(lines):
        try:
            cells = [c.strip() for c in next(csv.reader([line], skipinitialspace=True), [])]
        except csv.Error:
            continue
        if header is None:
            names = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
            if "index" in names or "uuid" in names:
                header = names
            continue
        if len(cells) != len(header):
            continue
        col = dict(zip(header, cells))
        index = _int(col.get("index"))
        if index is None:
            continue
        gpus.append(
            Gpu(
                index=index,
                uuid=_na(col.get("uuid")) or "",
                name=_na(col.get("name")) or "",
                pci_bus_id=_na(col.get("pci.bus_id")) or "",
                memory_mib=_mib(col.get("memory.total")),
                driver_version=_na(col.get("driver_version")),
                mig_current=_mode(col.get("mig.mode.current")),
                mig_pending=_mode(col.get("mig.mode.pending")),
                compute_capability=_na(col.get("compute_cap")),
                persistence_mode=_mode(col.get("persistence_mode")),
                vbios_version=_na(col.get("vbios_version")),
            )
        )
    return gpus


# "|   0  MIG 1g.18gb+me      20     1/1        16.00      No     16     1     0   |"
_LGIP_ROW = re.compile(r"^\|\s*([0-9]{1,9})\s+MIG\s+(\S+)\s+([0-9]{1,9})\s+([0-9]{1,9})/([0-9]{1,9})\s+"
                       r"([0-9]{1,9}(?:\.[0-9]{1,9})?)\s")


def parse_mig_profiles(lines: Iterable[str] | None) -> list[MigProfile]:
    """`nvidia-smi mig -lgip`: the GPU instance profiles table (placements left empty)."""
    profiles = []
    for line in _clean(lines):
        m = _LGIP_ROW.match(line.strip())
        if m:
            profiles.append(
                MigProfile(
                    gpu_index=int(m[1]),
                    name=m[2],
                    profile_id=int(m[3]),
                    instances_free=int(m[4]),
                    instances_total=int(m[5]),
                    memory_gib=float(m[6]),
                )
            )
    return profiles


# "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1" / "GPU  0 Profile ID  5 Placement : {0}:4"
_LGIPP_ROW = re.compile(r"^GPU\s+([0-9]{1,9})\s+Profile ID\s+([0-9]{1,9})\s+Placements?\s*:\s*"
                        r"\{((?:\s*[0-9]{1,9}\s*,)*\s*[0-9]{0,9}\s*)\}:([0-9]{1,9})")


def parse_mig_placements(lines: Iterable[str] | None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """`nvidia-smi mig -lgipp`: {(gpu index, profile id): [(start, size), ...]}."""
    result: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for line in _clean(lines):
        m = _LGIPP_ROW.match(line.strip())
        if m:
            size = int(m[4])
            starts = [int(s) for s in m[3].replace(" ", "").split(",") if s]
            result[(int(m[1]), int(m[2]))] = [(start, size) for start in starts]
    return result


def with_placements(
    profiles: list[MigProfile], placements: dict[tuple[int, int], list[tuple[int, int]]]
) -> list[MigProfile]:
    return [replace(p, placements=placements.get((p.gpu_index, p.profile_id), [])) for p in profiles]


# --- RDMA -----------------------------------------------------------------------------

# Anchored on ".../infiniband/" rather than "/sys/class/" so tests can point the probe's
# listing at a fake sysfs tree.
_IB_PORT_FILE = re.compile(r"^/\S*/infiniband/([^/]+)/ports/([0-9]{1,5})/(link_layer|state):(.*)$")
_IB_NETDEV = re.compile(r"^/\S*/infiniband/([^/]+)/device/net/([^/\s]+)$")


def parse_rdma(lines: Iterable[str] | None) -> list[RdmaDevice]:
    """Probe's sysfs listing: "<path>/ports/N/link_layer:InfiniBand",
    "<path>/ports/N/state:4: ACTIVE" and "<path>/device/net/<netdev>" lines."""
    ports: dict[tuple[str, int], dict[str, str]] = {}
    netdevs: dict[str, list[str]] = {}
    for line in _clean(lines):
        line = line.strip()
        if m := _IB_PORT_FILE.match(line):
            value = m[4].strip()
            if m[3] == "state":
                value = value.split(":", 1)[-1].strip()  # "4: ACTIVE" -> "ACTIVE"
            ports.setdefault((m[1], int(m[2])), {})[m[3]] = value
        elif m := _IB_NETDEV.match(line):
            netdevs.setdefault(m[1], []).append(m[2])
    return [
        RdmaDevice(
            name=dev,
            port=port,
            link_layer=attrs.get("link_layer") or None,
            state=attrs.get("state") or None,
            netdevs=sorted(netdevs.get(dev, []), key=_natural_key),
        )
        for (dev, port), attrs in sorted(ports.items(), key=lambda kv: (_natural_key(kv[0][0]), kv[0][1]))
    ]


# --- k3s ------------------------------------------------------------------------------


def parse_nvidia_pci(lines: Iterable[str] | None) -> list[PciDevice]:
    """`<bus> device=0x2335 class=0x030200 driver=nvidia` lines (also the fixture's
    sys-pci-nvidia format, which adds vendor= and numa= fields)."""
    devices = []
    for line in _clean(lines):
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        if "device" in fields and "class" in fields:
            devices.append(PciDevice(line.split()[0], fields["device"], fields["class"], fields.get("driver") or None))
    return devices


class K3sFiles(NamedTuple):
    binary: str | None
    version: str | None
    config_present: bool
    node_ip: str | None = None
    embedded_registry: bool | None = None


def _node_ip(value: str) -> str | None:
    """config.yaml's `node-ip:` value as the tool writes it (one IP, maybe quoted), canonical;
    None for anything else (a list, a comma list, garbage). At most 64 characters are read."""
    text = value.strip()[:64].strip("'\"")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def parse_k3s(lines: Iterable[str] | None) -> K3sFiles:
    """Probe's k3s section: "binary: PATH", `k3s --version` output, "config: present", and
    config.yaml's first `node-ip:` and `embedded-registry:` lines (the tool writes `true`)."""
    binary = version = node_ip = mirror = None
    config = False
    for line in _clean(lines):
        line = line.strip()
        if line.startswith("binary: /"):
            binary = line.split(": ", 1)[1]
        elif m := re.match(r"^k3s version (v\S+)", line):
            version = m[1]
        elif line == "config: present":
            config = True
        elif line.startswith("node-ip:") and node_ip is None:
            node_ip = _node_ip(line[len("node-ip:"):])
        elif line.startswith("embedded-registry:") and mirror is None:
            mirror = line[len("embedded-registry:"):].strip()[:8].strip("'\"").lower() == "true"
    return K3sFiles(binary, version, config, node_ip, mirror)


def parse_systemd_units(lines: Iterable[str] | None) -> list[SystemdUnit]:
    """`systemctl show -p Id -p LoadState -p ActiveState -p UnitFileState A B`: one
    KEY=value block per unit, blocks separated by a blank line."""
    units = []
    block: dict[str, str] = {}
    for line in [*_clean(lines), ""]:
        key, sep, value = line.strip().partition("=")
        if sep and re.fullmatch(r"[A-Za-z]+", key):
            block[key] = value
            continue
        if not line.strip() and block.get("Id"):
            units.append(
                SystemdUnit(
                    name=block["Id"],
                    load_state=block.get("LoadState") or None,
                    active_state=block.get("ActiveState") or None,
                    unit_file_state=block.get("UnitFileState") or None,
                )
            )
        if not line.strip():
            block = {}
    return units


# --- listening sockets ----------------------------------------------------------------


def parse_ss(lines: Iterable[str] | None) -> list[ListeningPort]:
    """`ss -Hltunp`: "tcp LISTEN 0 4096 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=1,fd=3))"."""
    result = []
    for line in _clean(lines):
        fields = line.split()
        if len(fields) < 6 or fields[0] not in ("tcp", "udp") or fields[1] not in ("LISTEN", "UNCONN"):
            continue
        address, _, port_text = fields[4].rpartition(":")
        port = _int(port_text)
        if port is None:
            continue
        owner = re.search(r'\(\("([^"]*)",pid=([0-9]{1,10})', " ".join(fields[6:]))
        result.append(
            ListeningPort(
                proto=fields[0],
                port=port,
                address=address.strip("[]"),
                process=owner[1] if owner else None,
                pid=int(owner[2]) if owner else None,
            )
        )
    return result


def _hex_address(text: str) -> str | None:
    # /proc/net stores addresses as host-order 32-bit words (little-endian on our arches).
    try:
        raw = bytes.fromhex(text)
        if len(raw) == 4:
            return str(ipaddress.IPv4Address(raw[::-1]))
        if len(raw) == 16:
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
            return str(ipaddress.IPv6Address(words))
    except ValueError:
        pass
    return None


def parse_proc_net(lines: Iterable[str] | None) -> list[ListeningPort]:
    """Fallback without ss: /proc/net/{tcp,tcp6,udp,udp6} lines, each prefixed with the
    file name by the probe ("tcp6 0: 00000000...:1A0B 00000000...:0000 0A ...")."""
    result = []
    for line in _clean(lines):
        fields = line.split()
        if len(fields) < 5 or fields[0] not in ("tcp", "tcp6", "udp", "udp6"):
            continue
        proto = fields[0][:3]
        local, _, port_hex = fields[2].partition(":")
        _, _, peer_port = fields[3].partition(":")
        state = fields[4].upper()
        # TCP: only LISTEN (0A). UDP: bound sockets with no peer (state 07, peer port 0).
        if (proto == "tcp" and state != "0A") or (proto == "udp" and peer_port != "0000"):
            continue
        try:
            port = int(port_hex, 16)
        except ValueError:
            continue
        address = _hex_address(local)
        if address is not None:
            result.append(ListeningPort(proto=proto, port=port, address=address))
    return result


# --- addresses and routes -------------------------------------------------------------

# "4: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global dynamic eth0\       valid_lft 3000sec ..."
# "5: wg0    inet 10.9.0.1 peer 10.9.0.2/32 scope global wg0\ ..."
_IP_ADDR = re.compile(r"^\d+:\s+(\S+)\s+(inet6?)\s+([0-9A-Fa-f.:]+)(?:/(\d+))?(?:\s+peer\s+[0-9A-Fa-f.:]+/(\d+))?(.*)$")


def parse_ip_addr(lines: Iterable[str] | None) -> list[InterfaceAddress]:
    """`ip -o addr show`: one address per line (the backslash starts its lifetimes)."""
    result = []
    for line in _clean(lines):
        m = _IP_ADDR.match(line.strip())
        if not m:
            continue
        interface = m[1].split("@", 1)[0]
        try:
            address = str(ipaddress.ip_address(m[3]))
        except ValueError:
            continue
        prefix = _int(m[5] or m[4])
        if prefix is None:
            prefix = 128 if m[2] == "inet6" else 32
        words = m[6].split("\\", 1)[0].split()
        scope = words[words.index("scope") + 1] if "scope" in words[:-1] else "global"
        after = words[words.index("scope") + 2:] if "scope" in words[:-1] else []
        # IPv4 lines end with the address's label ("eth0", "eth0:1"); the rest are flags.
        flags = [w for w in after if w != interface and not w.startswith(interface + ":")]
        result.append(InterfaceAddress(interface, address, prefix, scope, flags))
    return result


# "2: eth0@if1209: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP ..."
_IP_LINK = re.compile(r"^[0-9]{1,10}:\s+([A-Za-z0-9_.:-]{1,15})(?:@\S+)?:\s+<[A-Z0-9_,-]*>\s+mtu\s+([0-9]{1,6})\s",
                      re.ASCII)


def parse_ip_link(lines: Iterable[str] | None) -> dict[str, int]:
    """`ip -o link show`: interface -> MTU, for MTUs a link can have (68..65536, RFC 791's
    minimum to the kernel's largest); anything else is left out, not guessed."""
    result: dict[str, int] = {}
    for line in _clean(lines):
        m = _IP_LINK.match(line.strip())
        if m and 68 <= int(m[2]) <= 65536:
            result.setdefault(m[1], int(m[2]))
    return result


_ROUTE_KINDS = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole", "prohibit", "throw",
                "nat", "anycast"}


def _route_fields(words: list[str]) -> dict[str, str]:
    return {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i] in ("via", "dev", "src", "metric")}


def parse_ip_route(lines: Iterable[str] | None) -> list[Route]:
    """The probe's routes: "# inet" then `ip -4 route show table main`, "# inet6" then the
    same for IPv6. A multipath route's "nexthop via ... dev ..." lines give its first hop."""
    routes: list[Route] = []
    family = 4
    for line in _clean(lines):
        words = line.split()
        if not words:
            continue
        if words[0] == "#" and len(words) > 1:
            family = 6 if words[1] == "inet6" else 4
            continue
        if words[0] == "nexthop":
            if routes and routes[-1].interface is None:
                hop = _route_fields(words)
                routes[-1] = replace(routes[-1], interface=hop.get("dev"), gateway=hop.get("via"))
            continue
        kind = "unicast"
        if words[0] in _ROUTE_KINDS:
            kind, words = words[0], words[1:]
        if not words:
            continue
        destination = words[0]
        if destination != "default":
            try:
                destination = str(ipaddress.ip_network(destination, strict=False))
            except ValueError:
                continue
        fields = _route_fields(words[1:])
        routes.append(Route(destination, family, fields.get("dev"), fields.get("via"), fields.get("src"), kind,
                            _int(fields.get("metric")) or 0))
    return routes


def parse_files(lines: Iterable[str] | None) -> dict[str, FileState]:
    """`<octal mode> <sha256> <path>` per existing file; `missing - <path>` otherwise."""
    files = {}
    for line in _clean(lines):
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] != "missing" and re.fullmatch(r"[0-7]{3,4}", parts[0]):
            files[parts[2]] = FileState(mode=int(parts[0], 8), sha256=parts[1])
    return files


def parse_key_values(lines: Iterable[str] | None) -> dict[str, str]:
    return dict(line.split("=", 1) for line in _clean(lines) if "=" in line)


# A Debian package name (policy 5.6.1) and version (5.6.12): the names go into apt command
# lines, so a line that does not fit is not a package.
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]{0,127}")
_PACKAGE_VERSION = re.compile(r"[A-Za-z0-9.+~:-]{1,128}")


def _package(parts: list[str]) -> str | None:
    name = parts[1].split(":")[0]
    return name if _PACKAGE_NAME.fullmatch(name) and _PACKAGE_VERSION.fullmatch(parts[2]) else None


def parse_packages(lines: Iterable[str] | None) -> dict[str, str]:
    """dpkg-query `${db:Status-Abbrev} name version` lines -> {name: version} of installed
    packages ("ii", or "hi" when held: the second letter is the installed state)."""
    installed = {}
    for line in _clean(lines):
        parts = line.split()
        if len(parts) >= 3 and len(parts[0]) >= 2 and parts[0][1] == "i" and (name := _package(parts)):
            installed[name] = parts[2]
    return installed


def parse_held(lines: Iterable[str] | None) -> list[str]:
    """Installed packages whose selection is `hold` (status abbreviation `hi`)."""
    held = []
    for line in _clean(lines):
        parts = line.split()
        if len(parts) >= 3 and parts[0][:2] == "hi" and (name := _package(parts)):
            held.append(name)
    return sorted(held)


def parse_containerd(lines: Iterable[str] | None) -> ContainerdConfig | None:
    """The runtimes and CNI bin dir in the containerd config k3s generated."""
    lines = _clean(lines)
    if not lines:
        return None
    runtimes, bin_dir = [], None
    for line in lines:
        runtime = re.search(r"runtimes\.[\"']?([A-Za-z0-9_-]+)[\"']?\]", line)
        if runtime and runtime.group(1) not in runtimes:
            runtimes.append(runtime.group(1))
        found = re.search(r"bin_dirs?\s*=\s*\[?\s*[\"']([^\"']+)[\"']", line)
        if found and bin_dir is None:
            bin_dir = found.group(1)
    return ContainerdConfig(runtimes=runtimes, cni_bin_dir=bin_dir)


def parse_crictl_images(lines: Iterable[str] | None) -> tuple:
    """`crictl images --digests`: IMAGE TAG DIGEST IMAGE-ID SIZE under a header line.
    One reference per image: name:tag, or name@sha256:<short digest> for untagged ones."""
    refs = []
    for line in lines or ():
        parts = line.split()
        if len(parts) < 3 or parts[0] == "IMAGE":
            continue
        name, tag, digest = parts[0], parts[1], parts[2]
        if tag != "<none>":
            refs.append(f"{name}:{tag}")
        elif digest != "<none>":
            refs.append(f"{name}@sha256:{digest}")
    return tuple(refs)
