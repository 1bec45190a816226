"""The state folder holds the cluster's id, join token and kubeconfig: written all at once,
under the lock, in a folder only its owner can write to; snapshots ordered by their names.

Each test fails on the code before (dba963f): identity.json was created before the lock
(two runs, two ids), written through a fixed `<name>.tmp` that followed a planted symlink
and, left over, refused the folder; nothing was fsynced; a group-writable folder was used;
an empty token or a null id was used; snapshots were ordered by mtime and the one just
taken could be pruned.
"""

import json
import multiprocessing
import os
import re
import stat
import time

import pytest
import yaml
from sshpair import Host, SshPairs, Vanish

from bootstrap.state import snapshots
from bootstrap.state import folder as statedir_module
from bootstrap.errors import BootstrapError, UsageError
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.lock import ClusterBusy, cluster_lock
from bootstrap.state.folder import IDENTITY, StateDir


def inventory_file(path, state_dir="state", retention=None):
    data = {"cluster": "solo", "state_dir": str(state_dir),
            "nodes": [{"name": "box-1", "address": "203.0.113.10", "role": "server"}]}
    if retention:
        data["k3s"] = {"snapshots": {"retention": retention}}
    path.write_text(yaml.safe_dump(data))
    return path


# --- one identity, created under the lock ------------------------------------------------

def _start_together(inventory_path, barrier, results, locked):
    state = StateDir(load_inventory(inventory_path))
    barrier.wait()
    try:
        if locked:
            with cluster_lock(state, "up"):
                results.put(state.cluster_id)
                time.sleep(0.01)
        else:
            results.put(state.cluster_id)
    except ClusterBusy:
        results.put(None)
    except Exception as exc:  # what the old code's fixed temp name did to the other run
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("locked", [True, False], ids=["under-cluster_lock", "plain-ensure"])
def test_two_runs_started_together_on_a_fresh_folder_end_with_one_id(tmp_path, locked):
    context = multiprocessing.get_context("fork")
    for attempt in range(50):
        inventory = inventory_file(tmp_path / f"inv-{attempt}.yaml", state_dir=tmp_path / f"state-{attempt}")
        barrier, results = context.Barrier(2), context.Queue()
        runs = [context.Process(target=_start_together, args=(inventory, barrier, results, locked))
                for _ in range(2)]
        for run in runs:
            run.start()
        seen = [results.get(timeout=30) for _ in runs]
        for run in runs:
            run.join(timeout=30)
        on_disk = json.loads((tmp_path / f"state-{attempt}" / IDENTITY).read_text())["id"]
        ids = [s for s in seen if s is not None]
        assert ids and all(s == on_disk for s in ids), (attempt, seen, on_disk)


# --- writes: a temp name of its own, never a planted link ---------------------------------

def test_a_symlink_planted_at_any_predictable_temp_name_is_never_followed(tmp_path, monkeypatch):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.ensure()
    victim = tmp_path / "someone-elses-file"
    victim.write_text("theirs\n")
    names = iter(["aaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"])
    monkeypatch.setattr(statedir_module.secrets, "token_hex", lambda n: next(names))
    planted = ["token.tmp", ".token.tmp", ".token.aaaaaaaaaaaaaaaa.tmp"]  # old name, and a "random" one guessed
    for name in planted:
        (state.path / name).symlink_to(victim)
    state.write_secret("token", "s3cret\n")
    assert victim.read_text() == "theirs\n"
    assert (state.path / "token").read_text() == "s3cret\n" and not (state.path / "token").is_symlink()
    assert all((state.path / name).is_symlink() for name in planted)
    assert stat.S_IMODE((state.path / "token").stat().st_mode) == 0o600


