import pytest

import testhosts
import upstream


def pytest_sessionstart(session):
    """Where CI requires the upstream reference data (BOOTSTRAP_REQUIRE_UPSTREAM=1), its absence
    stops the run with one line instead of skipping dozens of tests."""
    why = upstream.why_missing()
    if why and upstream.required():
        raise pytest.UsageError(why)


def pytest_report_header(config):
    return f"upstream reference data: {upstream.why_missing() or upstream.UPSTREAM}"


def pytest_collection_modifyitems(config, items):
    why = testhosts.requirements_missing()
    if why:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "hosts" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def lab():
    """A testhosts.Lab; every host it started is removed at teardown, pass or fail."""
    lab = testhosts.Lab()
    try:
        yield lab
    finally:
        lab.cleanup()


@pytest.fixture
def airgap(tmp_path):
    """A k3s air-gap folder holding the k3s stand-in, as a user's folder holds k3s."""
    from standins.airgap import build_airgap

    return build_airgap(tmp_path / "airgap")
