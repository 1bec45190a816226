"""bootstrap.cluster.helm: exact command lines and values-file handling against a recording stand-in,
and real `helm template` runs (when a helm binary is at hand) proving the flags and the
values files we write parse the way we mean them."""

import copy
import http.server
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from test_components import chart_defaults, mixed
from upstream import UPSTREAM

from bootstrap.cluster import helm
from bootstrap.cluster.components import Release, desired_releases
from bootstrap.errors import run_command
from bootstrap.progress import Console, Reporter
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them
from repo_paths import TESTS

RELEASES = ["multus-crd", "multus", "csi-driver-nfs", "gpu-operator", "volcano"]  # the mixed scenario's
RECORDER = TESTS / "standins" / "helm_recorder.py"
RELEASE = Release("gpu-operator", "gpu-operator", "gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "v26.7.0",
                  {"driver": {"enabled": False}, "toolkit": {"env": [{"name": "A", "value": "true"}]},
                   "devicePlugin": {"config": {"data": {"ts-4": "version: v1\n"}}}})


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    """The stand-in as $BOOTSTRAP_HELM; returns a function reading what it recorded."""
    program = tmp_path / "bin" / "helm"
    program.parent.mkdir()
    shutil.copy(RECORDER, program)  # a copy, so the checkout's file mode does not matter
    program.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("BOOTSTRAP_HELM", str(program))
    monkeypatch.setenv("HELM_RECORD", str(record))
    for name in ("HELM_RECORDER_FAIL", "HELM_RECORDER_VERSION", "HELM_RECORDER_SLEEP"):
        monkeypatch.delenv(name, raising=False)

    def calls():
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    calls.program = str(program)
    return calls


def test_upgrade_install_command_line(recorder, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    helm.upgrade_install(RELEASE, kubeconfig, timeout=900)
    [call] = recorder()
    values_file = call["values_file"]
    assert call["argv"] == ["upgrade", "--install", "gpu-operator", "gpu-operator",
                            "--repo", "https://helm.ngc.nvidia.com/nvidia", "--version", "v26.7.0",
                            "--namespace", "gpu-operator", "--create-namespace",
                            "--values", values_file, "--wait", "--timeout", "900s",
                            "--kubeconfig", str(kubeconfig)]
    assert call["values_mode"] == "0o600" and call["values_dir_mode"] == "0o700"
    assert yaml.safe_load(call["values_text"]) == RELEASE.values  # the file is YAML (JSON is YAML)
    assert not Path(values_file).exists() and not Path(values_file).parent.exists()


def test_helm_error_carries_helms_own_words(recorder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HELM_RECORDER_FAIL", 'UPGRADE FAILED: context deadline exceeded')
    with pytest.raises(helm.HelmError) as caught:
        helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60)
    message = caught.value.message
    assert "gpu-operator (gpu-operator v26.7.0) failed" in message
    assert "Error: UPGRADE FAILED: context deadline exceeded" in message
    assert "helm status gpu-operator -n gpu-operator" in caught.value.hint
    assert not Path(recorder()[0]["values_file"]).exists()  # removed on failure too

    def command(_args, _console):
        helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60)

    assert run_command(command, None, Console(Reporter(io.StringIO()))) == 1  # one clear block, exit 1
    err = capsys.readouterr().err
    assert err.startswith("error: helm upgrade --install gpu-operator") and "Traceback" not in err


@pytest.mark.parametrize("reported, expected", [("v3.8.0+gd141386", (3, 8, 0)), ("v3.14.4+g81c902a", (3, 14, 4)),
                                                ("v4.1.4+g05fa379", (4, 1, 4))])
def test_supported_helm_versions(recorder, monkeypatch, reported, expected):
    monkeypatch.setenv("HELM_RECORDER_VERSION", reported)
    assert helm.check_version() == expected
    assert recorder()[0]["argv"] == ["version", "--short"]


def test_old_helm_is_refused(recorder, monkeypatch):
    monkeypatch.setenv("HELM_RECORDER_VERSION", "v3.7.2+g663a896")
    with pytest.raises(helm.HelmError, match="Helm 3.7.2 is too old; 3.8 or newer is needed"):
        helm.check_version()


def test_unreadable_version(recorder, monkeypatch):
    monkeypatch.setenv("HELM_RECORDER_VERSION", "garbage")
    with pytest.raises(helm.HelmError, match="cannot read Helm's version"):
        helm.check_version()


