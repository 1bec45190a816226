"""Small charts with the real components' names and versions, built with the real Helm
(`helm package`), for host tests that run the real Helm against the stand-in API: the
inventory's `charts: {<component>: {version, archive}}` points at them, as an air-gapped
user's inventory points at the charts they copied in.

Each chart holds a ConfigMap (named <release>-lab-chart, its values in it, so a test can
see what Helm applied) and a Deployment (so `helm --wait` has a workload to wait for).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from bootstrap.cluster.components import versions

TEMPLATE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-lab-chart
data:
  chart: {{ .Chart.Name }}-{{ .Chart.Version }}
  values.json: {{ toJson .Values | quote }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-lab
spec:
  replicas: 1
  selector:
    matchLabels: {app: {{ .Release.Name }}-lab}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-lab}
    spec:
      containers:
      - name: main
        image: registry.lab.invalid/{{ .Chart.Name }}:{{ .Chart.Version }}
"""


def helm() -> str:
    found = shutil.which("helm")
    if not found:
        raise RuntimeError("the real helm is not on PATH (.ci/run installs it)")
    return found


def package(folder: Path, chart: str, version: str) -> Path:
    """`helm package` of a lab chart NAME at VERSION into `folder`; the .tgz path (kept when
    it is there: the lab's chart folder is shared by every test and `testhosts.py up`)."""
    target = folder / f"{chart}-{version}.tgz"
    if target.exists():
        return target
    source = folder / "src" / f"{chart}-{version}" / chart
    (source / "templates").mkdir(parents=True, exist_ok=True)
    (source / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": chart, "version": version}))
    (source / "templates" / "lab.yaml").write_text(TEMPLATE)
    done = subprocess.run([helm(), "package", str(source), "-d", str(folder)], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"helm package {chart}: {done.stderr}")
    return folder / f"{chart}-{version}.tgz"


def lab_charts(folder: Path) -> dict:
    """The inventory's `charts:` section: every component that installs a chart, at the
    version the tool installs by default, from a lab chart archive (rke2-multus's CRD chart
    beside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    charts = {}
    for component, source in versions.DEFAULTS.items():
        if source.chart is None:
            continue
        archive = package(folder, source.chart, source.version)
        charts[str(component)] = {"version": source.version, "archive": str(archive)}
        crd = versions.multus_crd_source(source) if source.chart == "rke2-multus" else None
        if crd is not None:
            package(folder, crd.chart, crd.version)
    return charts


def helm_json(kubeconfig: Path, *argv: str):
    """A real Helm query (`status`, `get values`, `history`, `list`) as parsed JSON."""
    done = subprocess.run([helm(), *argv, "-o", "json", "--kubeconfig", str(kubeconfig)], capture_output=True,
                          text=True, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(argv)}: {done.stderr}")
    return json.loads(done.stdout)


def user_manifest(namespace: str, mode: str = "one") -> str:
    """What a user applies with `kubectl apply -f`: a ConfigMap `settings` (data mode: MODE)
    and a short Pod `hello`."""
    return yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": namespace},
         "data": {"mode": mode}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": namespace},
         "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36",
                                                            "command": ["sleep", "1"]}]}}])
