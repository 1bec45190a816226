"""Probe, between every pair of hosts, the ports k3s needs (bootstrap.checks.reachability says
which), before any host changes. One SSH command per host, all in parallel, one round trip:

each host's command listens and probes at once. It binds a listener (python3) on the ports
its node will need, on the node's own address under test (never the wildcard); then, from
other threads, connects (TCP) or sends datagrams (UDP) to the other nodes' cluster addresses,
each carrying its MAC (bootstrap.checks.reachability, "proof of origin"). The hosts' commands
start within moments of each other, not at once, so a probe keeps trying for WINDOW_SECONDS:
a TCP connect refused by a port whose listener is not up yet is tried again, a datagram is
sent again until the receiver acknowledges it (the acknowledgement quotes the probe's own
line, so only that receiver, or someone on the path, can stop the sender early: it can hide
a pair that works, never show one that does not). A listener ends once it has heard every
probe it was told to expect (and, for the overlay's probe, its full-size datagram) and its
own probes are done, or at its deadline, flood or not; then the command prints what it bound,
what each of its probes did, what it heard, and "end".

The script is on the command line; everything else, the MACs above all, is one line of JSON
on the command's stdin: argv and the environment of a process are readable by every local
user (ps, /proc), stdin is not. Nothing is installed or written on the hosts. The listeners
run as the login user: every port involved is above 1024.

What a host prints back is read as hostile: sizes are capped, every field is checked, and a
host whose answer does not parse, or ends without "end", is a host that did not report (its
probes and its listener's are "not tested").
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import shlex
from dataclasses import dataclass, field

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory
from bootstrap.checks import reachability as rr

CONNECT_SECONDS = 3
# How long a probe keeps trying: the hosts' commands start this close together (each one an
# SSH channel on a connection already open, so the spread is about the spread of their
# round-trip times). Only a probe that does not get through waits that long.
WINDOW_SECONDS = 8
LISTEN_SECONDS = WINDOW_SECONDS + CONNECT_SECONDS + 1  # a listener's deadline: its own probes end first
COMMAND_SECONDS = 60  # the most the tool waits for one host's command (a host that hangs is "not tested")
MAX_ANSWER = 4 << 20  # characters: more is no honest answer

# stdin: {"seconds", "window", "timeout", "listen": [[proto, port, address]...],
#         "expect": [[proto, port, sender, line, mtu]...],
#         "probes": [[proto, address, port, line or null, [size...]]...]}
# Listening: every loop is bounded: each wake-up reads at most BATCH datagrams or connections
# per port and one chunk per connection, and the deadline is checked after each, so no flood
# keeps the command past it (a watchdog ends the process whatever happens). Only lines it was
# told to expect are recorded (one entry per sender and port; a datagram's largest size),
# and at most ACKS acknowledgements are sent per sender and port.
# Probing: a UDP probe with sizes also sends, with the don't-fragment bit (IP_MTU_DISCOVER =
# IP_PMTUDISC_DO: never fragmented, here or on the path), datagrams of each size in IP bytes,
# its line padded with "."; one the local route cannot carry (EMSGSIZE) is skipped. And one of
# the largest size without it (IP_PMTUDISC_DONT, padded with ","), as the overlay's own packets
# go: fragmented here or by a router on the way; the listener reports apart the largest of
# those that arrived ("whole"), reassembled, so a path that drops fragments shows.
REACH = r"""
import json, os, selectors, socket, sys, threading, time
cfg = json.loads(sys.stdin.buffer.read(16 << 20))
begun = time.monotonic()
deadline = begun + float(cfg["seconds"])
window_end = begun + float(cfg["window"])
timeout = float(cfg["timeout"])
watchdog = threading.Timer(float(cfg["seconds"]) + 5, os._exit, (3,))
watchdog.daemon = True
watchdog.start()
BATCH, LINE, DATAGRAM, CAP, ACKS = 256, 512, 65536, 1024, 32
expect = {(p, int(n), line.encode()): (sender, line.split()[-1]) for p, n, sender, line, mtu in cfg["expect"]}
need = {(p, int(n), sender): int(mtu) for p, n, sender, line, mtu in cfg["expect"]}
pending = set(need)
out = []
socks = {}
for proto, port, address in cfg["listen"]:
    port = int(port)
    try:
        s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET,
                          socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        if proto == "tcp":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT is no listener
        s.bind((address, port))
        if proto == "tcp":
            s.listen(4096)  # every node may connect at once: a full backlog drops SYNs (a false "timed out")
        s.setblocking(False)
        socks[s] = (proto, port)
        out.append("bound %s %d" % (proto, port))
    except OSError as e:
        out.append("busy %s %d %s" % (proto, port, (e.strerror or "error").replace(" ", "_")))