def test_missing_helm(monkeypatch, tmp_path):
    monkeypatch.setenv("BOOTSTRAP_HELM", str(tmp_path / "no-such-helm"))
    with pytest.raises(helm.HelmError, match="helm was not found at") as caught:
        helm.check_version()
    assert "BOOTSTRAP_HELM" in caught.value.hint
    monkeypatch.delenv("BOOTSTRAP_HELM")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    with pytest.raises(helm.HelmError, match="helm was not found on PATH"):
        helm.check_version()


def test_hung_helm_is_stopped(recorder, monkeypatch):
    monkeypatch.setenv("HELM_RECORDER_SLEEP", "5")
    monkeypatch.setattr(helm, "VERSION_TIMEOUT_S", 0.5)
    with pytest.raises(helm.HelmError, match="did not finish within"):
        helm.check_version()


def test_unchanged_releases_are_skipped():
    inv, facts = mixed()
    releases = desired_releases(inv, facts, gpu_nodes(inv, facts))
    applied = {r.name: r.digest() for r in releases}
    assert helm.releases_to_apply(releases, applied) == []
    assert helm.releases_to_apply(releases, {}) == releases
    changed = Release(**{**releases[-1].__dict__, "values": {"basic": {"image_pull_policy": "Always"}}})
    assert helm.releases_to_apply(releases[:-1] + [changed], applied) == [changed]
    stale = {**applied, releases[0].name: "0" * 64}
    assert helm.releases_to_apply(releases, stale) == [releases[0]]


# --- real helm ----------------------------------------------------------------------------

