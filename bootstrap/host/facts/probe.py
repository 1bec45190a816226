"""The host probe: one POSIX sh script, one SSH round trip, every source in one output.

Rented GPUs are often 50-300 ms away and pyinfra runs each fact as its own round trip, so
everything the tool needs to know about a host is gathered by this single script. Each
source's output follows a delimiter line that carries the source's exit code:

    @@bootstrap-probe@@ <section> rc=<N>
    ...output (stderr merged)...

The nvidia-smi sections appear only when nvidia-smi is on the host, and the query/MIG ones
only when plain `nvidia-smi` succeeded; "proc-net" appears only when `ss` failed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from bootstrap.host.parts import k3s_service, kernel, manifest, packages
from bootstrap.remote_data import RemoteDataError

from . import gpu_health
from . import parsers as p
from .host_facts import HostFacts, K3sInstall

DELIMITER = "@@bootstrap-probe@@"

# The exact nvidia-smi invocations recorded on a real H200 VM (tests/fixtures/gpu-vm-h200):
# the parsers are tested on that output, so the probe must ask the same questions.
NVSMI_QUERY_ARGS = (
    "--query-gpu=index,uuid,name,pci.bus_id,memory.total,driver_version,mig.mode.current,"
    "mig.mode.pending,compute_cap,persistence_mode,vbios_version,serial --format=csv"
)

# Requested paths for disk space, in the order the df section reports them.
DF_PATHS = ("/", k3s_service.RANCHER_DIR)

# `command -v` checks: package manager detection, preflight's "what is missing", and python3
# for the reachability probes' listeners and senders.
COMMANDS = (
    "nvidia-smi", "nvidia-ctk", "k3s", "kubectl", "systemctl", "ss", "curl", "sudo",
    "timeout", "apt-get", "dnf", "yum", "zypper", "apk", "python3",
)  # fmt: skip

SECTIONS = (
    "commands", "id", "sudo", "os-release", "uname", "machine-id", "pid1", "machine", "nproc", "meminfo", "df", "rdma", "pci-nvidia", "files", "modules", "sysctl", "packages", "containerd", "manifest", "images",
    "k3s", "k3s-units", "ss", "proc-net", "ip-addr", "ip-link", "ip-route", "wireguard", "clock",
    "nvidia-smi", "nvidia-smi-query", "nvidia-smi-mig-lgip", "nvidia-smi-mig-lgipp",
    "nvidia-smi-xml", "nvidia-smi-nvlink", "nvidia-smi-topo", "xid",
)  # fmt: skip

PROBE_SCRIPT = r"""
# bootstrap host probe. POSIX sh (dash); always exits 0 so pyinfra hands the output over.
# sudo's secure_path and non-login SSH shells miss sbin dirs and vendor nvidia-smi dirs;
# appended, so a PATH the caller chose still wins. (An empty PATH entry would mean ".".)
PATH="${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/nvidia/bin"
LC_ALL=C
export PATH LC_ALL
has() { command -v "$1" >/dev/null 2>&1; }
sec() {
  _name=$1; shift
  _out=$("$@" 2>&1); rc=$?
  printf '%s %s rc=%s\n' '@@DELIM@@' "$_name" "$rc"
  [ -z "$_out" ] || printf '%s\n' "$_out"
}
# A wedged GPU can hang nvidia-smi; bound it where coreutils' timeout exists.
nvsmi() { if has timeout; then timeout 60 nvidia-smi "$@"; else nvidia-smi "$@"; fi; }
p_commands() { for c in @@COMMANDS@@; do printf '%s: ' "$c"; command -v "$c" || echo missing; done; }
p_os() { cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release; }
# What kubelet reports as its Node's machineID (cAdvisor reads these two, in this order):
# a Node whose machineID differs from its host's is another machine under the same name.
p_machine_id() { cat /etc/machine-id 2>/dev/null || cat /var/lib/dbus/machine-id; }
# Can this machine run k3s, or is it a container sold as a "GPU pod" (bootstrap.checks.
# machine_kind)? What says "container", then what k3s needs from the kernel: a writable
# cgroup hierarchy (the mount's own options, /proc/self/mountinfo), network namespaces (a
# throwaway one: `unshare -n` leaves nothing, unlike `ip netns add`) and netfilter (listing
# one chain). The last two need root: without it they stay unknown.
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif sudo -n true 2>/dev/null; then sudo -n "$@"; else return 126; fi; }
verdict() { case $1 in 0) echo ok ;; 126) echo unknown ;; *) echo denied ;; esac; }
p_machine() {
  printf 'virt %s\n' "$(systemd-detect-virt --container 2>/dev/null)"
  for f in /.dockerenv /run/.containerenv; do [ -e "$f" ] && echo "marker $f"; done
  awk '$5 == "/sys/fs/cgroup" || index($5, "/sys/fs/cgroup/") == 1 { if (++n <= 40) print "cgroup", $0 }' \
    /proc/self/mountinfo
  if has unshare; then as_root unshare -n true >/dev/null 2>&1; echo "netns $(verdict $?)"; else echo "netns unknown"; fi
  if has iptables; then as_root iptables -w 5 -n -L INPUT >/dev/null 2>&1; echo "netfilter $(verdict $?)"
  elif has nft; then as_root nft list tables >/dev/null 2>&1; echo "netfilter $(verdict $?)"
  else echo "netfilter missing"; fi
  return 0
}
# nproc obeys OMP_NUM_THREADS, which GPU images often set system-wide; getconf does not.
p_nproc() { getconf _NPROCESSORS_ONLN 2>/dev/null || nproc; }
p_meminfo() { grep -E '^(MemTotal|MemAvailable|SwapTotal|SwapFree):' /proc/meminfo; }
p_df() {
  # /var/lib/rancher only exists once k3s ran: measure its nearest existing parent.
  d=@@RANCHER@@
  while [ ! -e "$d" ]; do d=${d%/*}; [ -n "$d" ] || d=/; done
  df -P -k @@ROOT@@ "$d"
}
p_rdma() {
  for f in /sys/class/infiniband/*/ports/*/link_layer /sys/class/infiniband/*/ports/*/state; do
    [ -r "$f" ] && printf '%s:%s\n' "$f" "$(cat "$f")"
  done
  for n in /sys/class/infiniband/*/device/net/*; do [ -e "$n" ] && echo "$n"; done
  return 0
}
# NVIDIA PCI functions: GPUs are visible here even before any driver is installed.
p_pci() {
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    drv=; [ -e "$d/driver" ] && drv=$(basename "$(readlink "$d/driver")")
    echo "${d##*/} device=$(cat "$d/device") class=$(cat "$d/class") driver=$drv"
  done
  return 0
}
# The node-ip a running node was given (bootstrap.checks.node_addresses keeps it) and whether it
# runs the embedded registry mirror (bootstrap.checks.preflight.gpu_setup_dropped); config.yaml holds the token,
# so it is root's: read as root, those two lines only.
p_node_ip() {
  if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n grep -m2 -E '^(node-ip|embedded-registry):' @@K3S_CONFIG@@
  else grep -m2 -E '^(node-ip|embedded-registry):' @@K3S_CONFIG@@; fi
}
p_k3s() {
  if has k3s; then echo "binary: $(command -v k3s)"; k3s --version; fi
  if [ -e @@K3S_CONFIG@@ ]; then echo "config: present"; p_node_ip || true; else echo "config: absent"; fi
}
p_units() {
  has systemctl || return 127
  systemctl show -p Id -p LoadState -p ActiveState -p UnitFileState @@K3S_UNITS@@
}
# Port owners are only visible to root: ask sudo (non-interactively) when we are not root.
p_ss() { has ss || return 127; if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n ss -Hltunp; else ss -Hltunp; fi; }
# Facts run as the login user; this says whether `sudo -n` works before anything needs it,
# so a password-only sudo is one clear line instead of a prompt.
p_sudo() { [ "$(id -u)" = 0 ] && { echo root; return 0; }; has sudo || { echo "sudo: not installed"; return 127; }; sudo -n true; }
# The host's own addresses and routes: node-ip must be one of them (k3s's network policy
# controller looks the node's InternalIP up among the interfaces' addresses and exits when
# none holds it), and behind a cloud's 1:1 NAT the SSH address is not.
p_addr() { has ip || return 127; ip -o addr show; }
# Each interface's MTU: the reachability check's full-size datagrams start there (flannel
# sizes its overlay from its interface's MTU).
p_links() { has ip || return 127; ip -o link show; }
p_routes() {
  has ip || return 127
  echo "# inet"; ip -4 route show table main
  echo "# inet6"; ip -6 route show table main 2>/dev/null; return 0
}
# flannel's wireguard-native backend creates a link of type wireguard, which the kernel
# loads its module for: loaded, built in, or on disk for this kernel (any compression).
p_wireguard() {
  r=$(uname -r)
  if [ -d /sys/module/wireguard ]; then echo loaded
  elif grep -qs '/wireguard\.ko$' "/lib/modules/$r/modules.builtin"; then echo builtin
  elif [ -n "$(find "/lib/modules/$r" -name 'wireguard.ko*' 2>/dev/null | head -n 1)" ]; then echo module
  else echo missing; fi
}
# Last, so it is read as close to the output's arrival as the script allows.
p_clock() { date +%s.%N 2>/dev/null | grep -E '^[0-9]+\.[0-9]+$' || date +%s; }
# GPU health (gpu.health not off): the kernel's Xid reports since boot, with the boot's id
# so `bootstrap health` can tell new ones from those it saw. dmesg needs root where
# kernel.dmesg_restrict is set; journalctl -k holds the same lines where dmesg is absent.
p_xid() {
  printf 'boot_id %s\n' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
  if has dmesg; then
    if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n dmesg; else dmesg; fi 2>/dev/null \
      | grep 'NVRM: Xid' | tail -n 200
  elif has journalctl; then journalctl -k -b --no-pager 2>/dev/null | grep 'NVRM: Xid' | tail -n 200
  fi
  return 0
}
p_procnet() {
  for t in tcp tcp6 udp udp6; do
    [ -r "/proc/net/$t" ] || continue
    while IFS= read -r l; do printf '%s %s\n' "$t" "$l"; done < "/proc/net/$t"
  done
}
# Host state the converge plan compares against, so a no-op `up` needs no more round trips.
p_files_body='for f in "$@"; do
  if [ -f "$f" ]; then echo "$(stat -c %a "$f") $(sha256sum "$f" | cut -d" " -f1) $f"; else echo "missing - $f"; fi
