"""Probe, between every pair of hosts, the ports k3s needs (bootstrap.rules.reachability says
which), before any host changes. Three parallel steps, one SSH command per host each:

1. every receiving host starts a listener (python3) on the ports its node will need, bound
   to the node's own address under test (never the wildcard), which prints what it bound
   and goes to the background (it exits after LISTEN_SECONDS at most, flood or not);
2. every sending host connects (TCP) or sends datagrams (UDP) to the others' cluster
   addresses, all at once, each carrying its MAC (bootstrap.rules.reachability, "proof of
   origin"), and prints what each TCP connect did;
3. every listener is asked what arrived (through an abstract unix socket: no file; the
   question carries a secret, the socket's name is visible to every local user) and ends.

The scripts are on the command line; everything else, the MACs and secrets above all, is
one line of JSON on the command's stdin: argv and the environment of a process are readable
by every local user (ps, /proc), stdin is not. Nothing is installed or written on the hosts.
The listeners run as the login user: every port involved is above 1024.

What a host prints back is read as hostile: sizes are capped, every field is checked, and a
host whose answer does not parse is a host that did not report (its probes are "not tested").
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import shlex
from dataclasses import dataclass, field

from bootstrap.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory
from bootstrap.rules import reachability as rr

LISTEN_SECONDS = 120  # the most a listener lives when step 3 never comes (the tool died)
CONNECT_SECONDS = 3
COMMAND_SECONDS = 60  # the most the tool waits for one host's command (a host that hangs is "not tested")
MAX_ANSWER = 4 << 20  # characters: more is no honest answer

# stdin: {"seconds", "socket", "control", "listen": [[proto, port, address]...],
#         "expect": [[proto, port, sender, line]...]}
# Every loop is bounded: each wake-up reads at most BATCH datagrams or connections per port
# and one chunk per connection, and the deadline is checked after each, so no flood of
# datagrams or connections keeps a listener past it. Only lines it was told to expect are
# recorded (at most one per sender and port).
LISTENER = r"""
import hmac, json, os, selectors, socket, sys, time
cfg = json.loads(sys.stdin.buffer.read(16 << 20))
deadline = time.monotonic() + float(cfg["seconds"])
BATCH, LINE = 256, 512
CAP = {"probe": 1024, "question": 16}  # open connections of each kind; more are closed at once
expect = {(p, int(n), line.encode()): (sender, line.split()[-1]) for p, n, sender, line in cfg["expect"]}
control_word = cfg["control"].encode()
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
        print("bound", proto, port)
    except OSError as e:
        print("busy", proto, port, (e.strerror or "error").replace(" ", "_"))
control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
control.bind(cfg["socket"])
control.listen(16)
control.setblocking(False)
sys.stdout.flush()
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
got = {}
watch = selectors.DefaultSelector()
for s in list(socks) + [control]:
    watch.register(s, selectors.EVENT_READ)
conns = {}  # a probe's connection, or a question on the control socket: [kind, proto, port, data, until]
count = {"probe": 0, "question": 0}
def note(data, proto, port):
    hit = expect.get((proto, port, data.strip()))
    if hit:
        got[(proto, port, hit[0])] = hit[1]
def drain(s):
    proto, port = socks[s] if s in socks else ("control", 0)
    for _ in range(BATCH):
        try:
            if proto == "udp":
                note(s.recv(LINE), proto, port)
                continue
            conn, _ = s.accept()
        except OSError:
            return
        kind = "question" if s is control else "probe"
        if count[kind] >= CAP[kind]:
            conn.close()
            continue
        count[kind] += 1
        conn.setblocking(False)  # its line is read when it arrives: no wait per connection
        conns[conn] = [kind, proto, port, b"", min(deadline, time.monotonic() + 5)]
        watch.register(conn, selectors.EVENT_READ)
