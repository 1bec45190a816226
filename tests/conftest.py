import pytest

import testhosts
import upstream


def pytest_sessionstart(session):
    """Without the upstream reference data dozens of tests could only skip: stop instead,
    with one message, unless BOOTSTRAP_ALLOW_MISSING_UPSTREAM=1 asks for the skips."""
    why = upstream.why_missing()
    if why and not upstream.missing_allowed():
        raise pytest.UsageError(why)


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

    upstream.upstream(upstream.FLAGS_NAME)  # skips only under BOOTSTRAP_ALLOW_MISSING_UPSTREAM=1
    return build_airgap(tmp_path / "airgap")
