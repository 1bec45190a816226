"""Charts from local archives (`charts: {<component>: {version, archive}}`) and from an
oci:// mirror, with the real Helm: `helm package` builds the archives the tests use, and
`helm template` takes the chart arguments the tool passes to `helm upgrade --install`."""

import shutil
import subprocess

import pytest
import yaml

from bootstrap.cluster import helm
from bootstrap.cluster.charts import check_archives
from bootstrap.cluster.components import desired_releases
from bootstrap.errors import InvalidInput, UsageError
from bootstrap.inventory.loader import load_inventory
from bootstrap.cluster.components.release import Release
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them

HELM = shutil.which("helm")
needs_helm = pytest.mark.skipif(HELM is None, reason="the real helm is not on PATH (CI installs it)")


def package(folder, name, version):
    """A minimal chart with the real component's name, packaged as `helm package` does."""
    chart = folder / "src" / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": name, "version": version}))
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Release.Name }}-marker}\n"
        "data: {chart: {{ .Chart.Name }}, version: {{ .Chart.Version }}}\n")
    subprocess.run([HELM, "package", str(chart), "-d", str(folder)], check=True, capture_output=True)
    return folder / f"{name}-{version}.tgz"


def inventory(tmp_path, charts):
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({"cluster": "a", "nodes": [{"name": "cp", "address": "10.0.0.1", "role": "server"}],
                                    "volcano": {"enabled": True}, "charts": charts}))
    return load_inventory(path)


@needs_helm
def test_a_local_archive_is_what_helm_installs(tmp_path):
    archive = package(tmp_path / "charts", "volcano", "1.15.1")
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "archive": "charts/volcano-1.15.1.tgz"}})
    check_archives(inv)
    release = next(r for r in desired_releases(inv, {}, gpu_nodes(inv, {})) if r.name == "volcano")
    assert release.archive == str(archive)  # relative to the inventory file
    argv = helm.upgrade_install_argv("helm", release, "values.yaml", "kubeconfig", 60)
    assert str(archive) in argv and "--repo" not in argv
    rendered = subprocess.run([HELM, "template", release.name, *helm.chart_argv(release)],
                              check=True, capture_output=True, text=True).stdout
    assert "volcano-marker" in rendered and "version: 1.15.1" in rendered
    # Where the chart comes from is not a change to the cluster: same digest as from the repo.
    assert release.digest() == Release(release.name, release.namespace, release.chart, "https://x", release.version,
                                       release.values).digest()


@needs_helm
def test_an_archive_of_another_chart_or_version_is_refused_with_the_fix(tmp_path):
    package(tmp_path / "charts", "volcano", "1.14.0")
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "archive": "charts/volcano-1.14.0.tgz"}})
    with pytest.raises(UsageError, match="is chart volcano version 1.14.0, not volcano version 1.15.1") as caught:
        check_archives(inv)
    assert "charts.volcano.archive" in caught.value.message and "version: 1.14.0" in caught.value.hint
    package(tmp_path / "other", "longhorn", "1.15.1")
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "archive": "other/longhorn-1.15.1.tgz"}})
    with pytest.raises(UsageError, match="is chart longhorn"):
        check_archives(inv)
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "archive": "missing/volcano-1.15.1.tgz"}})
    with pytest.raises(UsageError, match="no chart archive at"):
        check_archives(inv)
    (tmp_path / "junk.tgz").write_bytes(b"not gzip")
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "archive": "junk.tgz"}})
    with pytest.raises(UsageError, match="is not a chart archive"):
        check_archives(inv)


@needs_helm
def test_multus_from_an_archive_needs_its_crd_chart_beside_it(tmp_path):
    package(tmp_path / "charts", "rke2-multus", "v4.3.017")
    inv = inventory(tmp_path, {"multus": {"version": "v4.3.017", "archive": "charts/rke2-multus-v4.3.017.tgz"}})
    with pytest.raises(UsageError, match="its CRD chart beside it.*no chart archive at .*rke2-multus-crd-4.3.017.tgz"):
        check_archives(inv)
    package(tmp_path / "charts", "rke2-multus-crd", "4.3.017")
    check_archives(inv)


def test_an_oci_mirror_names_the_chart_under_the_registry(tmp_path):
    inv = inventory(tmp_path, {"volcano": {"version": "1.15.1", "repo": "oci://registry.lab:5000/charts/"}})
    release = next(r for r in desired_releases(inv, {}, gpu_nodes(inv, {})) if r.name == "volcano")
    assert helm.chart_argv(release) == ["oci://registry.lab:5000/charts/volcano", "--version", "1.15.1"]


def test_archive_and_repo_together_are_refused(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("cluster: a\nnodes: [{name: cp, address: 10.0.0.1, role: server}]\n"
                    "charts:\n  volcano: {version: 1.15.1, archive: v.tgz, repo: 'oci://r.lab/c'}\n")
    with pytest.raises(InvalidInput) as caught:
        load_inventory(path)
    assert "an archive or a repository, not both" in caught.value.render()
    assert f"{path}:4:" in caught.value.render()  # the line of the volcano entry