done'
# Managed files include root-only ones (config.yaml holds the token): hash them as root.
p_files() {
  # shellcheck disable=SC2086
  if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n sh -c "$p_files_body" sh $BOOTSTRAP_FILES
  else sh -c "$p_files_body" sh $BOOTSTRAP_FILES; fi
}
@@KERNEL@@
p_packages() {
  has dpkg-query || return 127
  # The status abbreviation says it all: 2nd letter i = installed, 1st letter h = held
  # (apt-mark showhold would cost most of a second loading apt's cache).
  dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' @@PACKAGES@@ 2>/dev/null | grep '^.i'
}
p_containerd() {
  c=@@CONTAINERD_CONFIG@@
  [ -r "$c" ] || return 1
  grep -E "runtimes\.[\"']?[a-z-]+[\"']?\]|bin_dir|BinaryName" "$c"
}
p_manifest() { cat @@MANIFEST@@ 2>/dev/null || true; }
# Images in k3s's containerd (what pre-pulls compare against); only while k3s runs.
p_images() {
  [ -e @@CONTAINERD_SOCKET@@ ] || return 1
  if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n timeout 15 k3s crictl images --digests
  else timeout 15 k3s crictl images --digests; fi
}
probe() {
  sec commands p_commands
  sec id id -u
  sec sudo p_sudo
  sec os-release p_os
  sec uname uname -n -r -m
  sec machine-id p_machine_id
  sec pid1 cat /proc/1/comm
  sec machine p_machine
  sec nproc p_nproc
  sec meminfo p_meminfo
  sec df p_df
  sec rdma p_rdma
  sec pci-nvidia p_pci
  nvidia_pci=$_out
  sec files p_files
  sec modules p_modules
  sec sysctl p_sysctl
  sec packages p_packages
  sec containerd p_containerd
  sec manifest p_manifest
  # Only GPU machines get images pre-pulled: spare the others a crictl call.
  if has nvidia-smi || [ -n "$nvidia_pci" ]; then sec images p_images; fi
  sec k3s p_k3s
  sec k3s-units p_units
  sec ss p_ss
  [ "$rc" = 0 ] || sec proc-net p_procnet
  sec ip-addr p_addr
  sec ip-link p_links
  sec ip-route p_routes
  sec wireguard p_wireguard
  if has nvidia-smi; then
    sec nvidia-smi nvsmi
    if [ "$rc" = 0 ]; then
      sec nvidia-smi-query nvsmi @@NVSMI_QUERY@@
      sec nvidia-smi-mig-lgip nvsmi mig -lgip
      sec nvidia-smi-mig-lgipp nvsmi mig -lgipp
      if [ "$BOOTSTRAP_HEALTH" = 1 ]; then
        sec nvidia-smi-xml nvsmi -q -x
        sec nvidia-smi-nvlink nvsmi nvlink -s
        sec nvidia-smi-topo nvsmi topo -m
      fi
    fi
  fi
  if [ "$BOOTSTRAP_HEALTH" = 1 ] && { has nvidia-smi || [ -n "$nvidia_pci" ]; }; then sec xid p_xid; fi
}
probe_clock() { sec clock p_clock; }
# No filter here: the host decides what runs on it. The tool reads the output as bytes and
# decodes and caps it itself (bootstrap.remote.remote_output, probe.output_lines).
{ probe; probe_clock; } 2>&1
exit 0
"""
# The host parts' own sections and what they name (their kernel settings, packages, unit
# names, paths), so unchanged state costs nothing and a part's change reaches the probe.
PROBE_SCRIPT = (
    PROBE_SCRIPT.replace("@@DELIM@@", DELIMITER)
    .replace("@@KERNEL@@", kernel.probe_functions())
    .replace("@@PACKAGES@@", " ".join(f"'{p}'" for p in packages.PROBE_GLOBS))
    .replace("@@K3S_CONFIG@@", k3s_service.CONFIG)
    .replace("@@K3S_UNITS@@", " ".join(f"{u}.service" for u in k3s_service.UNITS.values()))
    .replace("@@CONTAINERD_CONFIG@@", k3s_service.CONTAINERD_CONFIG)
    .replace("@@CONTAINERD_SOCKET@@", k3s_service.CONTAINERD_SOCKET)
    .replace("@@MANIFEST@@", manifest.MANIFEST)
    .replace("@@COMMANDS@@", " ".join(COMMANDS))
    .replace("@@RANCHER@@", DF_PATHS[1])
    .replace("@@ROOT@@", DF_PATHS[0])
    .replace("@@NVSMI_QUERY@@", NVSMI_QUERY_ARGS)
    .lstrip()
)

_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]+$")


def probe_script(paths: Iterable[str] = (), health: bool = True) -> str:
    """The probe, also reporting mode and sha256 of `paths` (the files the tool manages);
    `health`: the GPUs' health and the kernel's Xid reports too (gpu.health not off)."""
    paths = tuple(paths)
    for path in paths:
        if not _SAFE_PATH.match(path):
            raise ValueError(f"unsafe path for the probe: {path!r}")
    return f"BOOTSTRAP_FILES='{' '.join(paths)}'\nBOOTSTRAP_HEALTH={int(health)}\n" + PROBE_SCRIPT


_DELIMITER_LINE = re.compile(r"^" + re.escape(DELIMITER) + r" (\S{1,64}) rc=(\d{1,3})\s*$")

# The most of a host's probe output the tool reads: the whole output, and one line. A GPU
# node's probe prints ~100 KiB (with `nvidia-smi -q -x` of 8 GPUs, ~400 KiB); what a host
# prints beyond is cut, so a hostile one cannot make the tool hold gigabytes.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
MAX_LINE_CHARS = 64 * 1024


def output_lines(output: Iterable[str] | str | bytes) -> list[str]:
    """The probe's output, whatever form it arrived in, as at most MAX_OUTPUT_BYTES of text
    lines, each at most MAX_LINE_CHARS: bytes that are not UTF-8 become U+FFFD. The host
    cannot be trusted to filter its own output, so this is the only filter."""
    if isinstance(output, (bytes, bytearray)):
        output = bytes(output[:MAX_OUTPUT_BYTES]).decode("utf-8", "replace")
    if isinstance(output, str):
        output = output[:MAX_OUTPUT_BYTES].splitlines()
    lines: list[str] = []
    size = 0
    for raw in output:
        line = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        line = line.rstrip("\r\n")[:MAX_LINE_CHARS]
        size += len(line) + 1
        if size > MAX_OUTPUT_BYTES:
            break
        lines.append(line)
    return lines


@dataclass(frozen=True)
class Section:
    rc: int
    lines: tuple[str, ...]


def split_sections(lines: Iterable[str] | str | bytes) -> dict[str, Section]:
    """Probe output -> {section name: Section}. Lines before the first delimiter (a chatty
    shell rc file) are dropped; a repeated section name keeps its first occurrence."""
    lines = output_lines(lines)
    sections: dict[str, Section] = {}
    name: str | None = None
    rc = 0
    body: list[str] = []

    def close() -> None:
        if name is not None and name not in sections:
            sections[name] = Section(rc, tuple(body))

    for line in lines:
        match = _DELIMITER_LINE.match(line)
        if match:
            close()
            name, rc, body = match[1], int(match[2]), []
        elif name is not None:
            body.append(line)
    close()
    return sections


def _lines(sections: dict[str, Section], name: str) -> tuple[str, ...]:
    """Lines of a section whatever its exit code (grep/cat style sources: output is data)."""
    section = sections.get(name)
    return section.lines if section is not None else ()


def _ok(sections: dict[str, Section], name: str) -> tuple[str, ...]:
    """Lines of a section that ran and succeeded; () otherwise."""
    section = sections.get(name)
    return section.lines if section is not None and section.rc == 0 else ()


def _nvsmi_error(section: Section) -> str:
    if section.rc == 124:
        return "nvidia-smi timed out"
    return p.first_meaningful_line(section.lines) or f"nvidia-smi exited with rc={section.rc}"


def _gpu_facts(sections: dict[str, Section]) -> dict:
    """gpus, gpu_error, driver/CUDA versions and MIG profiles from the nvidia-smi sections."""
    header = sections.get("nvidia-smi")
    if header is None:  # no nvidia-smi on the host: a CPU node, not an error
        return {}
    if header.rc != 0:
        return {"gpu_error": _nvsmi_error(header)}
    driver, cuda = p.parse_nvidia_smi_header(header.lines)
    query = sections.get("nvidia-smi-query")
    gpus = p.parse_gpu_query(query.lines) if query is not None and query.rc == 0 else []
    error = None
    if query is None:
        error = "nvidia-smi --query-gpu did not run"
    elif query.rc != 0:
        error = _nvsmi_error(query)
    elif not gpus:
        error = "nvidia-smi --query-gpu output lists no GPU: " + (
            p.first_meaningful_line(query.lines) or "(empty)"
        )
    # On GPUs without MIG, `mig -lgip` fails or prints no table: no profiles, not an error.
    profiles = p.with_placements(
        p.parse_mig_profiles(_ok(sections, "nvidia-smi-mig-lgip")),
        p.parse_mig_placements(_ok(sections, "nvidia-smi-mig-lgipp")),
    )
    health = sections.get("nvidia-smi-xml")
    return {
        "gpus": gpus,
        "gpu_error": error,
        "gpu_health": gpu_health.gpu_health(health.lines, _ok(sections, "nvidia-smi-nvlink"),
                                            _ok(sections, "nvidia-smi-topo"))
        if health is not None and health.rc == 0 else None,
        "driver_version": driver or next((g.driver_version for g in gpus if g.driver_version), None),
        "cuda_version": cuda,
        "mig_profiles": profiles,
    }


def _disk_free_gib(sections: dict[str, Section]) -> dict[str, float]:
    # df -P prints one line per argument in argument order; a failed df prints fewer lines,
    # so only trust the mapping when every path got its line.
    entries = p.parse_df(_lines(sections, "df"))
    if len(entries) != len(DF_PATHS):
        return {}
    return {path: round(e.avail_kib / 1024**2, 2) for path, e in zip(DF_PATHS, entries)}


def _k3s(sections: dict[str, Section]) -> K3sInstall | None:
    files = p.parse_k3s(_lines(sections, "k3s"))
    units = [u for u in p.parse_systemd_units(_ok(sections, "k3s-units")) if u.present]
    if files.binary is None and not files.config_present and not units:
        return None
    return K3sInstall(files.binary, files.version, files.config_present, units, files.node_ip,
                      files.embedded_registry)


def _xid_facts(sections: dict[str, Section]) -> dict:
    """The kernel's Xid reports and the boot they belong to; {} when not probed."""
    if "xid" not in sections:
        return {}
    lines = _lines(sections, "xid")
    boot = next((line.split(None, 1)[1].strip() for line in lines if line.startswith("boot_id ")
                 and len(line.split(None, 1)) > 1), None)
    return {"boot_id": boot if boot and re.fullmatch(r"[0-9a-f-]{36}", boot) else None,
            "xids": gpu_health.parse_xid([line for line in lines if not line.startswith("boot_id ")])}


