#!/usr/bin/env python3
"""Benchmarks: remote commands per host and wall time of `bootstrap up` on the test hosts.

    python benchmarks/run.py [--agents 3 10 20] [--rtt 0 100] [--json out.json] [--budget 25]

Every remote command is counted by a logging login shell on the test hosts (each SSH
exec, SFTP session included, starts it once). Needs root and the test-host tools (see
tests/testhosts.py). Exits 1 when a no-op `up` runs more than --budget commands on a host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import testhosts  # noqa: E402
from delayproxy import DelayProxy  # noqa: E402
from labinv import write_inventory  # noqa: E402
from standins.airgap import build_airgap  # noqa: E402

COUNTING_SHELL = """#!/bin/sh
# Benchmark login shell: one line per remote command, then the real shell.
echo x >> /var/log/bench-commands.log 2>/dev/null
exec /bin/sh "$@"
"""
BOOTSTRAP = Path(sys.executable).parent / "bootstrap"


def count(host) -> int:
    out = host.ssh("wc -l < /var/log/bench-commands.log 2>/dev/null || echo 0", user="root").stdout.strip()
    return int(out or 0)


def reset_counts(hosts) -> None:
    for host in hosts:
        host.ssh(": > /var/log/bench-commands.log", user="root")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, which also runs every test host."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


LAST_CPU: dict = {}


def bootstrap(*args, env=None) -> tuple[int, float, str]:
    """Run the tool; LAST_CPU then says how busy the machine was and what the tool itself used
    (a wall time that grows with N while the CPUs are saturated is the lab's limit, not the tool's)."""
    import resource

    started, launched = time.monotonic(), time.time()
    before, usage = machine_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([str(BOOTSTRAP), *map(str, args)], capture_output=True, text=True,
                            env={**os.environ, **(env or {})},  # the real Helm, lab chart archives (labinv)
                            timeout=1800)
    after, usage_after = machine_cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = (after[0] - before[0]) / max(1, after[1] - before[1])
    tool = usage_after.ru_utime + usage_after.ru_stime - usage.ru_utime - usage.ru_stime
    wall = time.monotonic() - started
    LAST_CPU.update(
        machine_busy=round(busy, 2), tool_cpu_s=round(tool, 2),
        # what the rest of the machine used meanwhile: the test hosts (sshd, the probes, the
        # k3s stand-ins), which on real machines each run on their own CPUs
        lab_cpu_s=round(max(0.0, busy * (os.cpu_count() or 1) * wall - tool), 1))
    LAST_PHASES.clear()
    LAST_TRACE.clear()
    if "--json" in args:
        LAST_PHASES.update(phases(result.stdout, launched))
        LAST_TRACE.extend(command_trace(result.stdout, launched, ["bm-cp", "bm-a1"]))
    return result.returncode, time.monotonic() - started, result.stdout + result.stderr


LAST_PHASES: dict = {}
LAST_TRACE: list = []


# (the second probe runs while the cluster side waits for the nodes: inside "cluster side")
HOST_SIDE = ("launch", "connect", "probe", "preflight and plan", "steps")
CLUSTER_SIDE = ("cluster side", "snapshot")


def phases(json_lines: str, launched: float) -> dict[str, float]:
    """Where a run's wall time went, from its --json events (each carries its wall time):
    the `phase` events the tool emits (connect, probe, preflight and plan with its
    reachability probes, the kubeconfig, the second probe, the cluster side with its tunnel,
    nodes Ready and each Helm release, the snapshot), and each step from its first host's
    start to its last host's end (steps are barriers: that is the critical path); "steps"
    spans them all. "launch" is the tool's start until it connects; "other" what no phase
    covers. Phases inside another one (reachability, cluster: ..., kubeconfig while the
    agents join) are listed too but not added twice into host side / cluster side."""
    events = []
    for line in json_lines.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    if not events:
        return {}
    end = events[-1]["time"]
    out: dict[str, float] = {}
    first_start = end
    for e in events:
        if e.get("event") == "phase":
            out[e["name"]] = out.get(e["name"], 0.0) + e["seconds"]
            first_start = min(first_start, e["start"])
    steps: dict[str, list[float]] = {}
    for name, time_ in step_runs(events):
        steps.setdefault(name, []).append(time_)
    for name, times in steps.items():
        out[f"step: {name}"] = max(times) - min(times)
    if steps:
        out["steps"] = max(max(t) for t in steps.values()) - min(min(t) for t in steps.values())
    out["launch"] = first_start - launched
    out["host side"] = sum(out.get(k, 0.0) for k in HOST_SIDE)
    out["cluster side total"] = sum(out.get(k, 0.0) for k in CLUSTER_SIDE)
    out["other"] = (end - launched) - out["host side"] - out["cluster side total"]
    return {k: round(v, 3) for k, v in out.items()}


def step_runs(events: list[dict]):
    """(name, time) of each step event; a step name that runs again later in the same `up` (a
    new cluster's "prepare host" before and after its first server starts, in older versions)
    is named "NAME (2)": one span from its first start to its last end would hold every step
    between them."""
    seen: dict[str, int] = {}
    current = None
    for e in events:
        if e.get("event") not in ("step_start", "step_end") or not e.get("step"):
            continue
        if e["step"] != current:
            current = e["step"]
            seen[current] = seen.get(current, 0) + 1
        yield (current if seen[current] == 1 else f"{current} ({seen[current]})"), e["time"]


def command_trace(json_lines: str, launched: float, hosts: list[str]) -> list[list]:
    """[host, what, start (s after launch), seconds] of every remote command `hosts` ran."""
    trace = []
    for line in json_lines.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "command" and e.get("host") in hosts:
            trace.append([e["host"], e["what"], round(e["start"] - launched, 3), e["seconds"]])
    return sorted(trace, key=lambda t: t[2])


def round_trips(direct: dict, slow: dict, rtt_ms: int) -> dict[str, float]:
    """Round trips on the critical path per phase: the time the added latency added."""
    return {k: round((slow[k] - direct.get(k, 0.0)) / (rtt_ms / 1000.0), 1) for k in slow}


def wait_not_ready(inventory: Path, name: str, timeout: float = 120) -> None:
    from bootstrap.cluster.client import connect, get
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connect(inv, StateDir(inv)) as api:
            node = get(api, f"/api/v1/nodes/{name}") or {}
        if not any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in node.get("status", {}).get("conditions", [])):
            return
        time.sleep(3)
    raise RuntimeError(f"{name} never went NotReady")


NEIGH = Path("/proc/sys/net/ipv4/neigh/default")


@contextlib.contextmanager
def room_for_neighbours(hosts: int):
    """Every test host shares this machine's kernel, and its ARP table is one for all
    network namespaces (gc_thresh3, 1024 by default): 51 hosts that each talk to the 50
    others need ~2600 entries, and past the limit the kernel drops packets ("neighbour:
    arp_cache: neighbor table overflow!"), which the reachability probes rightly report as a
    firewall. Separate machines each have their own table. Raised for the run, then put back."""
    names = ("gc_thresh1", "gc_thresh2", "gc_thresh3")
    old = {n: (NEIGH / n).read_text().strip() for n in names}
    need = hosts * hosts * 2
    if need <= int(old["gc_thresh3"]):
        yield
        return
    try:
        for name, value in zip(names, (need // 4, need // 2, need)):
            (NEIGH / name).write_text(str(max(value, int(old[name]))))
        yield
    finally:
        for name in reversed(names):
            (NEIGH / name).write_text(old[name])


def scenario(agents: int, rtt_ms: int, workdir: Path, airgap: Path, rebuild: bool = False) -> dict:
    with room_for_neighbours(agents + 2):
        return _scenario(agents, rtt_ms, workdir, airgap, rebuild)


def _scenario(agents: int, rtt_ms: int, workdir: Path, airgap: Path, rebuild: bool = False) -> dict:
    lab = testhosts.Lab()
    proxies = []
    try:
        names = ["bm-cp"] + [f"bm-a{i}" for i in range(1, agents + 1)]
        hosts = lab.start(names, extra_files={"/usr/local/bin/bench-sh": (COUNTING_SHELL, 0o755)}, timeout=180)
        for host in hosts:
            host.ssh("touch /var/log/bench-commands.log && chmod 666 /var/log/bench-commands.log && "
                     "usermod -s /usr/local/bin/bench-sh ubuntu", user="root")
        node_extra = {}
        if rtt_ms:
            for host in hosts:
                proxy = DelayProxy(host.address, 22, rtt_ms)
                proxies.append(proxy)
                node_extra[host.name] = {"address": proxy.bind, "node_ip": host.address, "ssh": {"port": proxy.port}}
        scenario_dir = workdir / f"n{agents}-rtt{rtt_ms}"  # its own state folder (pinned keys)
        scenario_dir.mkdir()
        inventory = write_inventory(scenario_dir / "inv.yaml", hosts, cluster=f"bm{agents}x{rtt_ms}",
                                    extra={"k3s": {"airgap": str(airgap)}}, node_extra=node_extra)
        results = {"agents": agents, "rtt_ms": rtt_ms}
        for label in ("fresh_up", "noop_up"):
            reset_counts(hosts)
            rc, seconds, output = bootstrap("up", inventory, "--no-validate", "--json")
            if rc != 0:
                raise RuntimeError(f"{label} failed ({rc}):\n{output[-2000:]}")
            per_host = [count(h) for h in hosts]
            results[label] = {"seconds": round(seconds, 2), "max_commands_per_host": max(per_host),
                              "mean_commands_per_host": round(sum(per_host) / len(per_host), 1), **LAST_CPU,
                              "phases": dict(LAST_PHASES), "trace": list(LAST_TRACE),
                              "tool_cpu_per_host_s": round(LAST_CPU["tool_cpu_s"] / len(hosts), 3)}
        rc, seconds, _ = bootstrap("status", inventory)
        results["status_seconds"] = round(seconds, 2)
        results["status_tool_cpu_s"] = LAST_CPU["tool_cpu_s"]
        if rebuild:
            results["rebuild_one_agent"] = rebuild_one(lab, hosts, inventory, rtt_ms, proxies)
        return results
    finally:
        for proxy in proxies:
            proxy.close()
        lab.cleanup()


def rebuild_one(lab, hosts, inventory: Path, rtt_ms: int, proxies: list) -> dict:
    """Kill the last agent (a spot loss), start a replacement, time `rebuild`."""
    import yaml

    lost = hosts[-1]
    lost.kill()
    wait_not_ready(inventory, lost.name)
    (new,) = lab.start(["bm-new"], extra_files={"/usr/local/bin/bench-sh": (COUNTING_SHELL, 0o755)}, timeout=180)
    new.ssh("touch /var/log/bench-commands.log && chmod 666 /var/log/bench-commands.log && "
            "usermod -s /usr/local/bin/bench-sh ubuntu", user="root")
    entry = {"name": new.name, "address": new.address, "role": "agent"}
    if rtt_ms:
        proxy = DelayProxy(new.address, 22, rtt_ms)
        proxies.append(proxy)
        entry.update(address=proxy.bind, node_ip=new.address, ssh={"port": proxy.port})
    data = yaml.safe_load(inventory.read_text())
    data["nodes"] = [n for n in data["nodes"] if n["name"] != lost.name] + [entry]
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    healthy = [h for h in hosts if h is not lost]
    reset_counts(healthy)
    rc, seconds, output = bootstrap("rebuild", inventory, "--no-validate", "--json")
    if rc != 0:
        raise RuntimeError(f"rebuild failed ({rc}):\n{output[-2000:]}")
    return {"seconds": round(seconds, 2), "max_commands_per_healthy_host": max(count(h) for h in healthy),
            "phases": dict(LAST_PHASES)}


def median_run(runs: list[dict]) -> dict:
    """One row from repeated runs of a scenario: each run's seconds and each phase the median
    (this lab is a shared 2-core machine: single runs move by a few round trips); the rest as
    the run with the median fresh `up` had it. `repeats`: every run's fresh and no-op seconds."""
    if len(runs) == 1:
        return runs[0]
    ordered = sorted(runs, key=lambda r: r["fresh_up"]["seconds"])
    row = json.loads(json.dumps(ordered[len(ordered) // 2]))
    for label in ("fresh_up", "noop_up", "rebuild_one_agent"):
        if label not in row:
            continue
        row[label]["seconds"] = round(statistics.median(r[label]["seconds"] for r in runs), 2)
        keys = set().union(*(r[label].get("phases", {}) for r in runs))
        row[label]["phases"] = {k: round(statistics.median(r[label]["phases"].get(k, 0.0) for r in runs), 3)
                                for k in sorted(keys)}
    row["repeats"] = {label: [r[label]["seconds"] for r in runs] for label in ("fresh_up", "noop_up")}
    return row


def help_time() -> float:
    best = 9.0
    for _ in range(5):
        started = time.monotonic()
        subprocess.run([str(BOOTSTRAP), "--help"], capture_output=True, check=True)
        best = min(best, time.monotonic() - started)
    return round(best, 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[3])
    parser.add_argument("--rtt", type=int, nargs="+", default=[0], help="added round-trip ms (0 = direct)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--budget", type=int, default=25, help="max remote commands per host for a no-op up")
    parser.add_argument("--rebuild", action="store_true", help="also time `rebuild` of one lost agent")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each scenario this many times; times and phases are the medians")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bootstrap-bench-") as tmp:
        workdir = Path(tmp)
        airgap = build_airgap(workdir / "airgap")
        rows = []
        for rtt in args.rtt:
            for n in args.agents:
                runs = []
                for index in range(args.repeat):
                    run_dir = workdir / f"run{index}"
                    run_dir.mkdir(exist_ok=True)
                    runs.append(scenario(n, rtt, run_dir, airgap, args.rebuild))
                rows.append(median_run(runs))
    report = {"machine": f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip(),
              "date": time.strftime("%Y-%m-%d"), "help_seconds": help_time(), "rows": rows}
    print(f"{'agents':>6} {'rtt':>5} {'fresh up s':>10} {'cmds/host':>9} {'CPU busy':>8} {'tool CPU s':>10} "
          f"{'no-op up s':>10} {'cmds/host':>9}")
    for r in rows:
        fresh = r["fresh_up"]
        print(f"{r['agents']:>6} {r['rtt_ms']:>5} {fresh['seconds']:>10} {fresh['max_commands_per_host']:>9} "
              f"{fresh.get('machine_busy', '-'):>8} {fresh.get('tool_cpu_s', '-'):>10} "
              f"{r['noop_up']['seconds']:>10} {r['noop_up']['max_commands_per_host']:>9}")
    for r in rows:
        if "rebuild_one_agent" in r:
            print(f"rebuild of 1 lost agent of {r['agents']} at {r['rtt_ms']} ms: {r['rebuild_one_agent']['seconds']}s, "
                  f"{r['rebuild_one_agent']['max_commands_per_healthy_host']} commands on a healthy host")
    print(f"bootstrap --help: {report['help_seconds']}s")
    # Round trips on the critical path: the same agent count at 0 ms and at an added RTT.
    for slow in (r for r in rows if r["rtt_ms"]):
        direct = next((r for r in rows if r["agents"] == slow["agents"] and not r["rtt_ms"]), None)
        if direct is None:
            continue
        slow["round_trips"] = {}
        for label in ("fresh_up", "noop_up", "rebuild_one_agent"):
            if label in slow and label in direct and slow[label].get("phases"):
                trips = round_trips(direct[label]["phases"], slow[label]["phases"], slow["rtt_ms"])
                total = (slow[label]["seconds"] - direct[label]["seconds"]) / (slow["rtt_ms"] / 1000.0)
                slow["round_trips"][label] = {"total": round(total, 1), **trips}
                print(f"round trips, {label}, {slow['agents']} agents: {slow['round_trips'][label]['total']} "
                      f"({', '.join(f'{k} {v}' for k, v in trips.items())})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    over = [r for r in rows if r["noop_up"]["max_commands_per_host"] > args.budget]
    if over:
        print(f"FAIL: a no-op up ran more than {args.budget} remote commands on a host", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
