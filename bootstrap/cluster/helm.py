"""Helm, run as a subprocess (Helm 3.8+ and Helm 4 take the same flags we use).

Values travel in a file, never on the command line: they can hold site details, and
`--set` would re-type strings like "true". The file is 0600 in a private temporary
folder and is removed when Helm exits, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from bootstrap.cluster.components.release import Release
from bootstrap.cluster.helm_pending import (HISTORY_MAX, PENDING_ERROR, REFUSE, UNINSTALL, Recovery, parse_history,
                                            recovery)
from bootstrap.errors import BootstrapError
from bootstrap.remote_data import RemoteDataError

HELM_ENV = "BOOTSTRAP_HELM"
MIN_VERSION = (3, 8, 0)  # the oldest Helm this tool supports (OCI registries GA, current flag set)
VERSION_TIMEOUT_S = 30
EXIT_MARGIN_S = 60  # Helm enforces --timeout itself; this only catches a hung process


class HelmError(BootstrapError):
    """Helm is missing, too old, or a command failed; the message carries Helm's own words."""


def helm_binary() -> str:
    configured = os.environ.get(HELM_ENV)
    if configured:
        return configured
    found = shutil.which("helm")
    if not found:
        raise HelmError("helm was not found on PATH",
                        f"install Helm 3.8 or newer (https://helm.sh/docs/intro/install/), or set {HELM_ENV} "
                        "to its path")
    return found


def _run(argv: list[str], timeout: float, text: bool = True) -> subprocess.CompletedProcess:
    """`text=False` for output that is cluster text, which remote_data decodes (never assumed UTF-8).
    As text, bytes that are not UTF-8 are replaced: Helm quotes the cluster's own words in its
    errors (a release's notes, a hook's log), which a strict decode would turn into a traceback."""
    decoding = {"encoding": "utf-8", "errors": "replace"} if text else {}
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, **decoding)
    except FileNotFoundError:
        raise HelmError(f"helm was not found at {argv[0]}",
                        f"install Helm 3.8 or newer, or point {HELM_ENV} at it") from None
    except PermissionError:
        raise HelmError(f"{argv[0]} cannot be run (permission denied)",
                        f"check {HELM_ENV} or the file's mode") from None
    except subprocess.TimeoutExpired:
        raise HelmError(f"{' '.join(argv[:3])} did not finish within {int(timeout)}s") from None


