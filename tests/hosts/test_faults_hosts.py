"""Faults, not only attackers: `up` interrupted at each step boundary and once mid-step,
three ways (SIGINT to the tool, its SSH connection cut, the host killed and booted again),
then `up` again. The cluster converges (exit 0, and a third `up` changes nothing), the state
folder is intact (one identity, the same token, a kubeconfig, one known host key per host,
no temp files), no host keeps a half-written file (every tool file the interrupted run left
is the one a clean run writes; no temp leftovers) and the lock is free.

One lab for every case (three servers and an agent: first server, other servers, agents);
each case starts from `down`, so the interrupted `up` is a fresh one. The boundaries come
from `up --json`'s events (`step_start`, `phase`), read as they are printed.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import yaml
from clirun import BOOTSTRAP, run_bootstrap
from labinv import write_inventory

import testhosts
from bootstrap.host.parts import k3s_service, placing
from bootstrap.host.parts.paths import managed_paths
from bootstrap.remote.archive import STAGE_PREFIX
from bootstrap.inventory.loader import load_inventory

pytestmark = pytest.mark.hosts

NAMES = ("ft-cp1", "ft-cp2", "ft-cp3", "ft-a1")
FAULT_WAIT_S = 90  # an interrupted `up` must end by itself within this
PROMPT_S = 30  # ... and does, this soon after the fault: no step waits out a time-out for nothing


@dataclass(frozen=True)
class Boundary:
    name: str
    event: str  # the --json event that marks it
    field: str  # the event's field that names it
    value: str
    host: str  # the host the next step works on: the one cut or killed
    delay: float = 0.0  # > 0: mid-step, this long after the event
    own_event: bool = False  # the event must be `host`'s own (a step's end on that host)

    def reached_by(self, event: dict) -> bool:
        return event.get("event") == self.event and event.get(self.field) == self.value and \
            (not self.own_event or event.get("host") == self.host)


BOUNDARIES = {b.name: b for b in [
    Boundary("prepare host", "step_start", "step", "prepare host", "ft-a1"),
    Boundary("first server", "step_start", "step", "prepare host, start server ft-cp1", "ft-cp1"),
    Boundary("first server, mid-step", "step_start", "step", "prepare host, start server ft-cp1", "ft-cp1",
             delay=0.5),
    # A new cluster's joiner is prepared while the first server starts; its config.yaml (which
    # names the CA) comes with its start. Killed between the two, it must not boot into k3s.
    Boundary("joiner prepared", "step_end", "step", "prepare host", "ft-cp2", own_event=True),
    Boundary("other servers", "step_start", "step", "join server ft-cp2", "ft-cp2"),
    Boundary("agents", "step_start", "step", "join agents", "ft-a1"),
    Boundary("kubeconfig", "phase", "name", "kubeconfig", "ft-cp1"),
    Boundary("cluster side", "phase", "name", "cluster: tunnel", "ft-cp1"),
    Boundary("snapshot", "phase", "name", "cluster side", "ft-cp1"),
]}
# Every boundary for SIGINT; the SSH cut and the killed host where the host they hit is the
# one the next step needs (about 16 s a case: the whole file stays under six minutes).
CASES = [("sigint", b) for b in BOUNDARIES] + \
    [("ssh-cut", b) for b in ("prepare host", "first server", "first server, mid-step", "other servers", "agents",
                              "cluster side")] + \
    [("host-killed", b) for b in ("first server, mid-step", "joiner prepared", "other servers", "agents", "snapshot")]


@pytest.fixture(scope="module")
def fault_lab(tmp_path_factory):
    from standins.airgap import build_airgap

    folder = tmp_path_factory.mktemp("faults")
    airgap = build_airgap(folder / "airgap")
    lab = testhosts.Lab()
    try:
        hosts = lab.start(list(NAMES))
        inventory = write_inventory(folder / "inv.yaml", hosts, servers=3, extra={"k3s": {"airgap": str(airgap)}})
        first = run_bootstrap("up", inventory, "--no-validate", timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        yield lab, inventory
    finally:
        lab.cleanup()


def _events(proc, into: queue.Queue) -> None:
    for line in proc.stdout:
        try:
            into.put(json.loads(line))
        except ValueError:
            into.put({"event": "text", "text": line})
    into.put(None)


def up_interrupted(inventory, boundary: Boundary, fault) -> tuple[subprocess.Popen, list[dict], bool]:
    """`up --json` until `boundary`, then `fault(proc)`; waits for the tool to end (soon).
    Returns the process, the events it printed and whether the boundary was reached."""
    # FAULTS_EXTRA: global options for the interrupted run (--debug shows an internal error's traceback)
    proc = subprocess.Popen([str(BOOTSTRAP), *os.environ.get("FAULTS_EXTRA", "").split(), "up", str(inventory), "--json", "--no-validate"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    events: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_events, args=(proc, events), daemon=True)
    reader.start()
    seen, reached, faulted = [], False, None
    while True:
        event = events.get(timeout=FAULT_WAIT_S)
        if event is None:
            break
        seen.append(event)
        if not reached and boundary.reached_by(event):
            reached = True
            time.sleep(boundary.delay)
            fault(proc)
            faulted = time.monotonic()
    try:
        proc.wait(FAULT_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"`up` did not end {FAULT_WAIT_S}s after the fault at {boundary.name}")
    reader.join(5)
    if faulted is not None:
        assert time.monotonic() - faulted < PROMPT_S, f"`up` took {time.monotonic() - faulted:.0f}s to end after the fault"
    return proc, seen, reached


def sigint(proc, _host):
    proc.send_signal(signal.SIGINT)


def cut_ssh(_proc, host):
    """Reset every TCP connection from this machine to the host's SSH port (the tool's:
    nothing else talks to the host now), both ends, as a dropped link does."""
    killed = subprocess.run(["ss", "-K", "-tnH", "dst", host.address, "dport", "=", "22"],
                            capture_output=True, text=True)
    if killed.returncode != 0 or not killed.stdout.strip():
        # The kernel without SOCK_DESTROY, or nothing open at this instant: end the tool's
        # sessions on the host instead (the back door logs in as root, the tool as the lab user).
        host.ssh(f"pkill -f '^sshd: {testhosts.SSH_USER}@'", user="root", check=False)


def kill_host(_proc, host):
    host.restart()  # SIGKILL the whole machine, then boot the same disk


FAULTS = {"sigint": sigint, "ssh-cut": cut_ssh, "host-killed": kill_host}


def host_view(host, paths: list[str]) -> tuple[dict[str, str], list[str]]:
    """({path: sha256} of the tool's files the host holds, the temps beside them and the
    staging dirs in /tmp), in one round trip."""
    globs = " ".join(f"{os.path.dirname(p)}/.{os.path.basename(p)}{placing.TEMP_MARK}*" for p in paths)
    out = host.ssh(f"sha256sum {' '.join(paths)} 2>/dev/null; echo --; ls -d {globs} {STAGE_PREFIX}* 2>/dev/null; true",
                   user="root").stdout
    sums, _, temps = out.partition("--\n")
    return {line.split()[1]: line.split()[0] for line in sums.splitlines() if len(line.split()) == 2}, temps.split()


def hosts_view(hosts, paths) -> dict[str, tuple[dict[str, str], list[str]]]:
    with ThreadPoolExecutor(len(hosts)) as pool:
        return dict(zip([h.name for h in hosts], pool.map(lambda h: host_view(h, paths), hosts)))


def state_summary(state) -> dict:
    """What the state folder holds; the kubeconfig only once a run got that far."""
    identity = json.loads((state / "identity.json").read_text())
    kubeconfig = yaml.safe_load((state / "kubeconfig").read_text()) if (state / "kubeconfig").exists() else None
    known = [line.split()[0] for line in (state / "known_hosts").read_text().splitlines() if line.strip()]
    return {"id": identity["id"], "token": (state / "token").read_text().strip(),
            "clusters": [c["name"] for c in kubeconfig["clusters"]] if kubeconfig else None, "known": sorted(known),
            "temps": sorted(p.name for p in state.iterdir() if ".tmp" in p.name)}


def k3s_logs(hosts) -> str:
    """The last lines k3s logged on each host: why a start failed, for the assertion's message."""
    return "\n".join(f"--- {h.name}:\n" + h.ssh("journalctl -u k3s -u k3s-agent -o cat --no-pager | tail -n 15",
                                                  user="root", check=False).stdout for h in hosts)


