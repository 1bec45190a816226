"""bootstrap.cluster.helm_pending: a release a killed Helm left pending, judged from
`helm history -o json` (cluster text, crafted here as a hostile namespace could write it)."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootstrap.cluster import helm_pending as hp
from bootstrap.remote_data import RemoteDataError

NOW = datetime(2026, 12, 4, 2, 0, tzinfo=timezone.utc)
SETTLE = 660


def history(*statuses, age_s=3600):
    stamp = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")
    return [{"revision": i + 1, "updated": stamp, "status": s, "chart": "gpu-operator-v26.7.0",
             "app_version": "v26.7.0", "description": "Install complete"} for i, s in enumerate(statuses)]


def decide(entries):
    return hp.recovery("gpu-operator", hp.parse_history(json.dumps(entries)), NOW, SETTLE)


def test_a_never_deployed_pending_install_is_uninstalled():
    found = decide(history("pending-install"))
    assert found.action == hp.UNINSTALL and "never deployed" in found.said and "pending-install" in found.said
    # Earlier failed attempts deployed nothing either.
    assert decide(history("failed", "pending-install")).action == hp.UNINSTALL


def test_a_pending_install_after_a_deployed_revision_is_refused():
    """`uninstall --keep-history` then install: something was deployed once, so no uninstall."""
    assert decide(history("superseded", "uninstalled", "pending-install")).action == hp.REFUSE


def test_a_pending_install_whose_older_revisions_are_not_shown_is_refused():
    """`helm history --max` shows the newest revisions only (and Helm prunes the oldest): a
    history that does not start at revision 1 may hide a deployed one, so nothing is uninstalled."""
    cut = history(*["failed"] * (hp.HISTORY_MAX - 1), "pending-install")
    for i, entry in enumerate(cut):
        entry["revision"] = 40 + i  # revisions 1-39, a deployed one among them, are not shown
    found = decide(cut)
    assert found.action == hp.REFUSE and "not shown" in found.said
    gap = history("failed", "failed", "pending-install")
    gap[2]["revision"] = 4  # revisions 1, 2, 4: revision 3 is not shown
    assert decide(gap).action == hp.REFUSE


def test_a_pending_upgrade_is_rolled_back_to_the_revision_still_deployed():
    found = decide(history("superseded", "deployed", "pending-upgrade"))
    assert (found.action, found.to_revision) == (hp.ROLLBACK, 2)
    assert decide(history("superseded", "failed", "pending-upgrade")).action == hp.REFUSE  # nothing deployed


def test_a_pending_rollback_is_refused():
    assert decide(history("deployed", "superseded", "pending-rollback")).action == hp.REFUSE


def test_a_young_pending_mark_may_be_a_running_helm():
    found = decide(history("deployed", "pending-upgrade", age_s=60))
    # 60 s less the stamp's .123456789: 59.88 s old, 600.12 s to wait, rounded up.
    assert found.action == hp.REFUSE and found.wait_s == 601 and "59s old" in found.said
    unreadable = history("pending-install")
    unreadable[0]["updated"] = "yesterday"
    found = decide(unreadable)
    assert found.action == hp.REFUSE and found.wait_s == SETTLE and "unreadable" in found.said


def test_not_pending_is_no_recovery():
    assert decide(history("deployed")) is None
    assert decide([]) is None


def test_revisions_are_ordered_by_number_whatever_the_order_given():
    entries = history("pending-upgrade", "deployed")
    entries[0]["revision"], entries[1]["revision"] = 3, 2
    assert decide(entries).to_revision == 2


@pytest.mark.parametrize("text, reason", [
    ('{"revision": 1}', "not a list"),
    ('[{"revision": "1", "status": "deployed"}]', "revision is a string"),
    ('[{"revision": true, "status": "deployed"}]', "revision is true/false"),
    ('[{"revision": 1, "status": null}]', "status is null"),
    ('[[[[[[1]]]]]]', "nests deeper"),
    ("[" * 100_000, "nests deeper"),
    ('[{"revision": NaN, "status": "x"}]', "not valid JSON"),
    (b'\xff\xfe[', "not valid JSON"),
])
def test_hostile_history_is_refused_with_the_reason(text, reason):
    with pytest.raises(RemoteDataError, match=reason):
        hp.parse_history(text)


def test_an_oversized_history_is_refused_before_decoding():
    with pytest.raises(RemoteDataError, match="more than"):
        hp.parse_history('[{"revision": 1, "status": "' + "x" * hp.MAX_HISTORY_CHARS + '"}]')


@pytest.mark.parametrize("text, expected", [
    ("2026-12-04T01:00:00Z", datetime(2026, 12, 4, 1, tzinfo=timezone.utc)),
    ("2026-12-04T03:00:00.5+02:00", datetime(2026, 12, 4, 1, 0, 0, 500000, tzinfo=timezone.utc)),
    ("2026-12-04T01:00:00.123456789Z", datetime(2026, 12, 4, 1, 0, 0, 123456, tzinfo=timezone.utc)),
    ("2026-02-31T01:00:00Z", None), ("2026-12-04 01:00:00", None), ("", None), ("9" * 10_000, None),
])
def test_times_as_go_writes_them(text, expected):
    assert hp.parse_time(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20))
def test_any_json_gives_revisions_or_the_reason(value):
    try:
        revisions = hp.parse_history(json.dumps(value))
    except RemoteDataError:
        return
    assert all(isinstance(r.number, int) and isinstance(r.status, str) for r in revisions)
    hp.recovery("r", revisions, NOW, SETTLE)  # decides without raising


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_any_time_text_parses_or_is_none(text):
    parsed = hp.parse_time(text)
    assert parsed is None or parsed.tzinfo is not None
