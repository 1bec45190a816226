"""k3s's upgrade rules: no downgrade, no skipped minor, the intermediate versions named."""

from bootstrap.checks.k3s_versions import parse, upgrade_problem


def test_versions_order_like_k3s_releases():
    assert parse("v1.33.5+k3s1") < parse("v1.33.5+k3s2") < parse("v1.33.6+k3s1") < parse("v1.34.0+k3s1")
    assert parse("v1.34.0-rc1+k3s1") < parse("v1.34.0+k3s1")
    assert parse("v1.33.5+k3s1").line == "v1.33"
    assert parse("1.33") is None and parse(None) is None


def test_patch_and_next_minor_upgrades_are_allowed():
    assert upgrade_problem("v1.32.9+k3s1", "v1.32.10+k3s1") is None
    assert upgrade_problem("v1.32.9+k3s1", "v1.33.5+k3s1") is None
    assert upgrade_problem("v1.33.5+k3s1", "v1.33.5+k3s1") is None


def test_a_downgrade_is_refused():
    message, fix = upgrade_problem("v1.33.5+k3s1", "v1.33.4+k3s1")
    assert "cannot be downgraded" in message and "v1.33.5+k3s1 or newer" in fix
    assert upgrade_problem("v1.33.5+k3s2", "v1.33.5+k3s1") is not None


def test_a_skipped_minor_is_refused_naming_each_intermediate_line():
    message, fix = upgrade_problem("v1.31.4+k3s1", "v1.34.1+k3s1")
    assert "cannot skip minor versions" in message
    assert "newest v1.32.x release, then the newest v1.33.x release" in fix and fix.endswith("then v1.34.1+k3s1")