def hear(conn, last=False):
    # Read what is there; once the line is complete (or its time is up) the connection is
    # done: a probe's line is noted, a question with the right secret is returned.
    kind, proto, port, data, until = entry = conns[conn]
    try:
        chunk = conn.recv(LINE - len(data))
    except BlockingIOError:
        chunk = None
    except OSError:
        chunk = b""
    data = entry[3] = data + (chunk or b"")
    if not (last or chunk == b"" or b"\n" in data or len(data) >= LINE):
        return None
    del conns[conn]
    count[kind] -= 1
    watch.unregister(conn)
    if kind == "question" and hmac.compare_digest(data.strip(), control_word):
        return conn
    if kind == "probe":
        note(data, proto, port)
    conn.close()
    return None
def answer(conn):
    for _ in range(16):  # what arrived before the question is in the answer, flood or not
        for s in socks:
            drain(s)
    for s in socks:
        watch.unregister(s)
        s.close()  # the ports are free before the answer leaves: k3s may take them next
    for c in [c for c, e in conns.items() if e[0] == "probe"]:
        hear(c, last=True)
    conn.settimeout(max(0.1, min(5, deadline - time.monotonic())))
    try:
        conn.sendall(("".join("got %s %s %s %s\n" % (p, n, s, m) for (p, n, s), m in sorted(got.items()))
                      + "end\n").encode())
    except OSError:
        pass
    conn.close()
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    asked = None
    for key, _ in watch.select(min(left, 1)):
        s = key.fileobj
        if s in socks or s is control:
            drain(s)
        elif s in conns:
            asked = hear(s) or asked
        if asked or time.monotonic() >= deadline:
            break
    now = time.monotonic()
    for c in [c for c, e in conns.items() if e[4] < now]:
        asked = hear(c, last=True) or asked
    if asked:
        answer(asked)
        break
os._exit(0)
"""

# stdin: {"timeout", "probes": [[proto, address, port, line or null]...]}
PROBER = r"""
import json, socket, sys, threading, time
cfg = json.loads(sys.stdin.buffer.read(16 << 20))
timeout = float(cfg["timeout"])
results = {}
def probe(proto, address, port, line):
    key = "%s %s %s" % (proto, address, port)
    hello = (line + "\n").encode() if line else None
    if proto == "udp":
        try:
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as s:
                for _ in range(3):
                    s.sendto(hello or b"\n", (address, int(port)))
                    time.sleep(0.2)
            results[key] = "sent"
        except OSError as e:
            results[key] = (e.strerror or "error").replace(" ", "_")
        return
    for attempt in range(2):  # a lost SYN and its retransmit in a burst are not a firewall
        try:
            with socket.create_connection((address, int(port)), timeout) as s:
                if hello:
                    s.sendall(hello)
                    time.sleep(0.1)
            results[key] = "ok"
            return
        except socket.timeout:
            results[key] = "timeout"
        except ConnectionRefusedError:
            results[key] = "refused"
            return
        except OSError as e:
            results[key] = (e.strerror or "error").replace(" ", "_")
            return
threads = [threading.Thread(target=probe, args=t) for t in cfg["probes"]]
for t in threads:
    t.start()
for t in threads:
    t.join()
for key, value in sorted(results.items()):
    print("sent", key, value)
"""

# stdin: {"socket", "control"}; the whole answer within 20 s, at most 16 MiB.
COLLECT = r"""
import json, socket, sys, time
cfg = json.loads(sys.stdin.buffer.read(1 << 16))
deadline = time.monotonic() + 20
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(cfg["socket"])
s.sendall((cfg["control"] + "\n").encode())
data = b""
while not data.endswith(b"end\n") and len(data) < 16 << 20:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    s.settimeout(left)
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode("ascii", "replace"))
"""


def _python(script: str) -> str:
    """The command line: the script only, never a secret."""
    return "python3 -c " + shlex.quote(script)


def _stdin(config: dict) -> str:
    return json.dumps(config, separators=(",", ":")) + "\n"


def socket_name(run_id: str, node: str) -> str:
    """A listener's abstract unix socket (not secret: /proc/net/unix lists it)."""
    return f"\0{rr.MAGIC}-{run_id}-{node}"


@dataclass(frozen=True)
class Command:
    """A host's command line and the secret-bearing stdin that goes with it."""
    line: str
    stdin: str = field(repr=False)  # secrets: never in a repr, a log or a traceback's locals