def _helm_said(result: subprocess.CompletedProcess) -> str:
    text = (result.stderr or "").strip() or (result.stdout or "").strip()
    return text or f"exit status {result.returncode}, no output"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`v3.14.2+g3fc9f4b` or `v4.1.4+g05fa379` -> (3, 14, 2) / (4, 1, 4)."""
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(p) for p in match.groups()) if match else None  # type: ignore[return-value]


def check_version(helm: str | None = None) -> tuple[int, int, int]:
    helm = helm or helm_binary()
    result = _run([helm, "version", "--short"], VERSION_TIMEOUT_S)
    if result.returncode != 0:
        raise HelmError(f"`{helm} version --short` failed: {_helm_said(result)}")
    version = parse_version(result.stdout)
    if version is None:
        raise HelmError(f"cannot read Helm's version from {result.stdout.strip()!r}")
    if version < MIN_VERSION:
        raise HelmError(f"Helm {'.'.join(map(str, version))} is too old; 3.8 or newer is needed",
                        f"upgrade Helm, or set {HELM_ENV} to a newer one")
    return version


def chart_argv(release: Release) -> list[str]:
    """Where Helm takes the chart from: a local archive, an oci:// registry (the chart's
    reference is REGISTRY/NAME), or a chart repository."""
    if release.archive:
        return [release.archive, "--version", release.version]
    if release.repo.startswith("oci://"):
        return [f"{release.repo.rstrip('/')}/{release.chart}", "--version", release.version]
    return [release.chart, "--repo", release.repo, "--version", release.version]


def upgrade_install_argv(helm: str, release: Release, values_file: str | Path, kubeconfig_path: str | Path,
                         timeout_s: int, version: tuple[int, int, int] | None = None) -> list[str]:
    """`version`: Helm's; a chart that upgrades its own CRDs in a pre-upgrade hook has Helm 3's
    OpenAPI check left out (it runs before the hook, against the old CRDs, and refuses the
    new fields: gpu-operator values.yaml v26.7.0, operator.upgradeCRD). Helm 4 has the API
    server validate at apply time, after the hook (install_argv), so it keeps its default."""
    skip = ["--disable-openapi-validation"] if release.upgrades_own_crds and version and version < (4, 0, 0) else []
    return [helm, "upgrade", "--install", release.name, *_rest_argv(release, values_file, kubeconfig_path, timeout_s),
            *skip]


def install_argv(helm: str, release: Release, values_file: str | Path, kubeconfig_path: str | Path,
                 timeout_s: int, version: tuple[int, int, int]) -> list[str]:
    """A release Helm should not have yet: `helm install`, without the history read that
    `upgrade --install` makes first (a version and a Secret list: two requests through the
    tunnel). Helm 4 installs with server-side apply, whose fieldValidation=Strict has the API
    server check every object against its schema (helm/helm pkg/kube/client.go,
    ClientUpdateOptionFieldValidationDirective), so Helm's own check against the OpenAPI
    documents, five requests more, is left out there; Helm 3 applies client-side and keeps it."""
    skip = ["--disable-openapi-validation"] if version >= (4, 0, 0) else []
    return [helm, "install", release.name, *_rest_argv(release, values_file, kubeconfig_path, timeout_s), *skip]


def _rest_argv(release: Release, values_file: str | Path, kubeconfig_path: str | Path, timeout_s: int) -> list[str]:
    return [*chart_argv(release), "--namespace", release.namespace, "--create-namespace",
            "--values", str(values_file), "--wait", "--timeout", f"{int(timeout_s)}s",
            "--kubeconfig", str(kubeconfig_path)]


# What `helm install` says of a release name it already has (helm/helm pkg/action/install.go,
# availableName): Helm 3 "cannot re-use a name that is still in use", Helm 4.1 "release name
# check failed: cannot reuse a name that is still in use". Then the release is upgraded after all.
NAME_IN_USE = re.compile(r"cannot re-?use a name that is still in use")


def write_values(folder: Path, values: dict) -> Path:
    path = folder / "values.yaml"
    # JSON is YAML; it keeps every string a string ("true", "0755") without quoting rules.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle, indent=2, sort_keys=True)
    return path


def upgrade_install(release: Release, kubeconfig_path: str | Path, timeout: int = 600, *,
                    helm: str | None = None, new_with: tuple[int, int, int] | None = None,
                    version: tuple[int, int, int] | None = None, say=None) -> None:
    """`helm upgrade --install` one release and wait for it; raises HelmError with Helm's stderr.
    `new_with`: the release was never applied by the tool (its record says so), and this is
    Helm's version: `helm install` then (install_argv), and `upgrade --install` only when Helm
    has the release after all (a record lost, a release someone else installed). `version`:
    Helm's, for the upgrade's flags. A release a killed Helm left pending is recovered when
    that loses nothing (recover_pending, which `say`s what it does) and tried once more."""
    helm = helm or helm_binary()
    version = version or new_with or (check_version(helm) if release.upgrades_own_crds else None)
    with tempfile.TemporaryDirectory(prefix="bootstrap-helm-") as folder:  # mode 0700
        values_file = write_values(Path(folder), release.values)
        upgrade = upgrade_install_argv(helm, release, values_file, kubeconfig_path, timeout, version)
        result, how = None, "install"
        if new_with is not None:
            result = _run(install_argv(helm, release, values_file, kubeconfig_path, timeout, new_with),
                          timeout + EXIT_MARGIN_S)
        if result is None or result.returncode != 0 and NAME_IN_USE.search(result.stderr or ""):
            result, how = _run(upgrade, timeout + EXIT_MARGIN_S), "upgrade --install"
        if result.returncode != 0 and PENDING_ERROR.search(result.stderr or ""):
            recover_pending(helm, release, kubeconfig_path, timeout, say or (lambda _line: None))
            result, how = _run(upgrade, timeout + EXIT_MARGIN_S), "upgrade --install"
    if result.returncode != 0:
        raise HelmError(f"helm {how} {release.name} ({release.chart} {release.version}) failed:\n"
                        f"{_helm_said(result)}",
                        f"re-run to retry; inspect with `helm status {release.name} -n {release.namespace}`")


def _ns_argv(release: Release, kubeconfig_path: str | Path) -> list[str]:
    return ["--namespace", release.namespace, "--kubeconfig", str(kubeconfig_path)]


def recover_pending(helm: str, release: Release, kubeconfig_path: str | Path, timeout: int, say) -> None:
    """Helm refused the release as held by another operation: read its history and, where
    that loses nothing (helm_pending.recovery), uninstall a never-deployed pending install or
    roll a pending upgrade back to its deployed revision; else HelmError with the command."""
    where = _ns_argv(release, kubeconfig_path)
    result = _run([helm, "history", release.name, "--max", str(HISTORY_MAX), "--output", "json", *where],
                  VERSION_TIMEOUT_S + EXIT_MARGIN_S, text=False)
    look = f"inspect it with `helm history {release.name} -n {release.namespace}`"
    if result.returncode != 0:
        said = (result.stderr or b"")[-4096:].decode("utf-8", "replace").strip() or f"exit status {result.returncode}"
        raise HelmError(f"helm history {release.name} failed:\n{said}", look)
    try:
        history = parse_history(result.stdout)
    except RemoteDataError as exc:
        raise HelmError(f"helm history {release.name}: {exc}", look) from None
    found = recovery(release.name, history, datetime.now(timezone.utc), timeout + EXIT_MARGIN_S)
    if found is None or found.action == REFUSE:
        raise HelmError(found.said if found else f"helm says another operation holds release {release.name}, "
                        "but its history shows none pending", _pending_hint(release, found))
    if found.action == UNINSTALL and release.chart == "longhorn":
        # Longhorn's pre-delete hook refuses unless its deleting-confirmation-flag setting is
        # true (longhorn/charts values.yaml defaultSettings.deletingConfirmationFlag): the tool
        # does not set that flag for anyone, since it is what keeps volumes from an uninstall.
        raise HelmError(f"{found.said}; Longhorn is not uninstalled by the tool (its uninstall hook "
                        "needs the deleting-confirmation-flag setting, which guards its volumes)",
                        f"if nothing is stored on it: `kubectl -n {release.namespace} patch settings.longhorn.io "
                        "deleting-confirmation-flag --type merge -p '{\"value\":\"true\"}'`, then "
                        f"`helm uninstall {release.name} -n {release.namespace}`, then re-run")
    say(f"  {found.said}")
    wait = ["--wait", "--timeout", f"{int(timeout)}s"]
    argv = ([helm, "uninstall", release.name, *wait, *where] if found.action == UNINSTALL else
            [helm, "rollback", release.name, str(found.to_revision), *wait, *where])
    done = _run(argv, timeout + EXIT_MARGIN_S)
    if done.returncode != 0:
        raise HelmError(f"helm {found.action} {release.name} failed:\n{_helm_said(done)}", _pending_hint(release, found))


def _pending_hint(release: Release, found: Recovery | None) -> str:
    name, ns = release.name, release.namespace
    if found is not None and found.wait_s:
        return (f"re-run in {found.wait_s}s; if no Helm is working on it, `helm rollback {name} -n {ns}` (to the "
                f"deployed revision) or, never deployed, `helm uninstall {name} -n {ns}`, then re-run")
    return (f"see `helm history {name} -n {ns}`; `helm rollback {name} REVISION -n {ns}` to a deployed revision, "
            f"or `helm uninstall {name} -n {ns}` (which removes what it runs), then re-run")


APPLIED, PENDING, NOT_INSTALLED = "applied", "changes pending", "not installed"


def release_state(release: Release, applied_digests: dict[str, str]) -> str:
    """Where a release stands against the digests recorded when releases were last applied:
    the one answer `up`, `plan` and `status` all read."""
    if release.name not in applied_digests:
        return NOT_INSTALLED
    return APPLIED if applied_digests[release.name] == release.digest() else PENDING


def releases_to_apply(releases: list[Release], applied_digests: dict[str, str]) -> list[Release]:
    """The releases whose digest differs from the one recorded when last applied (or that
    were never applied), in the given order."""
    return [r for r in releases if release_state(r, applied_digests) != APPLIED]
