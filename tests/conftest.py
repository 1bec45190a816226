import pytest

import testhosts


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
    from standins.airgap import build_airgap, upstream_missing

    why = upstream_missing()
    if why:
        pytest.skip(why)
    return build_airgap(tmp_path / "airgap")