pending = {k for k in pending if (k[0], k[1]) in socks.values()}  # a port it could not bind hears nothing
got, biggest, whole, acks, conns = {}, {}, {}, {}, {}
watch = selectors.DefaultSelector()
for s in socks:
    watch.register(s, selectors.EVENT_READ)
def note(data, proto, port, size=0, sock=None, peer=None):
    # The first line is the probe's; a full-size datagram pads it (its IP size: `size`).
    line = data.split(b"\n", 1)[0].strip()
    hit = expect.get((proto, port, line))
    if not hit:
        return
    key = (proto, port, hit[0])
    got[key] = hit[1]
    if size and data.endswith(b","):  # sent without don't-fragment: it says nothing of the path's MTU
        whole[key] = max(size, whole.get(key, 0))
        return
    biggest[key] = max(size, biggest.get(key, 0))
    if proto == "tcp" or biggest[key] >= need[key]:
        pending.discard(key)
    if sock is not None and acks.get(key, 0) < ACKS:
        acks[key] = acks.get(key, 0) + 1
        try:
            sock.sendto(b"ack " + line + b" %d" % biggest[key], peer)
        except OSError:
            pass
def drain(s):
    proto, port = socks[s]
    for _ in range(BATCH):
        try:
            if proto == "udp":
                data, peer = s.recvfrom(DATAGRAM)
                note(data, proto, port, len(data) + (48 if s.family == socket.AF_INET6 else 28), s, peer)
                continue
            conn, _ = s.accept()
        except OSError:
            return
        if len(conns) >= CAP:
            conn.close()
            continue
        conn.setblocking(False)  # its line is read when it arrives: no wait per connection
        conns[conn] = [proto, port, b"", min(deadline, time.monotonic() + 5)]
        watch.register(conn, selectors.EVENT_READ)
def hear(conn, last=False):
    # Read what is there; once the line is complete (or its time is up) it is noted.
    proto, port, data, until = entry = conns[conn]
    try:
        chunk = conn.recv(LINE - len(data))
    except BlockingIOError:
        chunk = None
    except OSError:
        chunk = b""
    data = entry[2] = data + (chunk or b"")
    if not (last or chunk == b"" or b"\n" in data or len(data) >= LINE):
        return
    del conns[conn]
    watch.unregister(conn)
    note(data, proto, port)
    conn.close()
results = {}
def tcp_probe(address, port, line, sizes):
    key = "tcp %s %s" % (address, port)
    hello = (line + "\n").encode() if line else None
    for attempt in range(1000):
        left = window_end - time.monotonic()
        try:
            with socket.create_connection((address, int(port)), min(timeout, max(0.5, left)) if hello else timeout) as s:
                if hello:
                    s.sendall(hello)
                    time.sleep(0.1)
            results[key] = "ok"
            return
        except socket.timeout:
            results[key] = "timeout"
        except ConnectionRefusedError:
            results[key] = "refused"
        except OSError as e:
            results[key] = (e.strerror or "error").replace(" ", "_")
        if hello is None:  # a running k3s answers or not; a lost SYN and its retransmit get one more try
            if results[key] != "timeout" or attempt:
                return
        elif time.monotonic() + 0.2 >= window_end:
            return
        else:
            time.sleep(0.2)  # the listener there may not be up yet
