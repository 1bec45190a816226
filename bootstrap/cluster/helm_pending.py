"""A Helm release left pending (Helm killed mid-operation): what happened, and whether a
recovery loses nothing. Pure: `helm history -o json` text in, a decision out.

Helm marks a release `pending-install`, `pending-upgrade` or `pending-rollback` when an
operation starts and `deployed` or `failed` when it ends; a Helm killed in between (at the
tool's own time-out, by Ctrl-C, by a lost laptop lid) leaves the pending mark, and every later
`upgrade` refuses it with "another operation (install/upgrade/rollback) is in progress"
(helm/helm v3.14.4 and v4.1.4 pkg/action/upgrade.go, prepareUpgrade; pkg/release/status.go,
IsPending). Neither `install` nor `upgrade --install` ever clears it.

The rule: a pending-install of a release that was never deployed (no revision `deployed` or
`superseded`) is uninstalled and installed again: there is nothing to keep. A pending-upgrade
is rolled back to the revision still `deployed` (Helm keeps the old revision `deployed` until
an upgrade succeeds: pkg/action/upgrade.go, performUpgrade), then upgraded again. Anything
else (a pending rollback, no deployed revision to go back to, a history that cannot be read)
is refused with the command that would recover it, for the user to judge. A pending mark
younger than the longest Helm operation the tool runs may be a Helm still running (another
terminal, another operator): it is refused too, with the time to wait.

The history is cluster text (release Secrets anyone with access to the namespace can
write): read with remote_data's caps, its fields type-checked, its size bounded by `--max`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

from bootstrap.remote_data import RemoteDataError, expect, loads

HISTORY_MAX = 16  # `helm history --max`: the newest revisions; the deployed one is among them
MAX_HISTORY_CHARS = 4 * 1024 * 1024  # 16 revisions whose descriptions are Helm's error texts
PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
WAS_DEPLOYED = ("deployed", "superseded")

# Helm's words for a release another operation holds (pkg/action/action.go, errPending).
PENDING_ERROR = re.compile(r"another operation \(install/upgrade/rollback\) is in progress")

# RFC 3339 as Go's time.Time marshals it (nanoseconds, Z or an offset); anchored, no nesting.
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")

UNINSTALL, ROLLBACK, REFUSE = "uninstall", "rollback", "refuse"


@dataclass(frozen=True)
class Revision:
    number: int
    status: str
    updated: datetime | None  # None: Helm gave no time, or one the tool cannot read


@dataclass(frozen=True)
class Recovery:
    action: str  # UNINSTALL, ROLLBACK or REFUSE
    said: str  # what happened, in the tool's words
    to_revision: int | None = None  # ROLLBACK's target
    wait_s: int = 0  # REFUSE because the mark is young: seconds until it is old enough


def parse_time(text: str) -> datetime | None:
    match = _TIME.fullmatch(text)
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        offset = timezone.utc if zone == "Z" else datetime.strptime(zone.replace(":", ""), "%z").tzinfo
        return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                        int((fraction or "0").ljust(6, "0")[:6]), tzinfo=offset)
    except ValueError:  # a 31 February, an hour 25
        return None


def parse_history(text: str | bytes) -> list[Revision]:
    """`helm history NAME -o json`: a list of {revision, status, updated, ...}, oldest first;
    RemoteDataError with the reason for anything else."""
    items = expect(loads(text, what="helm history's answer", max_chars=MAX_HISTORY_CHARS, max_depth=4),
                   list, "helm history's answer")
    revisions = []
    for i, item in enumerate(items):
        item = expect(item, dict, f"helm history's entry {i}")
        number = expect(item.get("revision"), int, f"helm history's entry {i} revision")
        status = expect(item.get("status"), str, f"helm history's entry {i} status")
        updated = item.get("updated")
        revisions.append(Revision(number, status[:64], parse_time(updated) if isinstance(updated, str) else None))
    return sorted(revisions, key=lambda r: r.number)


def recovery(name: str, history: list[Revision], now: datetime, settle_s: int) -> Recovery | None:
    """What to do with release `name` whose newest revision is `history[-1]`; None when it is
    not pending (the failure was something else)."""
    if not history or history[-1].status not in PENDING:
        return None
    last = history[-1]
    said = f"release {name} was left {last.status} at revision {last.number} (a Helm stopped before it finished)"
    age = None if last.updated is None else (now - last.updated).total_seconds()
    if age is None or age < settle_s:
        wait = settle_s if age is None else int(settle_s - age) + 1
        why = "its time is unreadable" if age is None else f"it is {int(age)}s old"
        return Recovery(REFUSE, f"{said}; {why}, so a Helm may still be running it", wait_s=wait)
    deployed = [r for r in history if r.status == "deployed"]
    if last.status == "pending-install" and not any(r.status in WAS_DEPLOYED for r in history):
        # "Never deployed" holds only of a whole history: `--max` shows the newest revisions,
        # and Helm prunes the oldest (pkg/storage/storage.go, removeLeastRecent), so a history
        # that does not run from revision 1 without a gap may hide a deployed one.
        if [r.number for r in history] != list(range(1, len(history) + 1)):
            return Recovery(REFUSE, f"{said}; its history from revision {history[0].number} on shows no deployed "
                                    "revision, but the older ones are not shown, so it may have been deployed")
        return Recovery(UNINSTALL, f"{said}; it was never deployed, so it is uninstalled and installed again")
    if last.status == "pending-upgrade" and deployed:
        target = deployed[-1].number
        return Recovery(ROLLBACK, f"{said}; it is rolled back to revision {target}, still deployed, "
                                  "and upgraded again", to_revision=target)
    return Recovery(REFUSE, f"{said}; no recovery that loses nothing is known for it")