def _manifest(sections: dict[str, Section]) -> dict:
    """The host's manifest, checked (bootstrap.host.parts.manifest.read), or why it is refused."""
    try:
        return {"manifest": manifest.parse("\n".join(_ok(sections, "manifest")))}
    except RemoteDataError as exc:
        return {"manifest": {}, "manifest_error": str(exc)}


def _clock(sections: dict[str, Section]) -> float | None:
    """Seconds since the epoch as `date +%s.%N` prints them; float() alone would also take
    "nan", "inf" and "1e999", which compare as nothing and are not JSON."""
    for line in _ok(sections, "clock"):
        if re.fullmatch(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", line.strip()):
            return float(line.strip())
    return None


def parse_host_facts(lines: Iterable[str] | str | bytes, received_at: float | None = None) -> HostFacts:
    """Probe output -> HostFacts. Missing or garbled sections leave their fields unknown.
    `received_at`: the tool's clock when the output arrived (for the host's clock offset)."""
    sections = split_sections(lines)
    clock = _clock(sections)
    wireguard = p.parse_first_word(_ok(sections, "wireguard"))
    os_release = p.parse_os_release(_lines(sections, "os-release"))
    uname = p.parse_uname(_ok(sections, "uname"))
    meminfo = p.parse_meminfo(_lines(sections, "meminfo"))
    commands = p.parse_commands(_lines(sections, "commands"))
    init = p.parse_first_word(_ok(sections, "pid1"))
    if "ss" in sections and sections["ss"].rc == 0:
        listening = p.parse_ss(_lines(sections, "ss"))
    else:
        listening = p.parse_proc_net(_lines(sections, "proc-net"))
    return HostFacts(
        hostname=uname.hostname if uname else None,
        machine_id=p.parse_machine_id(_ok(sections, "machine-id")),
        os_id=os_release.get("ID"),
        os_version_id=os_release.get("VERSION_ID"),
        os_pretty=os_release.get("PRETTY_NAME"),
        arch=p.normalise_arch(uname.machine if uname else None),
        kernel=uname.kernel if uname else None,
        cpus=p.parse_first_int(_ok(sections, "nproc")),
        memory_mib=meminfo["MemTotal"] // 1024 if "MemTotal" in meminfo else None,
        swap_mib=meminfo["SwapTotal"] // 1024 if "SwapTotal" in meminfo else None,
        disk_free_gib=_disk_free_gib(sections),
        has_systemd=init == "systemd",
        init_process=init,
        machine=p.parse_machine(_ok(sections, "machine")) if "machine" in sections else None,
        probe_uid=p.parse_first_int(_ok(sections, "id")),
        sudo_ok=sections["sudo"].rc == 0 if "sudo" in sections else None,
        sudo_error=None if "sudo" not in sections or sections["sudo"].rc == 0
        else p.first_meaningful_line(sections["sudo"].lines) or "sudo -n failed",
        package_manager=p.package_manager(commands),
        commands=commands,
        rdma=p.parse_rdma(_lines(sections, "rdma")),
        nvidia_pci=p.parse_nvidia_pci(_lines(sections, "pci-nvidia")),
        files=p.parse_files(_ok(sections, "files")),
        modules=sorted(_ok(sections, "modules")),
        sysctls=p.parse_key_values(_ok(sections, "sysctl")),
        packages=p.parse_packages(_lines(sections, "packages")),
        held_packages=p.parse_held(_lines(sections, "packages")),
        containerd=p.parse_containerd(_ok(sections, "containerd")),
        **_manifest(sections),
        images=p.parse_crictl_images(_ok(sections, "images")) if _ok(sections, "images") else None,
        k3s=_k3s(sections),
        listening_ports=sorted(listening, key=lambda s: (s.proto, s.port, s.address)),
        addresses=p.parse_ip_addr(_ok(sections, "ip-addr")) or None,  # no `ip`: unknown, not "none"
        routes=p.parse_ip_route(_ok(sections, "ip-route")),
        mtus=p.parse_ip_link(_ok(sections, "ip-link")),
        wireguard=wireguard if wireguard in ("loaded", "builtin", "module", "missing") else None,
        **_xid_facts(sections),
        clock=clock,
        clock_offset_s=round(clock - received_at, 3) if clock is not None and received_at is not None else None,
        **_gpu_facts(sections),
    )