def listener_command(proof: rr.Proof, node: str, listen: list[tuple[str, int, str]],
                     expect: list[tuple[str, int, str, str]], seconds: float | None = None) -> Command:
    """`listen`: (proto, port, address to bind); `expect`: (proto, port, sender, mac)."""
    return Command(_python(LISTENER), _stdin({
        "seconds": LISTEN_SECONDS if seconds is None else seconds, "socket": socket_name(proof.run_id, node),
        "control": rr.control_secret(proof.secret, node), "listen": [list(x) for x in listen],
        "expect": [[proto, port, sender, rr.hello(proof.run_id, sender, mac)] for proto, port, sender, mac in expect]}))


def prober_command(hellos: dict[rr.Probe, str | None]) -> Command:
    return Command(_python(PROBER), _stdin({
        "timeout": CONNECT_SECONDS,
        "probes": [[p.proto, p.address, p.port, line] for p, line in hellos.items()]}))


def collect_command(proof: rr.Proof, node: str) -> Command:
    return Command(_python(COLLECT), _stdin({"socket": socket_name(proof.run_id, node),
                                             "control": rr.control_secret(proof.secret, node)}))


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


@dataclass
class Report:
    findings: list
    lines: list[str]  # for people: a summary, and the matrix when something failed
    round_trips: int = 0


def check(session, inventory: Inventory, facts: dict[str, HostFacts], embedded_mirror: bool) -> Report:
    """Probe every pair that needs it; `session.run_each({node: command}, what, stdin={node:
    text}, timeout=seconds)` runs one command per host in parallel and gives {node: stdout or
    None}."""
    plan = rr.plan_probes(inventory, facts, embedded_mirror)
    if not plan.probes:
        return Report(rr.findings(inventory, plan, []), [])
    proof = rr.Proof(secrets.token_hex(8), secrets.token_bytes(32))
    listeners = plan.listeners()
    expected = rr.expected_by_receiver(plan, proof)
    trips = 0
    bound: dict = {}
    if listeners:
        started = _run(session, {n: listener_command(proof, n, ports, expected.get(n, []))
                                 for n, ports in listeners.items()}, "reachability listener")
        trips += 1
        bound = {n: b for n, b in ((n, parse_bound(t)) for n, t in started.items()) if b is not None}
    try:
        said = _run(session, {n: prober_command(hellos) for n, hellos in rr.hellos_by_sender(plan, proof).items()},
                    "reachability probes")
        trips += 1
    finally:
        received: dict = {}
        if bound:
            heard = _run(session, {n: collect_command(proof, n) for n in bound}, "reachability answers")
            trips += 1
            received = {n: rr.verified(plan, proof, n, r) for n, r in ((n, parse_received(t)) for n, t in heard.items())
                        if r is not None}
    sent = {n: s for n, s in ((n, parse_sent(t)) for n, t in said.items()) if s is not None}
    results = rr.outcomes(plan, sent, received, bound)
    findings = rr.findings(inventory, plan, results)
    names = [n.name for n in inventory.nodes if n.name in facts]
    bad = [r for r in results if r.ok is not True]
    counts = [(sum(r.ok is True for r in results), "got through"), (sum(r.ok is False for r in results), "failed"),
              (sum(r.ok is None for r in results), "not tested")]
    where = "their public addresses (network.mode public)" if plan.public else "the cluster's addresses"
    lines = [f"reachability: {len(results)} probes between {len(names)} nodes on {where}: "
             + ", ".join(f"{n} {words}" for n, words in counts if n)]
    if any(r.ok is False for r in results):
        involved = [n for n in names if any(n in (r.probe.sender, r.probe.receiver) for r in bad)]
        lines += ["  what did not get through (from the row's node to the column's):",
                  *rr.render_matrix(involved, results, plan.label)]
    return Report(findings, lines, trips)


def _run(session, commands: dict[str, Command], what: str) -> dict[str, str | None]:
    """One round trip: each host's command line, its secrets on its stdin."""
    return session.run_each({n: c.line for n, c in commands.items()}, what,
                            stdin={n: c.stdin for n, c in commands.items()}, timeout=COMMAND_SECONDS)
