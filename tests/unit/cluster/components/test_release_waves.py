"""Helm releases are installed in waves: the CNI charts one after the other, then every other
release at once (bootstrap.cluster.apply)."""


def test_releases_install_in_waves_the_cni_first_then_the_rest_at_once():
    from bootstrap.cluster.apply import release_waves
    from bootstrap.cluster.components.release import Release

    def release(name):
        return Release(name, "ns", name, "https://charts.example.com", "1.0.0", {})

    names = ["multus-crd", "multus", "gpu-operator", "rdma-shared-device-plugin", "volcano"]
    waves = release_waves([release(n) for n in names])
    assert [[r.name for r in wave] for wave in waves] == [
        ["multus-crd"], ["multus"], ["gpu-operator", "rdma-shared-device-plugin", "volcano"]]
    assert [[r.name for r in w] for w in release_waves([release("volcano")])] == [["volcano"]]
    assert release_waves([]) == []