def acked(s, prefix, want):
    until = time.monotonic() + 0.2
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return False
        s.settimeout(left)
        try:
            data = s.recv(1024)
        except socket.timeout:
            return False
        except OSError:
            time.sleep(max(0, until - time.monotonic()))
            return False
        size = data[len(prefix):].strip()
        if data.startswith(prefix) and size.isdigit() and len(size) < 7 and int(size) >= want:
            return True
def udp_probe(address, port, line, sizes):
    key = "udp %s %s" % (address, port)
    v6 = ":" in address
    hello = (line + "\n").encode() if line else b"\n"
    want = max([int(x) for x in sizes] or [0])
    prefix = b"ack " + hello.strip() + b" "
    level, option = ((socket.IPPROTO_IPV6, getattr(socket, "IPV6_MTU_DISCOVER", 23)) if v6
                     else (socket.IPPROTO_IP, getattr(socket, "IP_MTU_DISCOVER", 10)))
    try:
        with socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            if sizes:
                s.setsockopt(level, option, 2)  # IP(V6)_PMTUDISC_DO
            for attempt in range(10000):
                s.sendto(hello, (address, int(port)))
                if sizes:  # first: the listener may end once the full size with don't-fragment is in
                    try:
                        s.setsockopt(level, option, 0)  # IP(V6)_PMTUDISC_DONT: fragments, as the overlay's
                        s.sendto(hello.ljust(want - (48 if v6 else 28), b","), (address, int(port)))
                    except OSError:
                        pass
                    finally:
                        s.setsockopt(level, option, 2)
                for size in sizes:
                    try:
                        s.sendto(hello.ljust(int(size) - (48 if v6 else 28), b"."), (address, int(port)))
                    except OSError:
                        pass  # larger than this host's route allows: the receiver never gets it
                if acked(s, prefix, want) if line else attempt >= 2:
                    break
                if time.monotonic() >= window_end:
                    break
        results[key] = "sent"
    except OSError as e:
        results[key] = (e.strerror or "error").replace(" ", "_")
threads = [threading.Thread(target=udp_probe if p[0] == "udp" else tcp_probe, args=tuple(p[1:]), daemon=True)
           for p in cfg["probes"]]
for t in threads:
    t.start()
while True:
    now = time.monotonic()
    if now >= deadline or not (pending or any(t.is_alive() for t in threads)):
        break
    for key, _ in watch.select(min(deadline - now, 0.2)):
        if key.fileobj in socks:
            drain(key.fileobj)
        elif key.fileobj in conns:
            hear(key.fileobj)
        if time.monotonic() >= deadline:
            break
    now = time.monotonic()
    for c in [c for c, e in conns.items() if e[3] < now]:
        hear(c, last=True)
for _ in range(4):  # what arrived before the end is in the answer, flood or not
    for s in socks:
        drain(s)
for c in list(conns):
    hear(c, last=True)
for s in socks:
    s.close()  # the ports are free before the answer leaves: k3s may take them next
for t in threads:
    t.join(max(0, deadline - time.monotonic()))
out += ["sent %s %s" % (k, v) for k, v in sorted(results.items())]
out += ["got %s %s %s %s" % (p, n, s, m) for (p, n, s), m in sorted(got.items())]
out += ["size %s %s %s %s %d" % (p, n, s, got[(p, n, s)], b) for (p, n, s), b in sorted(biggest.items()) if p == "udp"]
out += ["whole %s %s %s %s %d" % (p, n, s, got[(p, n, s)], b) for (p, n, s), b in sorted(whole.items()) if p == "udp"]
try:  # where this kernel puts port-0 binds, as NCCL's sockets make them
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        out.append("ephemeral %d %d" % tuple(int(x) for x in f.read(64).split()[:2]))
except (OSError, ValueError, TypeError):
    pass
sys.stdout.write("\n".join(out + ["end"]) + "\n")
sys.stdout.flush()
os._exit(0)
"""


def _python(script: str) -> str:
    """The command line: the script only, never a secret."""
    return "python3 -c " + shlex.quote(script)


def _stdin(config: dict) -> str:
    return json.dumps(config, separators=(",", ":")) + "\n"


@dataclass(frozen=True)
class Command:
    """A host's command line and the secret-bearing stdin that goes with it."""
    line: str
    stdin: str = field(repr=False)  # secrets: never in a repr, a log or a traceback's locals


