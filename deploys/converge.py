"""The pyinfra commands that carry out a host plan. They only decide commands; the plan
(bootstrap.host.plan) already compared desired state with the facts gathered up front, and
bootstrap.remote.executor runs them, step by step, all hosts of a step in parallel. A host
with nothing to do in a step gets no commands (no round trip).
"""

from __future__ import annotations

import io
import shlex

from pyinfra.api import FunctionCommand, StringCommand

from bootstrap.host.parts import k3s_binary, placing
from bootstrap.remote import archive
from bootstrap.host.parts.k3s_service import CONTAINERD_CONFIG
from bootstrap.host.plan import restore
from bootstrap.host.plan.join_tokens import CA_HASH_REFUSED
from bootstrap.host.plan.host_plan import HostPlan

SERVICE_TIMEOUT_S = 300


def placement_commands(plan: HostPlan, keep_previous_binary: bool = False, then: list[str] = ()) -> list:
    """A host's change in ONE command when it has files: its root script receives them as a
    tar stream on stdin (bootstrap.remote.archive), extracts them into a private (0700,
    root's) staging dir, places each with its mode (a temp name in the target's folder, synced,
    renamed over it: bootstrap.host.parts.placing) and runs the preparation lines. One
    channel instead of a staging command, an SFTP session and a root script, and a secret
    never sits in a login user's file or on a command line. The script's trap removes the
    staging dir on every exit.
    `keep_previous_binary`: copy the running k3s binary aside first (an upgrade's way back).
    `then`: lines run after them in the same command (a start: `placed_and_started`)."""
    if not plan.uploads and not plan.prepare:
        return []
    if not plan.uploads:
        return [StringCommand("\n".join([*placing.script_head(), *_keep(keep_previous_binary), *plan.prepare, *then]))]
    lines = archive.receiving_lines() + _keep(keep_previous_binary)
    for index, spec in enumerate(plan.uploads):
        lines.append(placing.place(archive.staged(index), spec.mode, spec.path))
    lines += [*plan.prepare, *then]
    sources = [str(spec.local) if spec.local else io.BytesIO(spec.content) for spec in plan.uploads]
    return [FunctionCommand(archive.run_with_archive, ("\n".join(lines), sources), {})]


def _keep(keep_previous_binary: bool) -> list[str]:
    return [k3s_binary.keep_previous()] if keep_previous_binary else []


def placed_and_started(plan: HostPlan, action: str, keep_previous_binary: bool = False) -> list:
    """A node's files placed and its k3s (re)started and waited for in ONE command: a
    joiner's config.yaml (which names the CA, so it waits for the first server) and its
    start, an upgrade's binary and its restart. Same script as the two commands one after
    the other (the placing stops at its first error, `set -e`; the wait then runs as it
    does alone), one round trip less per node on the critical path."""
    start = wait_for_service_script(plan.unit, action, plan.start_timeout, then=plan.pull_after_start)
    placed = placement_commands(plan, keep_previous_binary, then=["set +e", start])
    return placed or [StringCommand(start)]


def wait_for_service(unit: str, action: str, timeout: int = SERVICE_TIMEOUT_S, then: list[str] = ()) -> StringCommand:
    return StringCommand(wait_for_service_script(unit, action, timeout, then))