def lock_is_free(state) -> bool:
    with open(state / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def _case_id(case) -> str:
    way, name = case.values if hasattr(case, "values") else case
    return f"{way}-{name}".replace(" ", "-").replace(",", "")


@pytest.mark.parametrize("way, name", CASES, ids=[_case_id(c) for c in CASES])
def test_an_interrupted_up_converges_on_the_next(fault_lab, way, name):
    lab, inventory = fault_lab
    boundary = BOUNDARIES[name]
    inv = load_inventory(inventory)
    state = inventory.parent / "state"
    paths = [p for p in managed_paths(inv) if p != k3s_service.KUBECONFIG]  # k3s writes that one
    hosts = [lab[n] for n in NAMES]
    down = run_bootstrap("down", inventory, "--yes", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr

    started = time.monotonic()
    proc, events, reached = up_interrupted(inventory, boundary, lambda p: FAULTS[way](p, lab[boundary.host]))
    stderr = proc.stderr.read()
    print(f"{way} at {boundary.name}: the interrupted up ended in {time.monotonic() - started:.1f}s, "
          f"exit {proc.returncode}: {stderr.strip().splitlines()[-3:]}")
    assert reached, f"`up` never reached {boundary.name}: {events}"
    # A fault is no crash of the tool: no traceback, no "internal error ... report it".
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    if way == "sigint":
        assert proc.returncode == 130, (proc.returncode, stderr)
    after_fault = hosts_view(hosts, paths)
    before = state_summary(state)
    assert before["token"] and not before["temps"], before
    assert lock_is_free(state)

    started = time.monotonic()
    again = run_bootstrap("up", inventory, "--no-validate", timeout=300)
    print(f"the next up took {time.monotonic() - started:.1f}s")
    assert again.returncode == 0, f"{way} at {boundary.name}:\n{again.stdout}{again.stderr}\n{k3s_logs(hosts)}"
    third = run_bootstrap("up", inventory, "--no-validate", timeout=120)
    assert third.returncode == 0 and "hosts: no change" in third.stdout, third.stdout + third.stderr
    assert "cluster: no change" in third.stdout, third.stdout

    after = state_summary(state)
    assert (after["id"], after["token"]) == (before["id"], before["token"])  # the same cluster throughout
    assert len(after["clusters"]) == 1 and not after["temps"], after
    assert sorted(set(after["known"])) == after["known"] and len(after["known"]) == len(hosts), after["known"]
    assert lock_is_free(state)
    # This cluster has a snapshot (an `up` stopped at its snapshot used to leave none, ever).
    assert any(p.name.startswith(f"bootstrap-{after['id']}-") for p in (state / "snapshots").iterdir())
    for name, (clean, temps) in hosts_view(hosts, paths).items():
        # Each file the interrupted run left is whole: the one the clean run wrote.
        half = {p: h for p, h in after_fault[name][0].items() if clean.get(p) != h}
        assert not half, f"{name} kept files the clean run rewrote: {half}"
        assert not temps, (name, temps)
