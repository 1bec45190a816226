"""Probe, between every pair of hosts, the ports k3s needs (bootstrap.rules.reachability says
which), before any host changes. Three parallel steps, one SSH command per host each:

1. every receiving host starts a listener (python3) on the ports its node will need, which
   prints what it bound and goes to the background (it exits after LISTEN_SECONDS at most);
2. every sending host connects (TCP) or sends datagrams (UDP) to the others' cluster
   addresses, all at once, and prints what each TCP connect did;
3. every listener is asked what arrived (through an abstract unix socket: no file) and ends.

Nothing is installed or written on the hosts. The listeners run as the login user: every
port involved is above 1024.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass

from bootstrap.facts.host_facts import HostFacts
from bootstrap.inventory.model import Inventory
from bootstrap.rules import reachability as rr

LISTEN_SECONDS = 120  # the most a listener lives when step 3 never comes (the tool died)
CONNECT_SECONDS = 3

# argv: token seconds family proto/port...
LISTENER = r"""
import os, selectors, socket, sys, time
token, seconds, family = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
fam = socket.AF_INET6 if family == 6 else socket.AF_INET
socks = {}
for spec in sys.argv[4:]:
    proto, port = spec.split("/")
    try:
        s = socket.socket(fam, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", int(port)))
        if proto == "tcp":
            s.listen(4096)  # every node may connect at once: a full backlog drops SYNs (a false "timed out")
        s.setblocking(False)
        socks[s] = (proto, port)
        print("bound", proto, port)
    except OSError as e:
        print("busy", proto, port, e.strerror.replace(" ", "_"))
control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
control.bind("\0bootstrap-reach-" + token)
control.listen(4)
sys.stdout.flush()
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
got, deadline = set(), time.monotonic() + seconds
watch = selectors.DefaultSelector()
for s in list(socks) + [control]:
    watch.register(s, selectors.EVENT_READ)
conns = {}
def note(data, proto, port):
    words = data.decode("ascii", "replace").split()
    if len(words) == 3 and words[0] == "bootstrap-reach" and words[1] == token:
        got.add("%s %s %s" % (proto, port, words[2]))
def drain(s):
    proto, port = socks[s]
    while True:
        try:
            if proto == "udp":
                note(s.recv(512), proto, port)
                continue
            conn, _ = s.accept()
        except OSError:
            return
        conn.setblocking(False)  # its hello is read when it arrives: no wait per connection
        conns[conn] = (proto, port, time.monotonic() + 5)
        watch.register(conn, selectors.EVENT_READ)
def hear(conn):
    proto, port, _ = conns.pop(conn)
    watch.unregister(conn)
    try:
        note(conn.recv(512), proto, port)
    except OSError:
        pass
    conn.close()
while time.monotonic() < deadline:
    ready = [key.fileobj for key, _ in watch.select(1)]
    for s in ready:
        if s in socks:
            drain(s)
        elif s in conns:
            hear(s)
    now = time.monotonic()
    for conn in [c for c, (_, _, until) in conns.items() if until < now]:
        hear(conn)
    if control in ready:
        for s in socks:
            drain(s)  # what arrived before the question is in the answer
            watch.unregister(s)
            s.close()  # and the ports are free before the answer leaves: k3s may take them next
        for conn in list(conns):
            hear(conn)
        conn, _ = control.accept()
        conn.sendall(("".join("got %s\n" % g for g in sorted(got)) + "end\n").encode())
        conn.close()
        break
"""

# argv: token me family target... (target: proto,address,port,hello)
PROBER = r"""
import socket, sys, threading, time
token, me, family = sys.argv[1], sys.argv[2], int(sys.argv[3])
fam = socket.AF_INET6 if family == 6 else socket.AF_INET
hello = ("bootstrap-reach %s %s\n" % (token, me)).encode()
results = {}
def probe(proto, address, port, say):
    key = "%s %s %s" % (proto, address, port)
    if proto == "udp":
        try:
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                for _ in range(3):
                    s.sendto(hello, (address, int(port)))
                    time.sleep(0.2)
            results[key] = "sent"
        except OSError as e:
            results[key] = (e.strerror or "error").replace(" ", "_")
        return
    for attempt in range(2):  # a lost SYN and its retransmit in a burst are not a firewall
        try:
            with socket.create_connection((address, int(port)), @@TIMEOUT@@) as s:
                if say == "hello":
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
threads = [threading.Thread(target=probe, args=t.split(",")) for t in sys.argv[4:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
for key, value in sorted(results.items()):
    print("sent", key, value)
"""

COLLECT = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect("\0bootstrap-reach-" + sys.argv[1])
data = b""
while not data.endswith(b"end\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"""


def _python(script: str, *args: str) -> str:
    return "python3 -c " + shlex.quote(script.replace("@@TIMEOUT@@", str(CONNECT_SECONDS))) + "".join(
        " " + shlex.quote(a) for a in args)


def listener_command(token: str, family: int, ports: list[tuple[str, int]]) -> str:
    return _python(LISTENER, token, str(LISTEN_SECONDS), str(family), *(f"{p}/{n}" for p, n in ports))


def prober_command(token: str, me: str, family: int, probes: list[rr.Probe]) -> str:
    return _python(PROBER, token, me, str(family),
                   *(f"{p.proto},{p.address},{p.port},{'hello' if p.listen else 'quiet'}" for p in probes))


def collect_command(token: str) -> str:
    return _python(COLLECT, token)


def _records(text: str, kinds: tuple[str, ...], size: int) -> list[list[str]]:
    """The lines of a script's output that start with one of `kinds`, as words."""
    return [w for w in (line.split() for line in text.splitlines()) if len(w) >= size and w[0] in kinds]


def parse_bound(text: str | None) -> dict[tuple, str] | None:
    """The listener's "bound tcp 6443" / "busy udp 8472 Address_already_in_use" lines."""
    if text is None:
        return None
    return {(w[1], int(w[2])): "ok" if w[0] == "bound" else " ".join(w[3:]).replace("_", " ")
            for w in _records(text, ("bound", "busy"), 3)}


def parse_sent(text: str | None) -> dict[tuple, str] | None:
    """The prober's "sent tcp 10.0.0.5 6443 ok" lines: {(address, proto, port): word}."""
    if text is None:
        return None
    return {(w[2], w[1], int(w[3])): w[4].replace("_", " ") for w in _records(text, ("sent",), 5)}


def parse_received(text: str | None) -> set[tuple] | None:
    """The listener's answer, "got udp 8472 cp-1" lines and "end"; cut short: no answer."""
    if text is None or not text.rstrip().endswith("end"):
        return None
    return {(w[3], w[1], int(w[2])) for w in _records(text, ("got",), 4)}


@dataclass
class Report:
    findings: list
    lines: list[str]  # for people: a summary, and the matrix when something failed
    round_trips: int = 0


def check_reachability(session, inventory: Inventory, facts: dict[str, HostFacts], console) -> list:
    """Preflight's reachability findings; the summary (and the matrix) go to `console`."""
    from bootstrap.hostparts.registries import embedded_mirror_on
    from bootstrap.preflight import gpu_nodes

    report = check(session, inventory, facts, embedded_mirror_on(inventory, bool(gpu_nodes(inventory, facts))))
    for line in report.lines:
        console.say(line)
    return report.findings


def check(session, inventory: Inventory, facts: dict[str, HostFacts], embedded_mirror: bool) -> Report:
    """Probe every pair that needs it; `session.run_each({node: command})` runs one command
    per host in parallel and gives {node: stdout or None}."""
    plan = rr.plan_probes(inventory, facts, embedded_mirror)
    if not plan.probes:
        return Report(rr.findings(inventory, plan, []), [])
    token = secrets.token_hex(8)
    listeners = plan.listeners()
    trips = 0
    bound: dict = {}
    if listeners:
        started = session.run_each({n: listener_command(token, plan.family, ports) for n, ports in listeners.items()},
                                   "reachability listener")
        trips += 1
        bound = {n: b for n, b in ((n, parse_bound(t)) for n, t in started.items()) if b is not None}
    try:
        said = session.run_each({n: prober_command(token, n, plan.family, ps) for n, ps in plan.targets().items()},
                                "reachability probes")
        trips += 1
    finally:
        received: dict = {}
        if bound:
            heard = session.run_each({n: collect_command(token) for n in bound}, "reachability answers")
            trips += 1
            received = {n: r for n, r in ((n, parse_received(t)) for n, t in heard.items()) if r is not None}
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
