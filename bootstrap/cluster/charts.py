"""Chart archives from the inventory (`charts: {<component>: {version, archive}}`): each
must be the chart the component installs, at the version pinned, before anything is
changed. Read from the `helm package` output itself: NAME/Chart.yaml inside the .tgz."""

from __future__ import annotations

import tarfile

import yaml

from bootstrap.cluster.components import versions
from bootstrap.errors import UsageError
from bootstrap.inventory.model import Component

MAX_CHART_YAML = 1 << 20


def chart_metadata(path: str) -> dict:
    """NAME/Chart.yaml of a chart archive; raises UsageError when it is not one."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                parts = member.name.split("/")
                if len(parts) == 2 and parts[1] == "Chart.yaml" and member.isfile() and member.size <= MAX_CHART_YAML:
                    data = yaml.safe_load(archive.extractfile(member).read()) or {}
                    if isinstance(data, dict):
                        return data
    except FileNotFoundError:
        raise UsageError(f"no chart archive at {path}", "build it with `helm package CHART_DIR`, or fix the path") from None
    except (OSError, tarfile.TarError, yaml.YAMLError) as exc:
        raise UsageError(f"{path} is not a chart archive ({exc})", "give the .tgz that `helm package` wrote") from None
    raise UsageError(f"{path} holds no NAME/Chart.yaml: not a chart archive", "give the .tgz that `helm package` wrote")


def archives_wanted(inventory) -> list[tuple[str, str, str, str]]:
    """(field, archive path, chart, version) for every chart the inventory takes from an
    archive, the CRD chart that ships beside rke2-multus included."""
    wanted = []
    for component in sorted(inventory.charts):
        src = versions.source(inventory, component)
        if not src.archive:
            continue
        wanted.append((f"charts.{component}.archive", src.archive, src.chart, src.version))
        crd = versions.multus_crd_source(src) if component == Component.MULTUS else None
        if crd is not None:
            wanted.append((f"charts.{component}.archive (its CRD chart beside it)", crd.archive, crd.chart,
                           crd.version))
    return wanted


def check_archives(inventory) -> None:
    """Before anything changes: each archive is the component's chart at the pinned version."""
    for field, path, chart, version in archives_wanted(inventory):
        try:
            meta = chart_metadata(path)
        except UsageError as exc:
            raise UsageError(f"{inventory.source}: {field}: {exc.message}", exc.hint) from None
        name, found = str(meta.get("name", "")), str(meta.get("version", ""))
        if (name, found) != (chart, version):
            raise UsageError(f"{inventory.source}: {field}: {path} is chart {name} version {found}, "
                             f"not {chart} version {version}",
                             f"point it at {chart}-{version}.tgz (`helm package` output), or pin version: {found}")
