#!/usr/bin/env python3
"""Local test hosts: Debian machines with systemd and SSH, booted with systemd-nspawn.

Each test host is one network namespace (``bslab-<name>``), one veth (root side
``bsl-<name>`` on the bridge ``bslab0``, host side ``eth0``), one overlay upper dir on
a shared, cached Debian rootfs, and one ``systemd-nspawn -b``.  All addresses are in
10.200.0.0/24; the machine itself is 10.200.0.1 on the bridge.  Nothing is routed
anywhere else (the machine's ``ip_forward`` is left as it is).

As a module (tests put ``tests/`` on ``sys.path``)::

    lab = Lab()
    cp, gpu = lab.start(["cp-1", "gpu-1"], gpu=["gpu-1"])
    cp.ssh("hostname").stdout
    lab.cleanup()

``HostSpec("nat-1", nat=True)`` is a host behind 1:1 NAT: eth0 holds its private address
(``host.address``), the tool reaches it at ``host.public_address``, which no interface holds.

``HostSpec("a-1", provider="alpha")`` is a host rented at a GPU cloud: each provider (made on
first use, removed with its last host) is a router namespace ``bslabp-<provider>`` with the
provider's private bridge (provider number k: 10.201.k.0/24, router 10.201.k.1) and an uplink
to the "internet" bridge ``bslab-inet`` on this machine (10.202.0.0/24: this machine 10.202.0.1,
router k 10.202.0.(10+k)). A host has its private address 10.201.k.x on eth0 (``host.address``)
and the public 10.202.k.x (``host.public_address``, 1:1 NAT in the router, hairpin included).
Providers share no private network: host to host across providers, and from this machine,
only public addresses work. ``Lab.block(provider, proto, port)`` is a provider firewall rule.
The back door (``ssh()``) goes to the public address from 10.202.0.2, which blocks let through.

As a command::

    python tests/testhosts.py up [--count N | NAME...] [--gpu NAME...]
    python tests/testhosts.py status
    python tests/testhosts.py kill NAME...     # a spot loss: the machine stops answering
    python tests/testhosts.py down

The SSH access here (lab key, no host key checking) is the tests' back door into a
host; it is not how the tool under test connects.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Union

TESTS_DIR = Path(__file__).resolve().parent

LAB_DIR = Path(os.environ.get("BOOTSTRAP_LAB_DIR", "/var/tmp/bootstrap-lab"))
ROOTFS = Path(os.environ.get("BOOTSTRAP_ROOTFS_CACHE", "/var/cache/bootstrap-lab/rootfs-bookworm"))

SUITE = "bookworm"
PACKAGES = (
    "systemd,systemd-sysv,dbus,openssh-server,sudo,python3,ca-certificates,"
    "iproute2,iptables,kmod,procps,util-linux,curl,less,iputils-ping,"
    # HTTP/2 for the k3s stand-in's API, as kube-apiserver speaks it (tests/standins/h2serve.py)
    "python3-h2"
).split(",")
# Bump when the customisation below changes, so cached rootfs trees are rebuilt.
ROOTFS_RECIPE = 1

SSH_USER = "ubuntu"
BRIDGE = "bslab0"
NETWORK = ipaddress.ip_network("10.200.0.0/24")
GATEWAY = "10.200.0.1"
# The machines inventories/lab.yaml describes; other names get the next free address.
KNOWN_HOSTS = {"cp-1": "10.200.0.11", "gpu-1": "10.200.0.12", "gpu-2": "10.200.0.13"}
FIRST_FREE = 14
# 1:1 NAT, as most clouds do it: a host started with HostSpec(nat=True) keeps its private
# address on eth0 and is reached from this machine (where the tool runs) at a "public"
# address that exists only as a DNAT rule in this machine's namespace: 10.200.100.<same last
# octet>. Host to host it has only its private address, as in a provider's VPC.
PUBLIC_NETWORK = ipaddress.ip_network("10.200.100.0/24")
# Providers (HostSpec(provider=...)), as on GPU clouds where machines rented at different
# providers share no private network and each has only a 1:1-NAT'd public address. Provider
# number k (1..MAX_PROVIDERS, kept in LAB_DIR/providers/<name>.json while the provider has hosts):
#   router namespace bslabp-<name>: bridge "lan" PROVIDER_PRIVATE (router .1, the hosts' gateway)
#     and veth "uplink" at 10.202.0.(10+k) on the internet bridge (root side bslu-<name>);
#   public range PROVIDER_PUBLIC: host 10.201.k.x is 10.202.k.x outside, by DNAT/SNAT in the router.
# This machine sits on the internet bridge (INET_GATEWAY) with a route per public range via its
# router, and forwards nothing; every router has routes to the other public ranges and to
# 10.200.0.1 (the lab services), none to another provider's private subnet, and no default.
PROVIDER_NAME = re.compile(r"[a-z][a-z0-9]{0,9}")  # bslu-<name> fits a link name (15)
MAX_PROVIDERS = 200
PROVIDER_PRIVATE = "10.201.{k}.0/24"
PROVIDER_PUBLIC = "10.202.{k}.0/24"
PROVIDER_FIRST_HOST = 11  # hosts get 10.201.k.11, .12, ... (HostSpec.address may name another)
INET_BRIDGE = "bslab-inet"
INET_NETWORK = ipaddress.ip_network("10.202.0.0/24")
PUBLIC_SPACE = ipaddress.ip_network("10.202.0.0/16")  # the internet: INET_NETWORK and the public ranges
INET_GATEWAY = "10.202.0.1"  # this machine as the providers' hosts see it (the operator's laptop)
# The tests' back door into provider hosts connects from this second address on the internet
# bridge, which Lab.block lets through, so a blocked tcp/22 still leaves the tests a way in.
BACKDOOR_SOURCE = "10.202.0.2"
ROUTER_NETNS_PREFIX = "bslabp-"
UPLINK_PREFIX = "bslu-"
BLOCK_COMMENT = "bslab-block:"  # + owner pid:start time
# Beyond nspawn's default set: CAP_NET_ADMIN, scoped to the host's own network
# namespace (iptables, ip link, net.* sysctls). Machine-wide sysctls stay read-only.
CAPABILITIES = ("CAP_NET_ADMIN",)

NVIDIA_SMI_STANDIN = TESTS_DIR / "standins" / "nvidia-smi"
GPU_FIXTURES = TESTS_DIR / "fixtures" / "gpu-vm-h200"
GPU_FIXTURES_REMOTE = "/usr/share/bootstrap-standin/gpu-vm-h200/"

# What a running host writes into its upper dir by itself (journal, login records,
# sudo's lecture stamps, systemd's state). Tests that check "the tool left nothing
# behind" ignore these (see TestHost.created_files).
BOOT_NOISE = re.compile(
    r"^(var/log/journal|var/log/(wtmp|btmp|lastlog|faillog)$|var/lib/systemd|var/lib/sudo|"
    r"var/cache/ldconfig|var/tmp|tmp)(/|$)"
)

FileContent = Union[bytes, str, Path, tuple]  # tuple = (bytes|str|Path, mode)


class LabError(RuntimeError):
    pass


# --------------------------------------------------------------------------- helpers


def _run(*cmd: str, check: bool = True, timeout: float | None = 60):
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace').strip()}")
    return proc


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def requirements_missing() -> str | None:
    """Why test hosts cannot run here, or None."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, systemd-nspawn)"
    tools = ("systemd-nspawn", "ip", "ssh", "ssh-keygen") + (() if _rootfs_ready() else ("debootstrap",))
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        return "test hosts need " + ", ".join(missing)
    return None


def key_path() -> Path:
    """The lab's SSH key (generated once, kept by ``down``)."""
    key = LAB_DIR / "id_ed25519"
    if not key.exists():
        with _locked(LAB_DIR / ".key.lock"):
            if not key.exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bootstrap-lab", "-f", str(key))
    return key