def real_helm() -> str | None:
    for candidate in (shutil.which("helm"), Path(sys.executable).parent / "helm"):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def chart_repo(tmp_path_factory):
    """A chart repository on 127.0.0.1 serving one chart per release we make, each with the
    upstream chart's default values.yaml and a template that prints the merged .Values."""
    binary = real_helm()
    if binary is None:
        pytest.skip("no helm binary (install Helm, or put it next to the venv's python)")
    helm.check_version(binary)
    root = tmp_path_factory.mktemp("helm")
    env = {**os.environ, **{f"HELM_{k}_HOME": str(root / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    repo = root / "repo"
    repo.mkdir()
    inv, facts = mixed()
    releases = desired_releases(inv, facts, gpu_nodes(inv, facts))
    for release in releases:
        chart = root / "src" / release.chart
        (chart / "templates").mkdir(parents=True)
        (chart / "Chart.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "v2", "name": release.chart, "version": release.version}))
        defaults = chart_defaults(release.chart) if UPSTREAM.exists() and release.chart != "rke2-multus-crd" else {}
        (chart / "values.yaml").write_text(yaml.safe_dump(defaults))
        (chart / "templates" / "values.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
            "  namespace: {{ .Release.Namespace }}\ndata:\n  values.json: {{ toJson .Values | quote }}\n")
        subprocess.run([binary, "package", str(chart), "-d", str(repo)], check=True, env=env, capture_output=True)

    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(repo))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    subprocess.run([binary, "repo", "index", str(repo), "--url", url], check=True, env=env, capture_output=True)
    yield binary, url, env, releases, root
    server.shutdown()


def deep_merge(base: dict, override: dict) -> dict:
    """Helm's rule for a values file over the chart's defaults: maps merge, the rest replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_real_helm_accepts_our_flags_and_values_files(chart_repo):
    binary, url, env, releases, root = chart_repo
    assert [r.name for r in releases] == RELEASES  # the loop below checks each of them
    for release in releases:
        release = Release(release.name, release.namespace, release.chart, url, release.version, release.values)
        folder = root / f"values-{release.name}"
        folder.mkdir()
        values_file = helm.write_values(folder, release.values)
        argv = helm.upgrade_install_argv(binary, release, values_file, root / "kubeconfig", 300)
        assert argv[1:3] == ["upgrade", "--install"]
        # `helm template` takes the same flags as `upgrade --install` and needs no cluster.
        result = subprocess.run([binary, "template"] + argv[3:], env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{release.name}: {result.stderr}"
        [rendered] = [d for d in yaml.safe_load_all(result.stdout) if d]
        assert rendered["metadata"] == {"name": release.name, "namespace": release.namespace}
        defaults = yaml.safe_load((root / "src" / release.chart / "values.yaml").read_text()) or {}
        assert json.loads(rendered["data"]["values.json"]) == deep_merge(defaults, release.values), release.name


def test_real_helm_version_is_read(chart_repo):
    binary = chart_repo[0]
    version = helm.check_version(binary)
    assert version >= (3, 8, 0)
    assert stat.S_IMODE(os.stat(binary).st_mode) & 0o111


@pytest.mark.parametrize("version, skips_openapi", [((3, 14, 4), False), ((4, 1, 4), True)])
def test_a_release_never_applied_is_installed_without_the_history_read(recorder, tmp_path, version, skips_openapi):
    """`helm install`, not `upgrade --install` (whose history read costs two requests through
    the tunnel); Helm 4's server-side apply has the API server validate the objects, so its own
    OpenAPI check is left out there, Helm 3 keeps it."""
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, new_with=version)
    (call,) = recorder()
    assert call["argv"][:3] == ["install", "gpu-operator", "gpu-operator"]
    assert ("--disable-openapi-validation" in call["argv"]) is skips_openapi
    assert "--create-namespace" in call["argv"] and "--wait" in call["argv"]


def test_a_release_helm_has_after_all_is_upgraded(recorder, tmp_path):
    """The tool's record says never applied, Helm says the name is in use (a record lost, a
    release someone else installed): it is upgraded, as before."""
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, new_with=(4, 1, 4))
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, new_with=(4, 1, 4))
    assert [c["argv"][:3] for c in recorder()] == [["install", "gpu-operator", "gpu-operator"],
                                                   ["install", "gpu-operator", "gpu-operator"],
                                                   ["upgrade", "--install", "gpu-operator"]]


def test_a_failed_install_is_said_as_the_install_it_was(recorder, tmp_path, monkeypatch):
    monkeypatch.setenv("HELM_RECORDER_FAIL", "INSTALLATION FAILED: context deadline exceeded")
    with pytest.raises(helm.HelmError) as caught:
        helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, new_with=(4, 1, 4))
    assert caught.value.message.startswith("helm install gpu-operator (gpu-operator v26.7.0) failed")
    assert [c["argv"][0] for c in recorder()] == ["install"]  # a failure that is not "name in use": no retry


# --- a release a killed Helm left pending -------------------------------------------------

def left_pending(tmp_path, *statuses, age_s=3600):
    """The recorder's history of RELEASE, as `helm history -o json` prints it."""
    stamp = (datetime.now(timezone.utc) - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    folder = tmp_path / "record.jsonl.history"
    folder.mkdir(exist_ok=True)
    (folder / "gpu-operator.json").write_text(json.dumps(
        [{"revision": i + 1, "updated": stamp, "status": s, "chart": "gpu-operator-v26.7.0"}
         for i, s in enumerate(statuses)]))


def verbs(recorder):
    return [c["argv"][0] if c["argv"][0] != "upgrade" else "upgrade --install" for c in recorder()]


def test_a_never_deployed_pending_install_is_uninstalled_and_installed_again(recorder, tmp_path):
    left_pending(tmp_path, "pending-install")
    said = []
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, new_with=(3, 14, 4), say=said.append)
    assert verbs(recorder) == ["install", "upgrade --install", "history", "uninstall", "upgrade --install"]
    history, uninstall = recorder()[2]["argv"], recorder()[3]["argv"]
    assert history[:6] == ["history", "gpu-operator", "--max", "16", "--output", "json"]
    assert uninstall[:2] == ["uninstall", "gpu-operator"] and "--wait" in uninstall
    assert uninstall[uninstall.index("--namespace") + 1] == "gpu-operator"
    assert said == ["  release gpu-operator was left pending-install at revision 1 (a Helm stopped before it "
                    "finished); it was never deployed, so it is uninstalled and installed again"]


def test_a_pending_upgrade_is_rolled_back_then_upgraded(recorder, tmp_path):
    left_pending(tmp_path, "superseded", "deployed", "pending-upgrade")
    said = []
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, version=(4, 1, 4), say=said.append)
    assert verbs(recorder) == ["upgrade --install", "history", "rollback", "upgrade --install"]
    assert recorder()[2]["argv"][:3] == ["rollback", "gpu-operator", "2"]
    assert "rolled back to revision 2" in said[0]


@pytest.mark.parametrize("statuses, age_s, says", [
    (("deployed", "pending-rollback"), 3600, "no recovery that loses nothing"),
    (("superseded", "failed", "pending-upgrade"), 3600, "no recovery that loses nothing"),
    (("deployed", "pending-upgrade"), 30, "a Helm may still be running it"),
])
def test_a_pending_release_that_cannot_be_recovered_safely_is_refused(recorder, tmp_path, statuses, age_s, says):
    left_pending(tmp_path, *statuses, age_s=age_s)
    with pytest.raises(helm.HelmError) as caught:
        helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, version=(3, 14, 4))
    assert says in caught.value.message and "helm rollback gpu-operator" in caught.value.hint
    assert verbs(recorder) == ["upgrade --install", "history"]  # nothing uninstalled, nothing rolled back