def reach_command(proof: rr.Proof, node: str, listen: list[tuple[str, int, str]],
                  expect: list[tuple[str, int, str, str, int]], hellos: dict[rr.Probe, str | None],
                  seconds: float | None = None, window: float | None = None) -> Command:
    """A host's one command. `listen`: (proto, port, address to bind); `expect`: (proto, port,
    sender, mac, mtu) of each probe it may hear; `hellos`: its own probes and their lines."""
    return Command(_python(REACH), _stdin({
        "seconds": LISTEN_SECONDS if seconds is None else seconds,
        "window": WINDOW_SECONDS if window is None else window, "timeout": CONNECT_SECONDS,
        "listen": [list(x) for x in listen],
        "expect": [[proto, port, sender, rr.hello(proof.run_id, sender, mac), mtu]
                   for proto, port, sender, mac, mtu in expect],
        "probes": [[p.proto, p.address, p.port, line, rr.sizes(p.mtu) if line else []] for p, line in hellos.items()]}))


# --- what hosts print back: hostile until checked -------------------------------------------------

_PROTOS = ("tcp", "udp")
_WORD = re.compile(r"[A-Za-z0-9_.-]{1,60}")
_NODE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _lines(text) -> list[list[str]] | None:
    """The answer's lines as words; None when it is no text or too big to be an answer."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER:
        return None
    return [line.split() for line in text.splitlines()]


def _port(word: str) -> int | None:
    return int(word) if word.isascii() and word.isdigit() and len(word) <= 5 and 0 < int(word) < 65536 else None


def _reason(words: list[str]) -> str:
    """A host's reason word ("Address_already_in_use"), only if it is a plain word."""
    text = " ".join(words)
    return text.replace("_", " ") if _WORD.fullmatch(text) else "(unreadable reason)"


def parse_bound(text) -> dict[tuple, str] | None:
    """The listener's "bound tcp 6443" / "busy udp 8472 Address_already_in_use" lines."""
    lines = _lines(text)
    if lines is None:
        return None
    out = {}
    for w in lines:
        if len(w) >= 3 and w[0] in ("bound", "busy") and w[1] in _PROTOS and _port(w[2]):
            out[(w[1], _port(w[2]))] = "ok" if w[0] == "bound" else _reason(w[3:])
    return out


def _address(word: str) -> str | None:
    try:
        return str(ipaddress.ip_address(word))
    except ValueError:
        return None


def parse_sent(text) -> dict[tuple, str] | None:
    """The prober's "sent tcp 10.0.0.5 6443 ok" lines: {(address, proto, port): word}."""
    lines = _lines(text)
    if lines is None:
        return None
    out = {}
    for w in lines:
        if len(w) == 5 and w[0] == "sent" and w[1] in _PROTOS and _address(w[2]) and _port(w[3]):
            out[(_address(w[2]), w[1], _port(w[3]))] = _reason(w[4:])
    return out


def parse_received(text) -> set[tuple] | None:
    """The listener's answer, "got udp 8472 cp-1 <mac>" lines and "end": {(sender, proto,
    port, mac)}; cut short: no answer. The MACs are checked by rr.verified, not here."""
    lines = _lines(text)
    if lines is None or not lines or lines[-1] != ["end"]:
        return None
    return {(w[3], w[1], _port(w[2]), w[4]) for w in lines
            if len(w) == 5 and w[0] == "got" and w[1] in _PROTOS and _port(w[2]) and _NODE.fullmatch(w[3])
            and rr.MAC_RE.fullmatch(w[4])}


def parse_sizes(text, word: str = "size") -> dict[tuple, int] | None:
    """The listener's "size udp 8472 cp <mac> 1500" lines (the largest datagram of each probe
    with don't-fragment, IP bytes; `word` "whole": without it, reassembled): {(sender, proto,
    port, mac): bytes}; cut short: no answer."""
    lines = _lines(text)
    if lines is None or not lines or lines[-1] != ["end"]:
        return None
    return {(w[3], w[1], _port(w[2]), w[4]): int(w[5]) for w in lines
            if len(w) == 6 and w[0] == word and w[1] == "udp" and _port(w[2]) and _NODE.fullmatch(w[3])
            and rr.MAC_RE.fullmatch(w[4]) and w[5].isascii() and w[5].isdigit() and len(w[5]) <= 5}