def wait_for_service_script(unit: str, action: str, timeout: int = SERVICE_TIMEOUT_S, then: list[str] = ()) -> str:
    """(Re)start without blocking, then wait: active (in a new run, for a restart) is
    success; a crash (systemd's auto-restart, or a second new run) or the time-out fails
    with the unit's last log lines. A unit caught in a crash loop from before is stopped
    and its failed state cleared first, so its history does not count against this start.
    `then`: shell lines run once it is active, in the same command (no round trip more);
    their failure is reported on stderr, the start still succeeded."""
    done, head = "exit 0", ""
    if then:
        done = "started"
        head = "started() {\n  { " + "\n".join(then) + \
            "\n  } || echo \"$u is active, but starting its image pulls failed\" >&2\n  exit 0\n}\n"
    # A join refused for the CA hash its token names: an agent asks again every 2 s and never
    # becomes active, so the wait ends when k3s says so (looked for every 5 s), and that line
    # (a hash, no secret) comes last: it is the failure's reason (bootstrap.flows.ca_hash).
    log = 'journalctl -u $u --since "@$t0" -o cat --no-pager 2>/dev/null'
    said = f"grep -F {shlex.quote(CA_HASH_REFUSED)}"
    says = f"grep -qF {shlex.quote(CA_HASH_REFUSED)}"
    script = f"""
u={unit}
{head}show() {{ systemctl show -p "$1" --value $u 2>/dev/null; }}
t0=$(date +%s)
old=$(show InvocationID)
state=$(show ActiveState)
was_active=no; [ "$state" = active ] && was_active=yes
if [ "$state" != active ] && [ "$state" != inactive ]; then systemctl stop $u 2>/dev/null || true; fi
systemctl reset-failed $u 2>/dev/null || true
systemctl {action} --no-block $u
first=""
i=0
while [ $i -lt {timeout} ]; do
  state=$(show ActiveState); sub=$(show SubState); id=$(show InvocationID)
  if [ -n "$id" ] && [ "$id" != "$old" ] && [ -z "$first" ]; then first=$id; fi
  if [ "$state" = active ]; then
    if [ -n "$first" ] && [ "$id" = "$first" ]; then {done}; fi
    if [ {action} = start ] && [ $was_active = yes ]; then {done}; fi
  fi
  if [ "$state" = failed ] || [ "$sub" = auto-restart ]; then break; fi
  if [ -n "$first" ] && [ -n "$id" ] && [ "$id" != "$first" ]; then break; fi
  if [ $((i % 5)) = 4 ] && {log} | {says}; then break; fi
  sleep 1; i=$((i+1))
done
echo "$u did not become active ($state after ${{i}}s); its last log lines:" >&2
journalctl -u $u -n 8 --no-pager -o cat 2>/dev/null | grep -iv token | tail -n 5 >&2
{log} | {said} | tail -n 1 | cut -c 1-400 >&2
exit 1
"""
    return script.strip()


def verify_nvidia_runtime_command() -> StringCommand:
    config = CONTAINERD_CONFIG
    return StringCommand(
        f"for i in $(seq 1 30); do grep -qE \"runtimes\\.[\\\"']?nvidia[\\\"']?\\]\" {config} 2>/dev/null && exit 0; sleep 1; done; "
        f"echo 'k3s did not detect the nvidia runtime in {config}; is nvidia-container-runtime on PATH?' >&2; exit 1")


def refuse(message: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit 1", _sudo=False)


def restore_commands(snapshot, s3_configured: bool = False) -> list:
    """Put a local snapshot on the new server and reset the datastore from it, in one
    command (the snapshot arrives on its stdin). The token in config.yaml (the old
    cluster's) decrypts it; k3s refuses a wrong one."""
    # The name is one of the state folder's own (bootstrap.state.snapshots pattern); quoted anyway.
    remote = restore.remote_snapshot_path(snapshot.name)
    script = "\n".join([
        *archive.receiving_lines(),
        placing.place(archive.staged(0), 0o600, remote),
        restore.stop_server_line(),
        f"out=$({restore.reset_command(remote, s3_configured)} 2>&1) || "
        "{ echo \"$out\" | grep -iv token | tail -n 5 >&2; exit 1; }",
        "echo \"$out\" | grep -iv token | tail -n 2",
    ])
    return [FunctionCommand(archive.run_with_archive, (script, [str(snapshot)]), {})]


def clear_peer_commands() -> list:
    """Another server of a restored cluster: stopped, its old etcd data removed."""
    return [StringCommand("\n".join(restore.clear_peer_lines()))]