def test_a_hostile_history_is_a_clear_helm_error(recorder, tmp_path):
    left_pending(tmp_path, "pending-install")
    (tmp_path / "record.jsonl.history" / "gpu-operator.json").write_text("[" * 10_000)
    with pytest.raises(helm.HelmError, match="nests deeper"):
        helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, version=(3, 14, 4))
    assert "uninstall" not in verbs(recorder)


@pytest.mark.parametrize("version, skips_openapi", [((3, 14, 4), True), ((4, 1, 4), False)])
def test_the_gpu_operator_upgrade_skips_helm3s_openapi_check_for_its_crd_hook(recorder, tmp_path, version,
                                                                              skips_openapi):
    """operator.upgradeCRD (true by default) "requires --disable-openapi-validation flag to be
    passed during helm upgrade" (values.yaml v26.7.0): Helm 3 checks against the old CRDs
    before the pre-upgrade hook replaces them. Other charts keep the check."""
    inv, facts = mixed()
    operator = next(r for r in desired_releases(inv, facts, gpu_nodes(inv, facts)) if r.name == "gpu-operator")
    assert operator.upgrades_own_crds
    if UPSTREAM.exists():
        values = yaml.safe_load((UPSTREAM / "gpu-operator" / "v26.7.0" / "values.yaml").read_text())
        assert values["operator"]["upgradeCRD"] is True and "upgradeCRD" not in operator.values.get("operator", {})
    helm.upgrade_install(operator, tmp_path / "kubeconfig", timeout=60, version=version)
    helm.upgrade_install(RELEASE, tmp_path / "kubeconfig", timeout=60, version=version)  # not upgrades_own_crds
    first, second = recorder()
    assert ("--disable-openapi-validation" in first["argv"]) is skips_openapi
    assert "--disable-openapi-validation" not in second["argv"]


def test_helms_version_is_asked_when_the_caller_did_not_say(recorder, tmp_path):
    operator = Release(**{**RELEASE.__dict__, "upgrades_own_crds": True})
    helm.upgrade_install(operator, tmp_path / "kubeconfig", timeout=60)  # the recorder says v3.14.4
    version, upgrade = recorder()
    assert version["argv"] == ["version", "--short"] and "--disable-openapi-validation" in upgrade["argv"]


def test_helm_output_that_is_not_utf8_is_a_message_not_a_traceback(monkeypatch, tmp_path):
    # Helm quotes cluster text in its errors; a strict decode raised UnicodeDecodeError.
    program = tmp_path / "helm"
    program.write_text("#!/bin/sh\nprintf 'Error: hook said \\377\\376 \\033[2J\\n' >&2\nexit 1\n")
    program.chmod(0o755)
    monkeypatch.setenv("BOOTSTRAP_HELM", str(program))
    with pytest.raises(helm.HelmError, match="failed: Error: hook said \ufffd\ufffd"):
        helm.check_version()


def test_a_never_deployed_pending_longhorn_is_refused_with_its_confirmation_flag(recorder, tmp_path):
    # Longhorn's uninstall hook refuses without deleting-confirmation-flag: the tool's uninstall
    # would fail and its hint would name the same failing command.
    longhorn = replace(RELEASE, name="longhorn", namespace="longhorn-system", chart="longhorn")
    folder = tmp_path / "record.jsonl.history"
    folder.mkdir()
    stamp = (datetime.now(timezone.utc) - timedelta(seconds=3600)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    (folder / "longhorn.json").write_text(json.dumps([{"revision": 1, "updated": stamp, "status": "pending-install",
                                                        "chart": "longhorn-1.12.1"}]))
    with pytest.raises(helm.HelmError) as caught:
        helm.upgrade_install(longhorn, tmp_path / "kubeconfig", timeout=60, version=(3, 14, 4))
    assert "never deployed" in caught.value.message and "not uninstalled by the tool" in caught.value.message
    assert "deleting-confirmation-flag" in caught.value.hint and "helm uninstall longhorn" in caught.value.hint
    assert "uninstall" not in verbs(recorder)