def _debian_mirror() -> str:
    if os.environ.get("BOOTSTRAP_DEBIAN_MIRROR"):
        return os.environ["BOOTSTRAP_DEBIAN_MIRROR"]
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
            )
            suites = fields.get("Suites", "").split()
            if any(s.strip() == SUITE for s in suites) and "URIs" in fields:
                return fields["URIs"].split()[0]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1]
    raise LabError("no Debian mirror found in /etc/apt/sources.list.d/debian.sources; set BOOTSTRAP_DEBIAN_MIRROR")


_STAMP = ROOTFS.with_name(ROOTFS.name + ".stamp")
_STAMP_TEXT = json.dumps({"suite": SUITE, "packages": sorted(PACKAGES), "recipe": ROOTFS_RECIPE}, sort_keys=True)


def _rootfs_ready() -> bool:
    return _STAMP.exists() and _STAMP.read_text() == _STAMP_TEXT and ROOTFS.is_dir()


def ensure_rootfs() -> Path:
    """Build the cached Debian rootfs once (debootstrap), under a lock; return its path.

    The stamp is written last, so an interrupted build is redone; a changed package
    list or recipe also triggers a rebuild.
    """
    if _rootfs_ready():
        return ROOTFS
    with _locked(ROOTFS.with_name(ROOTFS.name + ".lock")):
        if _rootfs_ready():
            return ROOTFS
        _STAMP.unlink(missing_ok=True)
        build = ROOTFS.with_name(ROOTFS.name + ".build")
        shutil.rmtree(build, ignore_errors=True)
        mirror = _debian_mirror()
        print(f"testhosts: building {ROOTFS} with debootstrap from {mirror} (once, about 1-2 min)", file=sys.stderr)
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(build), mirror],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            log = build / "debootstrap/debootstrap.log"
            tail = log.read_text()[-3000:] if log.exists() else proc.stdout[-3000:]
            raise LabError(f"debootstrap failed ({proc.returncode}):\n{proc.stderr[-2000:]}\n{tail}")
        _customise_rootfs(build)
        if ROOTFS.exists():
            old = ROOTFS.with_name(ROOTFS.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            ROOTFS.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        build.rename(ROOTFS)
        _STAMP.write_text(_STAMP_TEXT)
    return ROOTFS


def _customise_rootfs(root: Path) -> None:
    def chroot(*cmd: str) -> None:
        _run("chroot", str(root), *cmd)

    chroot("useradd", "--create-home", "--shell", "/bin/bash", "--uid", "1000", "--user-group", SSH_USER)
    chroot("usermod", "-p", "*", SSH_USER)  # no password, but not "locked"
    sudoers = root / "etc/sudoers.d/90-bootstrap-lab"
    sudoers.write_text(f"{SSH_USER} ALL=(ALL) NOPASSWD:ALL\n")
    sudoers.chmod(0o440)
    for home, owner in ((root / "root", "0:0"), (root / "home" / SSH_USER, "1000:1000")):
        (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
        (home / ".ssh").chmod(0o700)
        _run("chown", owner, str(home / ".ssh"))
    # Every host gets its own name, machine-id and SSH host keys in its upper dir.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("uninitialized\n")
    (root / "etc/hostname").write_text("localhost\n")
    # No DNS in the lab; keep sshd from waiting on reverse lookups.
    (root / "etc/ssh/sshd_config.d/bootstrap-lab.conf").write_text("UseDNS no\n")
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


def _content(value) -> tuple[object, int | None]:
    if isinstance(value, tuple):
        return value[0], value[1]
    return value, None


def _mkparents(upper: Path, rootfs: Path, rel: Path) -> None:
    """Create the parents of upper/rel, copying mode and owner from the rootfs so the
    merged directories look as they did (sshd's StrictModes checks ~/.ssh)."""
    current = Path()
    for part in rel.parent.parts:
        current = current / part
        target = upper / current
        if target.is_dir():
            continue
        lower = rootfs / current
        st = lower.stat() if lower.is_dir() else None
        target.mkdir()
        os.chmod(target, st.st_mode & 0o7777 if st else 0o755)
        if st:
            os.chown(target, st.st_uid, st.st_gid)


def write_into_upper(upper: Path, rootfs: Path, remote: str, value, owner: tuple[int, int] = (0, 0)) -> None:
    """Put a file (or a directory tree, for a Path to a directory) at ``remote`` in the
    host's view, by writing it into the upper dir. Only while the host is not running."""
    content, mode = _content(value)
    rel = Path(remote.lstrip("/"))
    if isinstance(content, Path) and content.is_dir():
        for src in sorted(content.rglob("*")):
            if src.is_file():
                write_into_upper(upper, rootfs, str(Path(remote) / src.relative_to(content)),
                                 (src, mode if mode is not None else src.stat().st_mode & 0o777), owner)
        return
    _mkparents(upper, rootfs, rel)
    target = upper / rel
    if isinstance(content, Path):
        if mode is None:
            mode = content.stat().st_mode & 0o777
        data = content.read_bytes()
    else:
        data = content.encode() if isinstance(content, str) else bytes(content)
    target.unlink(missing_ok=True)
    target.write_bytes(data)
    os.chmod(target, 0o644 if mode is None else mode)
    os.chown(target, *owner)


def _pid_is_nspawn(pid: int | None, marker: str) -> bool:
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].endswith(b"systemd-nspawn") and marker.encode() in b" ".join(cmdline)


def _same_as_lower(upper: Path, lower: Path) -> bool:
    try:
        u, lo = upper.lstat(), lower.lstat()
    except OSError:
        return False
    if (u.st_mode, u.st_uid, u.st_gid) != (lo.st_mode, lo.st_uid, lo.st_gid):
        return False
    if stat.S_ISDIR(u.st_mode):
        with contextlib.suppress(OSError):
            if os.getxattr(upper, "trusted.overlay.opaque") == b"y":
                return False
        return True
    if stat.S_ISLNK(u.st_mode):
        return os.readlink(upper) == os.readlink(lower)
    if stat.S_ISREG(u.st_mode):
        return u.st_size == lo.st_size and upper.read_bytes() == lower.read_bytes()
    return False


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _kill_netns_pids(netns: str) -> None:
    if not Path("/run/netns", netns).exists():
        return
    for _ in range(50):
        pids = _run("ip", "netns", "pids", netns, check=False).stdout.split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    raise LabError(f"processes in netns {netns} would not die")


def _iptables(*args: str, check: bool = True):
    """iptables in this machine's namespace: its own, or the lab rootfs's (Debian's package)
    run through chroot, which keeps the caller's network namespace."""
    binary = shutil.which("iptables")
    return _run(*([binary] if binary else ["chroot", str(ensure_rootfs()), "iptables"]), *args, check=check)


def _drop_leftover_nat_rules() -> None:
    """DNAT rules of hosts whose state is gone (a crash between adding the rule and saving)."""
    if not shutil.which("iptables") and not _rootfs_ready():
        return  # no iptables here, so no rule was ever added
    rules = _iptables("-t", "nat", "-S", "OUTPUT", check=False).stdout.decode()
    for line in rules.splitlines():
        if line.startswith("-A OUTPUT ") and "--comment bslab-" in line:
            _iptables("-t", "nat", "-D", *line.split()[1:], check=False)


def public_address_for(address: str) -> str:
    return str(PUBLIC_NETWORK.network_address + ipaddress.ip_address(address).packed[-1])


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


# Every booted systemd holds a few inotify instances; the kernel default (128 per user, and
# all hosts run as root) stops the tenth host or so with "Too many open files".
INOTIFY_LIMITS = {"fs/inotify/max_user_instances": 8192, "fs/inotify/max_user_watches": 524288}


def _raise_inotify_limits() -> None:
    for key, wanted in INOTIFY_LIMITS.items():
        path = Path("/proc/sys") / key
        try:
            if int(path.read_text()) < wanted:
                path.write_text(str(wanted))
        except (OSError, ValueError):
            pass


def _ensure_bridge() -> None:
    _raise_inotify_limits()
    if not _link_exists(BRIDGE):
        clash = _run("ip", "-4", "route", "show", "to", "match", str(NETWORK.network_address + 1)).stdout.decode()
        if any(line and not line.startswith("default") for line in clash.splitlines()):
            raise LabError(f"{NETWORK} is already routed on this machine ({clash.strip()}); not adding the lab bridge")
        _run("ip", "link", "add", BRIDGE, "address", _mac(GATEWAY), "type", "bridge")
    have = _run("ip", "-o", "-4", "addr", "show", "dev", BRIDGE).stdout.decode()
    if f"{GATEWAY}/{NETWORK.prefixlen}" not in have:
        _run("ip", "addr", "add", f"{GATEWAY}/{NETWORK.prefixlen}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def _mac(address: str) -> str:
    """A fixed MAC per IP (02:00 + the address), for the bridge and each eth0: an address
    given to a new host keeps its MAC, so ARP caches that still hold it stay right
    (random MACs left the machine sending to a gone host's MAC for up to ~30 s), and a
    bridge with a set MAC does not change it as ports come and go."""
    return "02:00:" + ":".join(f"{b:02x}" for b in ipaddress.ip_address(address).packed)


def _remove_bridge_if_unused() -> None:
    hosts_dir = LAB_DIR / "hosts"
    if hosts_dir.is_dir() and any(hosts_dir.iterdir()):
        return
    if _link_exists(BRIDGE) and not any(Path("/sys/class/net", BRIDGE, "brif").iterdir()):
        _run("ip", "link", "del", BRIDGE, check=False)


# --------------------------------------------------------------------------- providers


_IPTABLES_LOCK = threading.Lock()  # one iptables change at a time from this process's threads


def _ns_iptables(netns: str, *args: str, check: bool = True):
    """iptables inside a network namespace (this machine's binary, or the lab rootfs's through
    chroot: the namespace belongs to the process, so chroot keeps it)."""
    binary = shutil.which("iptables")
    cmd = [binary] if binary else ["chroot", str(ensure_rootfs()), "iptables"]
    with _IPTABLES_LOCK:
        return _run("ip", "netns", "exec", netns, *cmd, *args, check=check)


def _ns_delete_rule(netns: str, table: str, rule: tuple[str, ...]) -> None:
    while _ns_iptables(netns, "-t", table, "-C", *rule, check=False).returncode == 0:
        _ns_iptables(netns, "-t", table, "-D", *rule)


def _ns_sysctl(netns: str, key: str, value: int, required: bool = True) -> None:
    path = "/proc/sys/" + key
    script = f"echo {value} > {path}" if required else f"if [ -e {path} ]; then echo {value} > {path}; fi"
    _run("ip", "netns", "exec", netns, "sh", "-c", script)


def _netns_exists(netns: str) -> bool:
    return Path("/run/netns", netns).exists()


def _ns_link_exists(netns: str | None, name: str) -> bool:
    if netns is None:
        return _link_exists(name)
    return _netns_exists(netns) and _run("ip", "-n", netns, "link", "show", "dev", name, check=False).returncode == 0


@dataclass(frozen=True)
class Provider:
    """One provider's router: see PROVIDER_PRIVATE and the lines above it."""

    name: str
    number: int

    @property
    def netns(self) -> str:
        return ROUTER_NETNS_PREFIX + self.name

    @property
    def uplink_veth(self) -> str:  # the root side; the router side is "uplink"
        return UPLINK_PREFIX + self.name

    @property
    def private_network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(PROVIDER_PRIVATE.format(k=self.number))

    @property
    def public_network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(PROVIDER_PUBLIC.format(k=self.number))

    @property
    def gateway(self) -> str:  # the router on the private bridge
        return str(self.private_network.network_address + 1)

    @property
    def uplink_address(self) -> str:  # the router on the internet bridge
        return str(INET_NETWORK.network_address + 10 + self.number)

    def public_address_for(self, address: str) -> str:
        return str(self.public_network.network_address + ipaddress.ip_address(address).packed[-1])


def _providers_dir() -> Path:
    return LAB_DIR / "providers"


def _saved_providers() -> dict[str, Provider]:
    providers = {}
    for path in sorted(_providers_dir().glob("*.json")):
        with contextlib.suppress(Exception):
            state = json.loads(path.read_text())
            providers[state["name"]] = Provider(state["name"], int(state["number"]))
    return providers


def provider(name: str) -> Provider:
    """A provider that has hosts now (its number, ranges and router)."""
    try:
        return _saved_providers()[name]
    except KeyError:
        raise LabError(f"no provider {name!r} in the lab (it has no hosts)") from None


def _check_provider_name(name: str) -> None:
    if not PROVIDER_NAME.fullmatch(name):
        raise LabError(f"bad provider name {name!r} (a lowercase letter, then up to 9 lowercase letters or digits)")


def _ensure_provider(name: str) -> Provider:
    """The provider's router, made if missing (called with the hosts lock held)."""
    _check_provider_name(name)
    saved = _saved_providers()
    prov = saved.get(name)
    if prov is None:
        used = {p.number for p in saved.values()}
        free = [k for k in range(1, MAX_PROVIDERS + 1) if k not in used]
        if not free:
            raise LabError(f"no free provider number (at most {MAX_PROVIDERS} providers)")
        prov = Provider(name, free[0])
        _providers_dir().mkdir(parents=True, exist_ok=True)
        (_providers_dir() / f"{name}.json").write_text(json.dumps({"name": name, "number": prov.number}))
    if not (_ns_link_exists(prov.netns, "lan") and _ns_link_exists(prov.netns, "uplink")
            and _link_exists(prov.uplink_veth)):
        _setup_router(prov)
    _sync_provider_routes()
    return prov


def _ensure_inet_bridge() -> None:
    if not _link_exists(INET_BRIDGE):
        clash = _run("ip", "-4", "route", "show", "to", "match", INET_GATEWAY).stdout.decode()
        if any(line and not line.startswith("default") for line in clash.splitlines()):
            raise LabError(f"{INET_NETWORK} is already routed on this machine ({clash.strip()}); "
                           "not adding the lab's internet bridge")
        _run("ip", "link", "add", INET_BRIDGE, "address", _mac(INET_GATEWAY), "type", "bridge")
    have = _run("ip", "-o", "-4", "addr", "show", "dev", INET_BRIDGE).stdout.decode()
    for address in (INET_GATEWAY, BACKDOOR_SOURCE):  # the first one added is the primary
        if f"inet {address}/{INET_NETWORK.prefixlen}" not in have:
            _run("ip", "addr", "add", f"{address}/{INET_NETWORK.prefixlen}", "dev", INET_BRIDGE)
    _run("ip", "link", "set", INET_BRIDGE, "up")


def _setup_router(prov: Provider) -> None:
    _remove_router(prov)
    _ensure_inet_bridge()
    ns = prov.netns
    _run("ip", "netns", "add", ns)
    # The router's own forwarding (this machine's stays as it is); no ICMP redirects, which
    # would send a host's hairpin traffic straight to the other host's private address; and
    # traffic between hosts on the private bridge stays out of the router's iptables.
    _ns_sysctl(ns, "net/ipv4/ip_forward", 1)
    for conf in ("all", "default"):
        _ns_sysctl(ns, f"net/ipv4/conf/{conf}/send_redirects", 0)
    _ns_sysctl(ns, "net/bridge/bridge-nf-call-iptables", 0, required=False)
    ip = ("ip", "-n", ns)
    _run(*ip, "link", "set", "lo", "up")
    _run(*ip, "link", "add", "lan", "address", _mac(prov.gateway), "type", "bridge")
    _run(*ip, "addr", "add", f"{prov.gateway}/{prov.private_network.prefixlen}", "dev", "lan")
    _run(*ip, "link", "set", "lan", "up")
    _run("ip", "link", "add", prov.uplink_veth, "type", "veth",
         "peer", "name", "uplink", "address", _mac(prov.uplink_address), "netns", ns)
    _run("ip", "link", "set", prov.uplink_veth, "master", INET_BRIDGE, "up")
    _run(*ip, "addr", "add", f"{prov.uplink_address}/{INET_NETWORK.prefixlen}", "dev", "uplink")
    _run(*ip, "link", "set", "uplink", "up")
    # The lab services (the apt repository) listen on 10.200.0.1: reachable as an internet address.
    _run(*ip, "route", "add", f"{GATEWAY}/32", "via", INET_GATEWAY, "dev", "uplink")


def _remove_router(prov: Provider) -> None:
    """The router namespace (with it its bridge, the hosts' router sides and its rules), the
    uplink and this machine's route to the provider's public range."""
    _kill_netns_pids(prov.netns)
    if _netns_exists(prov.netns):
        _run("ip", "netns", "del", prov.netns, check=False)
    if _link_exists(prov.uplink_veth):
        _run("ip", "link", "del", prov.uplink_veth, check=False)
    if prov.number and _link_exists(INET_BRIDGE):
        _run("ip", "route", "del", str(prov.public_network), "dev", INET_BRIDGE, check=False)


def _route_targets(*ip: str) -> dict[str, str]:
    """Routes to public ranges (not the internet bridge's own subnet): network -> full line."""
    out = {}
    for line in _run(*ip, "-4", "route", "show", check=False).stdout.decode().splitlines():
        with contextlib.suppress(ValueError, IndexError):
            net = ipaddress.ip_network(line.split()[0], strict=False)
            if net.subnet_of(PUBLIC_SPACE) and net != INET_NETWORK and net.prefixlen < 32:
                out[str(net)] = line
    return out


def _sync_provider_routes() -> None:
    """This machine and every router: a route to each (other) live provider's public range via
    its router; routes to ranges of providers that are gone are removed."""
    live = [p for p in _saved_providers().values() if _ns_link_exists(p.netns, "uplink")]
    if _link_exists(INET_BRIDGE):
        wanted = {str(p.public_network): p for p in live}
        for net, line in _route_targets("ip").items():
            if net not in wanted and f"dev {INET_BRIDGE}" in line:
                _run("ip", "route", "del", net, "dev", INET_BRIDGE, check=False)
        for net, p in wanted.items():
            _run("ip", "route", "replace", net, "via", p.uplink_address, "dev", INET_BRIDGE, "src", INET_GATEWAY)
    for router in live:
        ip = ("ip", "-n", router.netns)
        wanted = {str(p.public_network): p for p in live if p is not router}
        for net in _route_targets(*ip):
            if net not in wanted:
                _run(*ip, "route", "del", net, check=False)
        for net, p in wanted.items():
            _run(*ip, "route", "replace", net, "via", p.uplink_address, "dev", "uplink")


def _host_states() -> tuple[dict[str, dict], bool]:
    """Saved host states by name, and whether every host directory had a readable one (a state
    being rewritten by another process can read as half a file: read again, then give up)."""
    states, complete = {}, True
    hosts_dir = LAB_DIR / "hosts"
    for d in sorted(hosts_dir.iterdir()) if hosts_dir.is_dir() else []:
        for _ in range(5):
            try:
                states[d.name] = json.loads((d / "state.json").read_text())
                break
            except (OSError, ValueError):
                if not d.exists():
                    break
                time.sleep(0.05)
        else:
            complete = False
    return states, complete


def _prune_providers() -> None:
    """Remove what no host needs (called with the hosts lock held): providers without hosts
    (their state, router namespace, uplink and routes), in routers that stay the NAT rules of
    hosts that are gone and the blocks of processes that ended, routes to gone providers, and
    the internet bridge once no provider is left. Leftovers of a crash are found by name
    (bslabp-*, bslu-*) and by rule comment (bslab-<host>, bslab-block:<pid>:<start>)."""
    states, complete = _host_states()
    if not complete:
        return  # not sure which hosts exist: remove nothing this time
    needed = {s.get("provider") for s in states.values()} - {None}
    saved = _saved_providers()
    names = set(saved)
    names |= {p.name[len(ROUTER_NETNS_PREFIX):] for p in Path("/run/netns").glob(ROUTER_NETNS_PREFIX + "*")}
    names |= {p.name[len(UPLINK_PREFIX):] for p in Path("/sys/class/net").glob(UPLINK_PREFIX + "*")}
    for name in sorted(names - needed):
        _remove_router(saved.get(name) or Provider(name, 0))  # 0: no state, so no route of its own
        (_providers_dir() / f"{name}.json").unlink(missing_ok=True)
    for prov in _saved_providers().values():
        if not _netns_exists(prov.netns):
            continue
        mine = {n for n, s in states.items() if s.get("provider") == prov.name}
        for table, chains in (("nat", ("PREROUTING", "POSTROUTING")), ("filter", ("FORWARD",))):
            for chain in chains:
                listed = _ns_iptables(prov.netns, "-t", table, "-S", chain, check=False).stdout.decode()
                for line in listed.splitlines():
                    m = re.search(r"--comment \"?(bslab-[^\s\"]+)", line)
                    if not m or not line.startswith(f"-A {chain} "):
                        continue
                    comment = m.group(1)
                    if comment.startswith(BLOCK_COMMENT):
                        owner = comment[len(BLOCK_COMMENT):].split(":")
                        with contextlib.suppress(ValueError):
                            if len(owner) == 2 and _process_alive([int(owner[0]), int(owner[1])]):
                                continue
                    elif comment[len("bslab-"):] in mine:
                        continue
                    _ns_iptables(prov.netns, "-t", table, "-D", *shlex.split(line)[1:], check=False)
    _sync_provider_routes()
    if not _saved_providers() and _link_exists(INET_BRIDGE):
        _run("ip", "link", "del", INET_BRIDGE, check=False)
    with contextlib.suppress(OSError):
        _providers_dir().rmdir()  # only when empty


@dataclass(frozen=True)
class ProviderBlock:
    """A provider firewall rule that Lab.block added (Lab.unblock or cleanup removes it)."""

    provider: str
    proto: str
    port: int | str
    rule: tuple[str, ...]


# --------------------------------------------------------------------------- hosts


@dataclass
class HostSpec:
    name: str
    address: str | None = None
    gpu: bool = False
    nat: bool = False  # reached from this machine at a public address that is not on the host
    # At a provider (a short lowercase name): a private address at the provider, a public one
    # outside it (see PROVIDER_PRIVATE); not with nat. An address must be in the private range.
    provider: str | None = None
    extra_files: dict[str, FileContent] = field(default_factory=dict)


class TestHost:
    """One booted test host. Its state lives in ``LAB_DIR/hosts/<name>/``."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str, address: str, pid: int | None = None, public_address: str | None = None,
                 provider: str | None = None):
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name):
            raise LabError(f"bad test host name {name!r} (lowercase letters, digits, '-')")
        self.name = name
        self.address = address  # on eth0; the back door (ssh()) uses it, but for provider hosts
        self.public_address = public_address  # only with nat or a provider: what an inventory names
        self.provider = provider  # the provider's name (HostSpec.provider), or None
        self.pid = pid
        self.baseline: set[str] = set()
        self._popen: subprocess.Popen | None = None
        self.boot_seconds: float | None = None  # last boot: nspawn start to "systemd running"
        self._last_poll = "not checked yet"
        # The process whose Lab removes this host at cleanup ([pid, start time]); None for
        # hosts that stay up (the command's "up").
        self.owner: list[int] | None = None

    # state --------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return LAB_DIR / "hosts" / self.name

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def netns(self) -> str:
        return f"bslab-{self.name}"

    @property
    def veth(self) -> str:
        name = f"bsl-{self.name}"
        return name if len(name) <= 15 else "bsl-" + uuid.uuid5(uuid.NAMESPACE_DNS, self.name).hex[:11]

    @property
    def router_netns(self) -> str | None:
        """The provider's router namespace, which holds the router side of the veth."""
        return ROUTER_NETNS_PREFIX + self.provider if self.provider else None

    @property
    def backdoor_address(self) -> str:
        """Where the back door (ssh(), ssh_command(), the readiness check) connects: the private
        address on the lab bridge; for provider hosts the public one, from BACKDOOR_SOURCE."""
        return self.public_address if self.provider else self.address

    def _veth_ip(self) -> tuple[str, ...]:
        return ("ip", "-n", self.router_netns) if self.provider else ("ip",)

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    def _save(self) -> None:
        state = {"name": self.name, "address": self.address, "pid": self.pid, "owner": self.owner,
                 "baseline": sorted(self.baseline), "public_address": self.public_address,
                 "provider": self.provider}
        (self.dir / "state.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, name: str) -> "TestHost":
        state = json.loads((LAB_DIR / "hosts" / name / "state.json").read_text())
        host = cls(state["name"], state["address"], state.get("pid"), state.get("public_address"),
                   state.get("provider"))
        host.owner = state.get("owner")
        host.baseline = set(state.get("baseline", []))
        return host

    def is_running(self) -> bool:
        return _pid_is_nspawn(self.pid, str(self.upper))

    # preparing ----------------------------------------------------------
    def _prepare(self, rootfs: Path, files: Mapping[str, FileContent]) -> None:
        """First boot only: name, machine-id, host keys, lab key, caller's files."""
        self.upper.mkdir()

        def put(remote: str, value: FileContent, owner: tuple[int, int] = (0, 0)) -> None:
            write_into_upper(self.upper, rootfs, remote, value, owner)

        put("/etc/hostname", f"{self.name}\n")
        put("/etc/machine-id", (uuid.uuid4().hex + "\n", 0o444))
        hosts = (rootfs / "etc/hosts").read_text()
        put("/etc/hosts", hosts.rstrip("\n") + f"\n{self.address}\t{self.name}\n")
        _mkparents(self.upper, rootfs, Path("etc/ssh/ssh_host_ed25519_key"))
        _run("ssh-keygen", "-A", "-f", str(self.upper))
        pub = (key_path().with_suffix(".pub")).read_bytes()
        put("/root/.ssh/authorized_keys", (pub, 0o600))
        put(f"/home/{SSH_USER}/.ssh/authorized_keys", (pub, 0o600), (1000, 1000))
        for remote, value in files.items():
            put(remote, value)

    def _setup_network(self) -> None:
        """The host's namespace and veth (the bridge, or the provider's router, exists already)."""
        self._teardown_network()
        _run("ip", "netns", "add", self.netns)
        if self.provider:
            self._setup_provider_network()
            return
        _run("ip", "link", "add", self.veth, "type", "veth",
             "peer", "name", "eth0", "address", _mac(self.address), "netns", self.netns)
        _run("ip", "link", "set", self.veth, "master", BRIDGE, "up")
        ns = ("ip", "-n", self.netns)
        _run(*ns, "addr", "add", f"{self.address}/{NETWORK.prefixlen}", "dev", "eth0")
        _run(*ns, "link", "set", "eth0", "up")
        _run(*ns, "link", "set", "lo", "up")
        _run(*ns, "route", "add", "default", "via", GATEWAY)
        if self.public_address:
            # Routed onto the bridge so nothing leaves the lab; the DNAT rewrites it to eth0's.
            _run("ip", "route", "replace", str(PUBLIC_NETWORK), "dev", BRIDGE, "src", GATEWAY)
            _iptables("-t", "nat", "-A", *self._nat_rule())

    def _setup_provider_network(self) -> None:
        prov = provider(self.provider)
        if not _ns_link_exists(prov.netns, "lan"):
            raise LabError(f"{self.name}: provider {self.provider}'s router is not there")
        _run("ip", "-n", prov.netns, "link", "add", self.veth, "type", "veth",
             "peer", "name", "eth0", "address", _mac(self.address), "netns", self.netns)
        _run("ip", "-n", prov.netns, "link", "set", self.veth, "master", "lan", "up")
        ns = ("ip", "-n", self.netns)
        _run(*ns, "addr", "add", f"{self.address}/{prov.private_network.prefixlen}", "dev", "eth0")
        _run(*ns, "link", "set", "eth0", "up")
        _run(*ns, "link", "set", "lo", "up")
        _run(*ns, "route", "add", "default", "via", prov.gateway)
        for table, rule in self._provider_nat_rules():
            _ns_iptables(prov.netns, "-t", table, "-A", *rule)

    def _provider_nat_rules(self) -> list[tuple[str, tuple[str, ...]]]:
        """1:1 NAT in the router: in (from anywhere, the private bridge included), out through
        the uplink, and hairpin (a same-provider host at the public address sees this one's
        public address, so the answer comes back through the router)."""
        tag = ("-m", "comment", "--comment", f"bslab-{self.name}")
        private, public = f"{self.address}/32", f"{self.public_address}/32"
        return [
            ("nat", ("PREROUTING", "-d", public, *tag, "-j", "DNAT", "--to-destination", self.address)),
            ("nat", ("POSTROUTING", "-s", private, "-o", "uplink", *tag, "-j", "SNAT", "--to-source",
                     self.public_address)),
            ("nat", ("POSTROUTING", "-s", private, "-o", "lan", "-m", "conntrack", "--ctstate", "DNAT", *tag,
                     "-j", "SNAT", "--to-source", self.public_address)),
        ]

    def _nat_rule(self) -> tuple[str, ...]:
        return ("OUTPUT", "-d", f"{self.public_address}/32", "-m", "comment", "--comment", f"bslab-{self.name}",
                "-j", "DNAT", "--to-destination", self.address)

    def _teardown_network(self) -> None:
        if self.provider:
            if _netns_exists(self.router_netns) and self.address and self.public_address:
                for table, rule in self._provider_nat_rules():
                    _ns_delete_rule(self.router_netns, table, rule)
        elif self.public_address:
            while _iptables("-t", "nat", "-C", *self._nat_rule(), check=False).returncode == 0:
                _iptables("-t", "nat", "-D", *self._nat_rule())
        _kill_netns_pids(self.netns)
        if Path("/run/netns", self.netns).exists():
            _run("ip", "netns", "del", self.netns, check=False)
        if _ns_link_exists(self.router_netns, self.veth):
            _run(*self._veth_ip(), "link", "del", self.veth, check=False)

    # running ------------------------------------------------------------
    def _boot(self, rootfs: Path) -> None:
        _run(*self._veth_ip(), "link", "set", self.veth, "up")
        cmd = [
            "systemd-nspawn", "-D", str(rootfs), f"--overlay={rootfs}:{self.upper}:/",
            "--register=no", "--keep-unit", f"--network-namespace-path=/run/netns/{self.netns}",
            "-M", self.name, "--console=read-only", f"--capability={','.join(CAPABILITIES)}", "-b",
        ]
        # Hosts share one lower dir (no image lock); /proc/sys/net is writable (per netns).
        env = dict(os.environ, SYSTEMD_NSPAWN_LOCK="0", SYSTEMD_NSPAWN_API_VFS_WRITABLE="network")
        with open(self.console_log, "ab") as log:
            log.write(f"\n==== boot {time.strftime('%F %T')}: {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env=env, start_new_session=True)
        self.pid = proc.pid
        self._popen = proc
        self._boot_started = time.monotonic()
        self._save()

    def _poll_ready(self) -> bool:
        """One readiness check: True when systemd says running or degraded."""
        if not self.is_running():
            rc = self._popen.poll() if self._popen is not None else None
            if self._popen is not None and rc is None:
                return False  # just forked: /proc/PID/cmdline is not nspawn's yet
            raise LabError(f"{self.name}: systemd-nspawn exited during boot (exit status {rc})\n{self.console_tail()}")
        source = (BACKDOOR_SOURCE, 0) if self.provider else None
        try:
            with socket.create_connection((self.backdoor_address, 22), timeout=1, source_address=source):
                pass
        except OSError as exc:
            self._last_poll = f"port 22: {exc}"
            return False
        proc = self.ssh("systemctl is-system-running", check=False, timeout=10)
        self._last_poll = f"ssh exit {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-300:]}"
        return proc.stdout.strip() in ("running", "degraded")

    def console_tail(self, chars: int = 4000) -> str:
        text = self.console_log.read_text(errors="replace") if self.console_log.exists() else ""
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return f"--- console ({self.console_log}) ---\n{text[-chars:]}"

    def kill(self) -> None:
        """Spot loss: SIGKILL the machine and take its link down (no answer at all)."""
        if self.is_running():
            # The container's init is nspawn's child: killing it ends the whole PID
            # namespace (killing nspawn alone would leave the machine running), and
            # nspawn, left to exit by itself, reaps it.
            for child in _children(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.02)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._popen is not None:
            self._popen.wait(5)
            self._popen = None
        _kill_netns_pids(self.netns)
        if _ns_link_exists(self.router_netns, self.veth):
            _run(*self._veth_ip(), "link", "set", self.veth, "down", check=False)
        self.pid = None
        if (self.dir / "state.json").exists():
            self._save()

    def restart(self, timeout: float = 60) -> None:
        """Boot again on the same overlay: same name, IP, host keys, lab key and files."""
        self.kill()
        self._boot(ensure_rootfs())
        _wait_ready([self], timeout)

    def recreate(self, files: Mapping[str, FileContent] | None = None, timeout: float = 60) -> None:
        """A new machine under the same name and address (a spot VM re-created): a fresh
        overlay, so a new machine-id, new SSH host keys and nothing of the old one, and a
        fresh network namespace (the old one's links, a VXLAN socket among them, stay with it)."""
        self.kill()
        shutil.rmtree(self.upper)
        rootfs = ensure_rootfs()
        self._prepare(rootfs, files or {})
        self._setup_network()
        self._boot(rootfs)
        _wait_ready([self], timeout)
        self.baseline = self.upper_files()
        self._save()

    def destroy(self) -> None:
        """Kill the host and remove its namespace, veth and directory."""
        self.kill()
        self._teardown_network()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.pid = None

    # back door ----------------------------------------------------------
    def ssh_command(self, user: str = SSH_USER) -> list[str]:
        """The back door: ssh to backdoor_address (the last item is user@address)."""
        return [
            "ssh", "-F", "/dev/null", "-i", str(key_path()), "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
            *(("-b", BACKDOOR_SOURCE) if self.provider else ()), f"{user}@{self.backdoor_address}",
        ]

    def ssh(self, cmd: str, user: str = SSH_USER, check: bool = True, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.ssh_command(user) + [cmd], capture_output=True, text=True,
                              timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise LabError(f"{self.name}: {cmd!r} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def host_key(self, kind: str = "ed25519") -> str:
        """The host key sshd presents now ("ssh-ed25519 AAAA...")."""
        # A provider host's own namespace reaches its sshd whatever Lab.block dropped.
        inside = ("ip", "netns", "exec", self.netns) if self.provider else ()
        out = _run(*inside, "ssh-keyscan", "-T", "5", "-t", kind, self.address, check=False).stdout.decode()
        for line in out.splitlines():
            if not line.startswith("#") and line.strip():
                return line.split(None, 1)[1].strip()
        raise LabError(f"{self.name}: no {kind} host key from {self.address}")

    def regenerate_host_key(self) -> str:
        """New sshd host keys (as after a reinstall) and sshd restarted; returns the new ed25519 key."""
        self.ssh("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A && systemctl restart ssh", user="root")
        return self.host_key()

    def stop_sshd(self) -> None:
        self.ssh("systemctl stop ssh.socket ssh.service 2>/dev/null; systemctl stop ssh.service", user="root")

    # files --------------------------------------------------------------
    def upper_files(self) -> set[str]:
        """Every path in the upper dir (files, dirs, links, whiteouts), relative."""
        out = set()
        for dirpath, dirnames, filenames in os.walk(self.upper):
            rel = Path(dirpath).relative_to(self.upper)
            for n in dirnames + filenames:
                out.add(str(rel / n))
        return out

    def created_files(self) -> set[str]:
        """What changed in the host's files since boot: paths in the upper dir that were
        not there at boot, less BOOT_NOISE and less copy-ups that equal the rootfs (a
        directory that only got copied up because a file in it came and went, a file
        restored to its original content)."""
        rootfs = ensure_rootfs()
        return {
            p for p in self.upper_files() - self.baseline
            if not BOOT_NOISE.match(p) and not _same_as_lower(self.upper / p, rootfs / p)
        }

    def __repr__(self) -> str:
        where = f", provider={self.provider!r}" if self.provider else ""
        return f"TestHost({self.name!r}, {self.address!r}, pid={self.pid}{where})"


# A boot that lost a race under load (seen with 20 machines booting on 2 cores): a unit
# that lets users log in failed, so SSH will never answer. Booted again once, it works.
LOGIN_BLOCKED = re.compile(r"FAILED\] Failed to start (systemd-user-sessions|ssh)\.service")


def _wait_ready(hosts: list[TestHost], timeout: float) -> None:
    """Until every host answers SSH. A boot that stalls (seen on a loaded 2-core machine: the
    console stops early in systemd's start) gets one fresh boot at half the time."""
    started = time.monotonic()
    deadline = started + timeout
    pending = list(hosts)
    rebooted: set[str] = set()
    while pending:
        for host in [h for h in pending if h._poll_ready()]:
            host.boot_seconds = time.monotonic() - host._boot_started
            pending.remove(host)
        if not pending:
            break
        stalled = time.monotonic() - started > timeout / 2
        for host in pending:
            if host.name not in rebooted and (stalled or LOGIN_BLOCKED.search(host.console_tail())):
                rebooted.add(host.name)
                host.kill()
                host._boot(ensure_rootfs())
        if time.monotonic() > deadline:
            tails = "\n".join(f"{h.name} (last check: {h._last_poll}):\n{h.console_tail()}" for h in pending)
            raise LabError(f"test hosts not ready after {timeout:.0f}s: {[h.name for h in pending]}\n{tails}")
        time.sleep(0.2)


class Lab:
    """Starts test hosts and cleans up every host it started (``cleanup`` is idempotent)."""

    def __init__(self, nvidia_smi: Path | None = None):
        self.hosts: dict[str, TestHost] = {}
        self.blocks: list[ProviderBlock] = []
        self.nvidia_smi = nvidia_smi or NVIDIA_SMI_STANDIN

    @property
    def key(self) -> Path:
        return key_path()

    def gpu_files(self) -> dict[str, FileContent]:
        if not self.nvidia_smi.exists():
            raise LabError(f"no nvidia-smi stand-in at {self.nvidia_smi}")
        # The kernel log stand-in: what dmesg prints (Xid reports) comes from
        # /etc/bootstrap-standin/kmsg, which a test writes (tests/standins/dmesg).
        return {"/usr/bin/nvidia-smi": (self.nvidia_smi, 0o755), GPU_FIXTURES_REMOTE: (GPU_FIXTURES, 0o644),
                "/usr/local/bin/dmesg": (TESTS_DIR / "standins" / "dmesg", 0o755)}

    def start(self, names_or_specs: Iterable[str | HostSpec], gpu: Iterable[str] = (),
              extra_files: Mapping[str, FileContent] | None = None, timeout: float = 120) -> list[TestHost]:
        """Boot hosts in parallel and wait until each answers SSH with systemd running.

        ``extra_files`` (for every host; a HostSpec may add its own) maps a remote path to
        bytes/str/Path (a directory Path copies the tree) or to ``(content, mode)``.
        A host of the same name left by a crashed run or by ``up`` is replaced; one that
        another live process started is waited for (up to ``timeout``).
        """
        specs = [s if isinstance(s, HostSpec) else HostSpec(s) for s in names_or_specs]
        if not specs:
            return []
        if len({s.name for s in specs}) != len(specs):
            raise LabError(f"duplicate test host names: {[s.name for s in specs]}")
        for spec in specs:
            if spec.provider is not None:
                _check_provider_name(spec.provider)
                if spec.nat:
                    raise LabError(f"{spec.name}: nat and provider exclude each other (a provider host has "
                                   "its provider's 1:1 NAT)")
        gpu = set(gpu)
        rootfs = ensure_rootfs()
        key_path()
        me = _process_identity(os.getpid())
        files = {}
        for spec in specs:
            files[spec.name] = dict(extra_files or {})
            if spec.gpu or spec.name in gpu:
                files[spec.name].update(self.gpu_files())
            files[spec.name].update(spec.extra_files)
        hosts = []
        deadline = time.monotonic() + timeout
        while not hosts:
            with _locked(LAB_DIR / ".hosts.lock"):
                # Hosts of crashed test runs go; hosts another live process uses are waited for.
                existing = {h.name: h for h in known_hosts()}
                for host in existing.values():
                    if host.owner and not _process_alive(host.owner):
                        host.destroy()
                busy = {n: h.owner[0] for n, h in existing.items()
                        if n in files and h.owner and h.owner != me and _process_alive(h.owner)}
                if not busy:
                    _ensure_bridge()
                    for spec in specs:
                        _remove_stale(spec.name)
                    for spec in specs:
                        if spec.provider:
                            prov = _ensure_provider(spec.provider)
                            address = _provider_address(prov, spec.address)
                            public = prov.public_address_for(address)
                        else:
                            address = spec.address or _allocate_address(spec.name)
                            public = public_address_for(address) if spec.nat else None
                        host = TestHost(spec.name, address, public_address=public, provider=spec.provider)
                        host.owner = me
                        host.dir.mkdir(parents=True)
                        host._save()  # claims the name and the address
                        self.hosts[host.name] = host
                        hosts.append(host)
                    _prune_providers()  # ones a crashed run or a replaced host left without hosts
                    break
            if time.monotonic() > deadline:
                raise LabError(f"test hosts in use by other processes (name: pid): {busy}")
            time.sleep(0.5)

        def prepare_and_boot(host: TestHost) -> None:
            host._prepare(rootfs, files[host.name])
            host._setup_network()
            host._boot(rootfs)

        # In parallel: host key generation (RSA) is the slow part of preparing a host.
        with ThreadPoolExecutor(max_workers=len(hosts) or 1) as pool:
            for future in [pool.submit(prepare_and_boot, h) for h in hosts]:
                future.result()
        _wait_ready(hosts, timeout)
        for host in hosts:
            host.baseline = host.upper_files()
            host._save()
        return hosts

    def __getitem__(self, name: str) -> TestHost:
        return self.hosts[name]

    def block(self, provider_name: str, proto: str, port: int | str) -> ProviderBlock:
        """A provider firewall (security group) rule: drop what comes from outside the provider
        (through its router's uplink: other providers, this machine) to its hosts on proto/port
        ("tcp" or "udp"; a port or "first:last"). Traffic within the provider is not affected,
        nor is the tests' back door (from BACKDOOR_SOURCE). Lab.unblock or cleanup removes it."""
        if proto not in ("tcp", "udp"):
            raise LabError(f"block: proto must be tcp or udp, not {proto!r}")
        if not re.fullmatch(r"\d{1,5}(:\d{1,5})?", str(port)) or \
                not all(1 <= int(p) <= 65535 for p in str(port).split(":")):
            raise LabError(f"block: bad port {port!r}")
        prov = provider(provider_name)
        if not _netns_exists(prov.netns):
            raise LabError(f"block: provider {provider_name}'s router is not there")
        owner = _process_identity(os.getpid())
        rule = ("FORWARD", "-i", "uplink", "!", "-s", f"{BACKDOOR_SOURCE}/32", "-d", str(prov.private_network),
                "-p", proto, "-m", proto, "--dport", str(port),
                "-m", "comment", "--comment", f"{BLOCK_COMMENT}{owner[0]}:{owner[1]}", "-j", "DROP")
        _ns_iptables(prov.netns, "-I", *rule)
        block = ProviderBlock(provider_name, proto, port, rule)
        self.blocks.append(block)
        return block

    def unblock(self, block: ProviderBlock) -> None:
        """Remove a rule Lab.block added (no error when it, or its router, is gone already)."""
        netns = ROUTER_NETNS_PREFIX + block.provider
        if _netns_exists(netns) and _ns_iptables(netns, "-C", *block.rule, check=False).returncode == 0:
            _ns_iptables(netns, "-D", *block.rule)
        with contextlib.suppress(ValueError):
            self.blocks.remove(block)

    def cleanup(self) -> None:
        errors = []
        for block in list(self.blocks):
            try:
                self.unblock(block)
            except Exception as exc:
                errors.append(f"block {block.provider} {block.proto}/{block.port}: {exc}")
                self.blocks.remove(block)
        for host in list(self.hosts.values()):
            try:
                host.destroy()
            except Exception as exc:  # keep cleaning the others
                errors.append(f"{host.name}: {exc}")
            self.hosts.pop(host.name, None)
        with _locked(LAB_DIR / ".hosts.lock"):
            _prune_providers()
            _remove_bridge_if_unused()
        if errors:
            raise LabError("cleanup: " + "; ".join(errors))

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


def _process_identity(pid: int) -> list[int] | None:
    """[pid, start time]: tells a process from a later one that reuses its pid."""
    try:
        return [pid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])]
    except (OSError, IndexError, ValueError):
        return None


def _process_alive(owner: list[int]) -> bool:
    return _process_identity(owner[0]) == list(owner)


def _remove_stale(name: str) -> None:
    """Remove what an earlier run left of host ``name`` (running or not)."""
    try:
        host = TestHost.load(name)
    except (OSError, ValueError, KeyError):
        host = TestHost(name, "")
    host.destroy()


def _allocate_address(name: str) -> str:
    """Called with the hosts lock held."""
    used = set()
    for state in (LAB_DIR / "hosts").glob("*/state.json"):
        with contextlib.suppress(Exception):
            used.add(json.loads(state.read_text())["address"])
    if name in KNOWN_HOSTS:
        address = KNOWN_HOSTS[name]
        if address in used:
            raise LabError(f"{address} is already used by another test host")
        return address
    for i in range(FIRST_FREE, 255):
        address = str(NETWORK.network_address + i)
        if address not in used:
            return address
    raise LabError("no free address in 10.200.0.0/24")


def _provider_address(prov: Provider, wanted: str | None) -> str:
    """A private address at the provider (called with the hosts lock held)."""
    used = {s.get("address") for s in _host_states()[0].values() if s.get("provider") == prov.name}
    if wanted:
        net = prov.private_network
        if ipaddress.ip_address(wanted) not in net or wanted in map(str, (net[0], net[1], net[-1])):
            raise LabError(f"{wanted} is not a host address of provider {prov.name} ({prov.private_network})")
        if wanted in used:
            raise LabError(f"{wanted} is already used by another test host")
        return wanted
    for i in range(PROVIDER_FIRST_HOST, 255):
        address = str(prov.private_network.network_address + i)
        if address not in used:
            return address
    raise LabError(f"no free address in {prov.private_network}")


def known_hosts() -> list[TestHost]:
    """Hosts with state under the lab dir (started by this or another process)."""
    hosts = []
    for state in sorted((LAB_DIR / "hosts").glob("*/state.json")):
        with contextlib.suppress(Exception):
            hosts.append(TestHost.load(state.parent.name))
    return hosts


# --------------------------------------------------------------------------- lab services
#
# What inventories/lab.yaml names besides the hosts, started by `up` and stopped by `down`:
# the NVIDIA container toolkit's apt repository (the hosts cannot reach NVIDIA's), served on
# the lab bridge by a detached process whose pid is kept here, so `down` ends only it; and
# (built by `up`, kept by `down`) the k3s air-gap folder and the chart archives.

LAB_AIRGAP = LAB_DIR / "airgap"  # inventories/lab.yaml's k3s.airgap
LAB_CHARTS = LAB_DIR / "charts"  # inventories/lab.yaml's charts.<component>.archive


def build_lab_files() -> None:
    """The k3s stand-in's air-gap folder and the lab charts (tests/labcharts.py, `helm
    package`), where inventories/lab.yaml points; each one missing is said and skipped, so
    the hosts stay usable for what does not need it."""
    sys.path.insert(0, str(TESTS_DIR))
    try:
        from standins.airgap import build_airgap

        print(f"k3s stand-in air-gap folder (k3s.airgap): {build_airgap(LAB_AIRGAP)}")
    except Exception as exc:  # upstream data missing: hosts are still usable for facts
        print(f"no k3s air-gap folder built ({exc})", file=sys.stderr)
    try:
        from labcharts import lab_charts

        lab_charts(LAB_CHARTS)
        print(f"lab charts (charts: in inventories/lab.yaml): {LAB_CHARTS}")
    except Exception as exc:  # no helm: the cluster side cannot run anyway
        print(f"no lab charts built ({exc}); `bootstrap up inventories/lab.yaml` needs them", file=sys.stderr)

LAB_APT_PORT = 8089
LAB_APT_SOURCE = f"deb [trusted=yes] http://10.200.0.1:{LAB_APT_PORT}/ ./"  # inventories/lab.yaml's
APT_PIDFILE = LAB_DIR / "aptrepo.pid"
APT_MARKER = "bootstrap-lab-aptrepo"


def _apt_server_pid() -> int | None:
    try:
        pid = int(APT_PIDFILE.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if APT_MARKER.encode() in cmdline else None


def start_lab_services() -> str:
    """The toolkit's apt repository on 10.200.0.1:8089 (idempotent); returns its source line."""
    if _apt_server_pid() is not None:
        return LAB_APT_SOURCE
    sys.path.insert(0, str(TESTS_DIR))
    from standins.aptrepo import build_toolkit_debs, write_flat_repo

    repo = LAB_DIR / "apt"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    write_flat_repo(repo, build_toolkit_debs(LAB_DIR / "apt-debs"))
    log = open(LAB_DIR / "aptrepo.log", "ab")
    # argv[0] carries the marker, so `down` can tell this process from any other.
    proc = subprocess.Popen([sys.executable, "-c", "import sys, runpy; sys.argv = sys.argv[1:]; "
                             "runpy.run_module('http.server', run_name='__main__')", APT_MARKER,
                             "--bind", "10.200.0.1", "--directory", str(repo), str(LAB_APT_PORT)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    APT_PIDFILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("10.200.0.1", LAB_APT_PORT), timeout=1):
                return LAB_APT_SOURCE
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError(f"the lab's apt repository did not start; see {LAB_DIR / 'aptrepo.log'}")


def stop_lab_services() -> None:
    pid = _apt_server_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _apt_server_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    APT_PIDFILE.unlink(missing_ok=True)


def down() -> None:
    """Remove every host, namespace, veth and the bridge; keep the key and rootfs cache."""
    stop_lab_services()
    with _locked(LAB_DIR / ".hosts.lock"):
        for host in known_hosts():
            host.destroy()
        # leftovers without state (a crash between creating a namespace and saving state)
        for ns in Path("/run/netns").glob("bslab-*"):
            _kill_netns_pids(ns.name)
            _run("ip", "netns", "del", ns.name, check=False)
        shutil.rmtree(LAB_DIR / "hosts", ignore_errors=True)
        for link in Path("/sys/class/net").glob("bsl-*"):
            _run("ip", "link", "del", link.name, check=False)
        _drop_leftover_nat_rules()
        _prune_providers()  # no host is left: every router, uplink, route and the internet bridge
        _remove_bridge_if_unused()


# --------------------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testhosts.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot test hosts (default: cp-1, gpu-1, gpu-2 of inventories/lab.yaml)")
    up.add_argument("names", nargs="*", metavar="NAME")
    up.add_argument("--count", type=int, help="cp-1 and COUNT-1 gpu hosts gpu-1, gpu-2, ...")
    up.add_argument("--gpu", nargs="*", metavar="NAME", help="hosts that get the nvidia-smi stand-in "
                    "(default: the hosts named gpu-*; --gpu alone: none)")
    sub.add_parser("status", help="list test hosts")
    kill = sub.add_parser("kill", help="stop test hosts as a spot loss does: no answer at all, the overlay "
                          "kept (`up NAME` boots a new machine in its place)")
    kill.add_argument("names", nargs="+", metavar="NAME")
    sub.add_parser("down", help="remove all test hosts (keeps the key and the rootfs cache)")
    args = parser.parse_args(argv)

    why = requirements_missing()
    if why:
        print(f"testhosts: {why}", file=sys.stderr)
        return 2
    if args.command == "up":
        if args.names and args.count:
            parser.error("give --count or names, not both")
        names = args.names or (["cp-1"] + [f"gpu-{i}" for i in range(1, args.count)] if args.count
                               else list(KNOWN_HOSTS))
        gpu = args.gpu if args.gpu is not None else [n for n in names if n.startswith("gpu-")]
        t0 = time.monotonic()
        hosts = Lab().start(names, gpu=gpu)
        for host in hosts:  # these stay up until "down"
            host.owner = None
            host._save()
        print(f"{len(hosts)} host(s) up in {time.monotonic() - t0:.1f}s; ssh user {SSH_USER}, key {key_path()}")
        build_lab_files()
        print(f"NVIDIA container toolkit apt repository (gpu.container_toolkit.apt_source): {start_lab_services()}")
        for h in hosts:
            print(f"  {h.name:10} {h.address:12} {'gpu' if h.name in gpu else '   '}  ssh -i {key_path()} {SSH_USER}@{h.address}")
    elif args.command == "status":
        hosts = known_hosts()
        if not hosts:
            print("no test hosts")
        for h in hosts:
            state = "running" if h.is_running() else "stopped"
            where = f" provider={h.provider} public={h.public_address}" if h.provider else ""
            print(f"{h.name:10} {h.address:12} {state:8} pid={h.pid} upper={h.upper}{where}")
    elif args.command == "kill":
        known = {h.name: h for h in known_hosts()}
        missing = [n for n in args.names if n not in known]
        if missing:
            print(f"testhosts: no test host {', '.join(missing)} (`status` lists them)", file=sys.stderr)
            return 2
        with _locked(LAB_DIR / ".hosts.lock"):
            for name in args.names:
                known[name].kill()
                print(f"{name} killed: it no longer answers ({known[name].address})")
    elif args.command == "down":
        down()
        print("test hosts removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