def test_a_leftover_temp_file_never_blocks_a_run_and_is_cleaned_under_the_lock(tmp_path):
    """A first run killed while writing identity.json leaves its temp file and nothing else."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    for leftover in ("identity.json.tmp", ".identity.json.0123456789abcdef.tmp"):
        (folder / leftover).write_text('{"clus')
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml", state_dir=folder)))
    with cluster_lock(state, "up"):
        assert len(state.cluster_id) == 16
        state.write_secret("token", "t\n")
    assert sorted(p.name for p in folder.iterdir()) == ["identity.json", "lock", "token"]


def test_every_write_is_fsynced_before_and_after_its_rename(tmp_path, monkeypatch):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.ensure()
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    state.write_secret("token", "t\n")
    assert re.fullmatch(re.escape(str(state.path)) + r"/\.token\.[0-9a-f]{16}\.tmp", synced[0])  # the data
    assert synced[-1] == str(state.path)  # the rename


# --- a folder only its owner can write to -------------------------------------------------

@pytest.mark.parametrize("where", ["", "snapshots", "logs"])
def test_a_folder_writable_by_others_is_refused_with_the_fix(tmp_path, where):
    inventory = inventory_file(tmp_path / "inv.yaml")
    StateDir(load_inventory(inventory)).ensure()
    folder = tmp_path / "state" / where
    folder.mkdir(exist_ok=True)
    os.chmod(folder, 0o770)
    with pytest.raises(UsageError) as caught:
        with cluster_lock(StateDir(load_inventory(inventory)), "up"):
            pass
    assert f"chmod 700 {folder}" in caught.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_owned_by_another_user_is_refused_with_the_fix(tmp_path):
    inventory = inventory_file(tmp_path / "inv.yaml")
    StateDir(load_inventory(inventory)).ensure()
    os.chown(tmp_path / "state", 54321, -1)
    with pytest.raises(UsageError, match="chown"):
        StateDir(load_inventory(inventory)).ensure()


def test_folders_the_tool_creates_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
        with cluster_lock(state, "up"):
            folders = [state.path, snapshots.local_dir(state), state.logs]
    finally:
        os.umask(old)
    assert [stat.S_IMODE(f.stat().st_mode) for f in folders] == [0o700] * 3


# --- secrets and identity: refused when empty or malformed, naming the file --------------------

@pytest.mark.parametrize("content, why", [
    (None, "is missing"), ("", "is empty"), ("\n  \n", "is empty"), ("one\ntwo\n", "not one line"),
    ("\x1b[2Jtoken\n", "not one line"), ("tok en\n", "not one line"), ("x" * 5000, "not one line"),
])
def test_read_secret_refuses_a_missing_empty_or_malformed_token_naming_the_file(tmp_path, content, why):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.ensure()
    if content is not None:
        (state.path / "token").write_text(content)
    with pytest.raises(UsageError) as caught:
        state.read_secret("token")
    assert str(state.path / "token") in caught.value.message and why in caught.value.message


def test_read_secret_returns_the_stripped_value(tmp_path):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.write_secret("token", "K10abc::server:def\n")
    assert state.read_secret("token") == "K10abc::server:def"


@pytest.mark.parametrize("content", ["", "null", "[]", '{"cluster": "solo", "id": null, "inventory": "x"}',
                                     '{"cluster": "solo", "id": "../../etc", "inventory": "x"}',
                                     '{"cluster": "solo", "id": "0123456789abcdef", "inventory": 5}',
                                     "[" * 100000])
def test_an_empty_or_malformed_identity_is_refused_naming_the_file(tmp_path, content):
    inventory = inventory_file(tmp_path / "inv.yaml")
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    (folder / IDENTITY).write_text(content)
    with pytest.raises(UsageError) as caught:
        StateDir(load_inventory(inventory)).ensure()
    assert str(folder / IDENTITY) in caught.value.message


def test_a_snapshot_is_not_taken_with_an_empty_token(tmp_path, server):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.write_secret("token", "\n")
    client = server()
    with pytest.raises(UsageError, match="is empty"):
        snapshots.take(state.inventory, state, ssh=lambda name: client)
    assert not any(p.name.endswith(".token") for p in snapshots.local_dir(state).iterdir())


# --- snapshots: ordered by the time in their names -------------------------------------------

def snapshot_answer(command: bytes, _stdin: bytes) -> tuple[int, bytes]:
    """What `k3s etcd-snapshot save` answers through take's one command: the name k3s gave
    the file (ours plus -<node>-<unix time>), then its bytes."""
    name = re.search(rb"--name '?(bootstrap-[0-9a-f]+-[0-9]{8}-[0-9]{6}z)", command).group(1).decode()
    return 0, f"{name}-box-1-{int(time.time())}\n".encode() + b"etcd data"


@pytest.fixture
def server():
    """The first server's SSH connection, real paramiko both ends (tests/sshpair.py):
    server(answer) -> the client take() borrows."""
    pairs = SshPairs()
    yield lambda answer=snapshot_answer: pairs.connect(Host(answer, reads_stdin=False))
    pairs.close()


@pytest.mark.parametrize("how", ["connection closes", "no exit status"])
def test_a_server_lost_while_it_saves_is_said_as_a_lost_connection(tmp_path, server, how):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.write_secret("token", "t\n")

    def answer(command, stdin):
        if how == "connection closes":
            raise Vanish()
        return None, b""

    client = server(answer)
    with pytest.raises(BootstrapError, match="SSH connection to box-1 (was lost|ended)"):
        snapshots.take(state.inventory, state, ssh=lambda name: client)
    assert not list(snapshots.local_dir(state).iterdir())


def snapshot_named(state, when: float, node="box-1", mtime=None):
    name = f"bootstrap-{state.cluster_id}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}-{node}-{int(when)}"
    path = snapshots.local_dir(state) / name
    path.write_text("etcd")
    (path.parent / (name + ".token")).write_text("t\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_the_snapshot_just_taken_is_never_pruned_after_the_clock_jumped_back(tmp_path, server):
    """Taken while the clock was a day ahead, the older copies carry later times than the
    one taken now; before, the new copy (by mtime or by name) was the one pruned."""
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml", retention=2)))
    state.write_secret("token", "t\n")
    ahead = [snapshot_named(state, time.time() + 86400 + i * 60, mtime=time.time() + 86400 + i * 60)
             for i in range(3)]
    client = server()
    taken = snapshots.take(state.inventory, state, ssh=lambda name: client)
    assert taken.exists() and (taken.parent / (taken.name + ".token")).read_text() == "t\n"
    left = sorted(p.name for p in snapshots.local_dir(state).iterdir() if not p.name.endswith(".token"))
    assert left == sorted([taken.name, ahead[2].name])  # retention 2: the new one and the newest other


def test_order_and_ages_come_from_the_names_not_the_files_mtimes(tmp_path):
    """A restore picks the newest by name: a copy touched later (a backup restored, a clock
    jump) does not pass for the newest."""
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    now = time.time()
    old = snapshot_named(state, now - 7 * 86400, mtime=now)  # touched just now
    new = snapshot_named(state, now - 7200, mtime=now - 30 * 86400)
    assert [s.path for s in snapshots.local_snapshots(state)] == [old, new]
    assert snapshots.newest(state).path == new
    assert snapshots.newest(state).age(now) == "2 h 0 min"
    snapshots.prune(state, keep=1)
    assert new.exists() and not old.exists() and not (old.parent / (old.name + ".token")).exists()


@pytest.mark.parametrize("answered", [
    "bootstrap-{id}-99991231-235959z-box-1-253402300799",  # dated in year 9999: newest() for good
    "bootstrap-{id}-20261203-091500z-box-1-1",  # this cluster's pattern, another time than asked
    "{asked}-box-1-253402300799/../../x",  # what k3s appends, and then more
    "{asked}",  # without what k3s appends
])
def test_a_snapshot_name_the_server_made_up_is_never_kept_nor_picked(tmp_path, server, answered):
    """Issue 32: take() kept whatever name of this cluster's pattern the server answered; a
    name dated 9999-12-31 then stayed newest() for good and a restore picked it."""
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.write_secret("token", "t\n")
    earlier = snapshot_named(state, time.time() - 3600)

    def answer(command, _stdin):
        asked = re.search(rb"--name '?(bootstrap-[0-9a-f]+-[0-9]{8}-[0-9]{6}z)", command).group(1).decode()
        return 0, answered.format(id=state.cluster_id, asked=asked).encode() + b"\netcd data"

    client = server(answer)
    with pytest.raises(BootstrapError, match="not the one asked for") as caught:
        snapshots.take(state.inventory, state, ssh=lambda name: client)
    assert "no snapshot was kept" in caught.value.message
    assert sorted(p.name for p in snapshots.local_dir(state).iterdir()) == [earlier.name, earlier.name + ".token"]
    assert snapshots.newest(state).path == earlier


def test_the_name_k3s_gave_the_name_asked_for_is_kept(tmp_path, server):
    state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
    state.write_secret("token", "t\n")
    client = server()
    taken = snapshots.take(state.inventory, state, ssh=lambda name: client)
    assert snapshots.newest(state).path == taken and taken.read_bytes() == b"etcd data"
    assert snapshots.chosen_by_us(taken.name, taken.name.rsplit("-box-1-", 1)[0])


def test_names_carry_utc_so_the_hour_repeated_when_daylight_saving_ends_keeps_its_order(tmp_path, monkeypatch):
    """Europe/Berlin, 2026-10-25: 02:30 CEST comes, then an hour later 02:10 CET. Named in
    local time, the later snapshot sorted first and a restore picked the earlier one."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        state = StateDir(load_inventory(inventory_file(tmp_path / "inv.yaml")))
        first_pass = 1792888200.0  # 2026-10-25 00:30 UTC = 02:30 CEST
        second_pass = first_pass + 2400  # 01:10 UTC = 02:10 CET
        assert time.localtime(second_pass).tm_hour == time.localtime(first_pass).tm_hour == 2
        names = [f"bootstrap-{state.cluster_id}-{snapshots.time_in_name(when)}-box-1-{int(when)}"
                 for when in (first_pass, second_pass)]
        assert all(snapshots.is_ours(name, state.cluster_id) for name in names)
        assert snapshots.named_time(names[0])[0] == first_pass
        assert snapshots.named_time(names[1])[0] == second_pass
        # A name from before (local time, no mark) still reads as the time it meant.
        legacy = f"bootstrap-{state.cluster_id}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(first_pass - 3600))}-box-1-1"
        assert snapshots.is_ours(legacy, state.cluster_id)
        assert snapshots.named_time(legacy)[0] == first_pass - 3600
        for name in names + [legacy]:
            (snapshots.local_dir(state) / name).write_text("etcd")
        assert [s.name for s in snapshots.local_snapshots(state)] == [legacy, *names]
        assert snapshots.newest(state).name == names[1]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