def parse_ephemeral(text) -> tuple[int, int] | None:
    """The host's "ephemeral 32768 60999" line (its net.ipv4.ip_local_port_range), or None."""
    for w in _lines(text) or ():
        if len(w) == 3 and w[0] == "ephemeral" and _port(w[1]) and _port(w[2]) and _port(w[1]) <= _port(w[2]):
            return _port(w[1]), _port(w[2])
    return None


@dataclass
class Report:
    findings: list
    lines: list[str]  # for people: a summary, and the matrix when something failed
    round_trips: int = 0


def check(session, inventory: Inventory, facts: dict[str, HostFacts], embedded_mirror: bool,
          gpu_nodes=()) -> Report:
    """Probe every pair that needs it; `session.run_each({node: command}, what, stdin={node:
    text}, timeout=seconds)` runs one command per host in parallel and gives {node: stdout or
    None}. `gpu_nodes`: the run's GPU nodes' names (validate.nccl's ports are probed between them)."""
    plan = rr.plan_probes(inventory, facts, embedded_mirror, gpu_nodes)
    if not plan.probes:
        return Report(rr.findings(inventory, plan, []), [])
    proof = rr.Proof(secrets.token_hex(8), secrets.token_bytes(32))
    listeners = plan.listeners()
    expected = rr.expected_by_receiver(plan, proof)
    hellos = rr.hellos_by_sender(plan, proof)
    answers = _run(session, {n: reach_command(proof, n, listeners.get(n, []), expected.get(n, []), hellos.get(n, {}))
                             for n in sorted(set(listeners) | set(hellos))}, "reachability")
    # One command, one answer: a host whose answer did not end is a host that did not report.
    ended = {n: t for n, t in answers.items() if parse_received(t) is not None}
    bound = {n: parse_bound(t) for n, t in ended.items() if n in listeners}
    sent = {n: parse_sent(t) for n, t in ended.items() if n in hellos}
    received = {n: rr.verified(plan, proof, n, parse_received(t)) for n, t in ended.items() if n in listeners}
    largest = {n: rr.verified_sizes(plan, proof, n, parse_sizes(t)) for n, t in ended.items() if n in listeners}
    whole = {n: rr.verified_sizes(plan, proof, n, parse_sizes(t, "whole")) for n, t in ended.items() if n in listeners}
    results = rr.outcomes(plan, sent, received, bound, largest, whole)
    findings = rr.findings(inventory, plan, results)
    findings += rr.ephemeral_findings(plan, {n: parse_ephemeral(t) for n, t in ended.items()})
    names = [n.name for n in inventory.nodes if n.name in facts]
    bad = [r for r in results if r.ok is not True or r.mtu_lost]
    counts = [(sum(r.ok is True for r in results), "got through"), (sum(r.ok is False for r in results), "failed"),
              (sum(r.ok is None for r in results), "not tested")]
    where = "their public addresses (network.mode public)" if plan.public else "the cluster's addresses"
    lines = [f"reachability: {len(results)} probes between {len(names)} nodes on {where}: "
             + ", ".join(f"{n} {words}" for n, words in counts if n)]
    lines += rr.mtu_lines(results)
    if any(r.ok is False or r.mtu_lost for r in results):
        involved = [n for n in names if any(n in (r.probe.sender, r.probe.receiver) for r in bad)]
        lines += ["  what did not get through (from the row's node to the column's):",
                  *rr.render_matrix(involved, results, plan.label)]
    return Report(findings, lines, 1)


def _run(session, commands: dict[str, Command], what: str) -> dict[str, str | None]:
    """One round trip: each host's command line, its secrets on its stdin."""
    return session.run_each({n: c.line for n, c in commands.items()}, what,
                            stdin={n: c.stdin for n, c in commands.items()}, timeout=COMMAND_SECONDS)
