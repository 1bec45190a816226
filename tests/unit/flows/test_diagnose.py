"""`bootstrap diagnose`: redaction (by known value and by key name), the host script and how
its answer is cut, the summary (NotReady nodes, failing pods, crash-looping units, GPU health
errors, hosts that did not answer, an API that did not answer), and the flow end to end with
a fake hosts session and a fake API: one .tar.gz, 0600, summary.txt first, no secret in it."""

import base64
import contextlib
import io
import json
import os
import stat
import tarfile
from types import SimpleNamespace

import pytest
from test_gpu_health_flow import XID79, probe_output

from bootstrap import diagnosis as d
from bootstrap.cli import build_parser
from bootstrap.cluster.client import ClusterError
from bootstrap.flows import diagnose as flow
from bootstrap.inventory.loader import load_inventory
from bootstrap.redaction import Redactor, kubeconfig_secrets
from bootstrap.state.folder import StateDir
from fakes import FakeSession

TOKEN = "K10" + "ab" * 32 + "::server:Sup3rJoinSecret"
AGENT_TOKEN = "agent-Tok3n-7f1e2d"
REGISTRY_PASSWORD = "Regi5try-Pa55word"
S3_SECRET = "s3SecretKey-9c8b7a"
S3_ACCESS = "AKIAEXAMPLE12345"
CLIENT_KEY = base64.b64encode(b"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkeyMaterialThatIsSecret0123456789\n"
                              b"-----END EC PRIVATE KEY-----\n").decode()
CLIENT_CERT = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIBcertificateBodyForTheClient0123456789\n"
                               b"-----END CERTIFICATE-----\n").decode()
SECRETS = [TOKEN, "Sup3rJoinSecret", AGENT_TOKEN, REGISTRY_PASSWORD, S3_SECRET, S3_ACCESS, CLIENT_KEY, CLIENT_CERT,
           "MHcCAQEEIBkeyMaterialThatIsSecret0123456789"]


# --- redaction ---------------------------------------------------------------------------

def test_known_values_go_in_every_form_they_are_written_in():
    redactor = Redactor()
    redactor.add(TOKEN, "join token")
    redactor.add(CLIENT_KEY, "kubeconfig client-key-data")
    text = (f"journal: joining with {TOKEN}\nthe password alone: Sup3rJoinSecret\n"
            f"base64: {base64.b64encode(TOKEN.encode()).decode()}\ndata: {CLIENT_KEY}\n"
            "key body: MHcCAQEEIBkeyMaterialThatIsSecret0123456789\n")
    out = redactor.apply(text)
    for secret in (TOKEN, "Sup3rJoinSecret", CLIENT_KEY, "MHcCAQEEIBkeyMaterialThatIsSecret0123456789"):
        assert secret not in out
    assert "<redacted:join token>" in out and "journal: joining with" in out


def test_values_under_secret_key_names_go_even_when_unknown():
    text = "\n".join([
        "token: some-token-the-tool-never-saw",
        "agent-token: another-one",
        "etcd-s3-secret-key: unknownS3",
        "etcd-s3-access-key: unknownAK",
        "server: https://10.0.0.1:6443",
        "configs:",
        "  registry.example.com:",
        "    auth:",
        "      username: bot",
        "      password: hunter2hunter2",
        '  "client-key-data": "LS0tLS1CRUdJTi",',
        '        password = "tomlpass"',
        '        auth = "Ym90Omh1bnRlcjI="',
        "ExecStart=/usr/local/bin/k3s agent --token=flagtoken --server https://x",
        "K3S_TOKEN=envtoken",
        "-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA", "-----END RSA PRIVATE KEY-----",
        "K10" + "cd" * 32 + "::node:inlinepass in a log line",
    ])
    out = Redactor().apply(text)
    for secret in ("some-token-the-tool-never-saw", "another-one", "unknownS3", "unknownAK", "hunter2hunter2",
                   "LS0tLS1CRUdJTi", "tomlpass", "Ym90Omh1bnRlcjI=", "flagtoken", "envtoken", "MIIEowIBAAKCAQEA",
                   "inlinepass"):
        assert secret not in out, secret
    # What is not a secret stays, so the bundle still says something.
    for kept in ("server: https://10.0.0.1:6443", "    auth:", "username: bot", "--server https://x"):
        assert kept in out


def test_kubeconfig_credentials_are_found_and_the_ca_is_kept():
    config = {"clusters": [{"cluster": {"certificate-authority-data": "Q0E="}}],
              "users": [{"name": "u", "user": {"client-key-data": CLIENT_KEY, "client-certificate-data": CLIENT_CERT}}]}
    assert sorted(kubeconfig_secrets(config)) == sorted([(CLIENT_KEY, "kubeconfig client-key-data"),
                                                         (CLIENT_CERT, "kubeconfig client-certificate-data")])
    assert kubeconfig_secrets("not a kubeconfig") == [] and kubeconfig_secrets({"users": "x"}) == []


# --- host script and sections ------------------------------------------------------------

def test_the_host_answer_is_cut_only_at_the_boundary_and_only_into_asked_sections():
    boundary = "0" * 32
    script = d.host_script(boundary, "echo facts")
    assert all(f"{boundary} {name}" in script or name in script for name in d.HOST_SECTIONS)
    with pytest.raises(ValueError):
        d.host_script("not hex; rm -rf /", "x")
    output = (f"\n{boundary} k3s-unit\nId=k3s.service\n"
              f"\n{boundary} ../../etc/passwd\nplanted\n"
              f"\n{boundary} memory\n" + "m" * (d.SECTION_BYTES_CAP["memory"] + 10) +
              f"\n{boundary} k3s-unit\nsecond copy\n").encode()
    sections = d.split_sections(output, boundary)
    assert set(sections) == {"k3s-unit", "memory"}
    assert sections["k3s-unit"].startswith(b"Id=k3s.service")
    assert b"cut at" in sections["memory"] and len(sections["memory"]) < d.SECTION_BYTES_CAP["memory"] + 100


def test_member_names_are_the_tools_own():
    assert d.host_member("gpu-1", "config.yaml") == "hosts/gpu-1/config.yaml"
    assert d.host_member("gpu-1", "facts") == "hosts/gpu-1/facts.json"
    name = d.pod_member(3, "kube-system", "../../x\x1b[2J")
    assert name.startswith("cluster/pods/003-kube-system_") and ".." not in name and "\x1b" not in name


# --- summary -----------------------------------------------------------------------------

def test_units_that_fail_or_loop_are_named():
    text = ("Id=k3s.service\nLoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\n"
            "NRestarts=14\n\nId=k3s-agent.service\nLoadState=not-found\nActiveState=inactive\n")
    problems = d.unit_problems(d.parse_units(text))
    assert problems == ["k3s.service is activating/auto-restart (result exit-code, 14 restarts)"]
    looping = d.parse_units("Id=k3s.service\nLoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=5\n")
    assert d.unit_problems(looping) == ["k3s.service restarted 5 times (crash loop?); now active/running"]


def test_the_summary_names_what_looks_wrong_printably():
    not_ready = {"metadata": {"name": "gpu-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting"},
        {"type": "DiskPressure", "status": "True", "reason": "KubeletHasDiskPressure"}]}}
    crashing = {"metadata": {"namespace": "gpu-operator", "name": "plugin-x"}, "status": {
        "phase": "Running", "containerStatuses": [{"name": "plugin", "ready": False, "restartCount": 7,
                                                   "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    fine = {"metadata": {"namespace": "a", "name": "b"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "c", "ready": True, "restartCount": 0, "state": {"running": {}}}]}}
    assert d.pod_failing(crashing) and not d.pod_failing(fine)
    assert not d.pod_failing({"status": {"phase": "Succeeded"}}) and d.pod_failing({"status": {"phase": "Pending"}})
    findings = d.Findings("lab", "now", "1.0", hosts_total=3, unreachable={"gpu-2": "timed out\x1b[31m"},
                          problems=d.node_problems(not_ready) + [d.pod_problem(crashing)]
                          + [d.release_problem({"name": "v", "namespace": "n", "status": "failed", "chart": "v-1"})])
    lines = d.summary(findings)
    text = "\n".join(lines)
    assert "hosts: 2 of 3 answered" in text and "API: answered" in text
    assert "host gpu-2: did not answer" in text and "\x1b" not in text
    assert "node gpu-1: NotReady (NodeStatusUnknown: Kubelet stopped posting)" in text
    assert "node gpu-1: DiskPressure" in text
    assert "pod gpu-operator/plugin-x: Running (plugin: CrashLoopBackOff, 7 restarts)" in text
    assert "helm release n/v: failed (v-1)" in text
    assert d.release_problem({"status": "deployed"}) is None
    calm = d.summary(d.Findings("lab", "now", "1.0", hosts_total=1, api="no server answers"))
    assert "nothing looks wrong" in calm and "API: no answer (no server answers): host half only" in calm


# --- the flow ----------------------------------------------------------------------------

class FakeApi:
    """What request() calls: paths answered from a dict, logs as text."""

    def __init__(self, answers: dict):
        self.answers, self.asked = answers, []

    def call_api(self, path, method, query_params=(), **_):
        self.asked.append((path, dict(query_params)))
        body = self.answers.get(path)
        if body is None:  # an answer is read as it streams (urllib3's read1), as the client's is
            return io.BytesIO(b'{"message": "not found"}'), 404
        data = body if isinstance(body, str) else json.dumps(body)
        return io.BytesIO(data.encode()), 200


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.setenv("REG_PW", REGISTRY_PASSWORD)
    monkeypatch.setenv("S3_SK", S3_SECRET)
    monkeypatch.setenv("S3_AK", S3_ACCESS)
    source = tmp_path / "inv.yaml"
    source.write_text(
        "cluster: diag\nstate_dir: state\nssh: {user: ubuntu, sudo: true}\n"
        "k3s:\n  snapshots: {s3: {bucket: k3s-snapshots, access_key_env: S3_AK, secret_key_env: S3_SK}}\n"
        "registries:\n  auth: {registry.example.com: {username: bot, password_env: REG_PW}}\n"
        "nodes:\n  - {name: cp-1, address: 10.0.0.1, role: server}\n"
        "  - {name: gpu-1, address: 10.0.0.2}\n  - {name: gpu-2, address: 10.0.0.3}\n")
    inventory = load_inventory(str(source))
    state = StateDir(inventory)
    state.ensure()
    (state.path / "token").write_text(TOKEN + "\n")
    (state.path / "agent-token").write_text(AGENT_TOKEN + "\n")
    (state.path / "kubeconfig").write_text(json.dumps({"users": [{"name": "u", "user": {
        "client-key-data": CLIENT_KEY, "client-certificate-data": CLIENT_CERT}}]}))
    (state.path / "logs").mkdir(mode=0o700)
    (state.path / "logs" / "20260101-000000-up.log").write_text(f"joined with {AGENT_TOKEN}\n")
    return inventory, state


def host_answer(node, script: str) -> bytes:
    """Each host's answer, leaking every secret it could hold, as a real host's files would."""
    boundary = script.split("printf '\\n%s %s\\n' ", 1)[1].split(" ", 1)[0]
    unit = ("Id=k3s-agent.service\nLoadState=loaded\nActiveState=activating\nSubState=auto-restart\n"
            "Result=exit-code\nNRestarts=9\n") if node.name == "gpu-1" else \
        "Id=k3s.service\nLoadState=loaded\nActiveState=active\nSubState=running\nNRestarts=0\n"
    sections = {
        "k3s-unit": unit,
        "k3s-journal": f"level=info msg=\"joining\" token={TOKEN}\nagent {AGENT_TOKEN}\n",
        "config.yaml": f"token: {TOKEN}\nagent-token: {AGENT_TOKEN}\netcd-s3-secret-key: {S3_SECRET}\n"
                       f"etcd-s3-access-key: {S3_ACCESS}\nnode-ip: 10.0.0.2\n",
        "registries.yaml": f"configs:\n  registry.example.com:\n    auth:\n      username: bot\n"
                           f"      password: {REGISTRY_PASSWORD}\n",
        "containerd-config.toml": f'[plugins.cri.registry.configs."r".auth]\n  password = "{REGISTRY_PASSWORD}"\n',
        "nvidia-smi-q": "==============NVSMI LOG==============\n",
        "network": "1: lo: <LOOPBACK>\n", "disk": "/dev/sda1 100G\n", "memory": "Mem: 1000\n",
        "xid": "",
    }
    out = "".join(f"\n{boundary} {name}\n{text}" for name, text in sections.items())
    facts = "\n".join(probe_output("remap-pending", XID79)) if node.name == "gpu-1" else "\n".join(probe_output())
    return (out + f"\n{boundary} facts\n{facts}\n").encode()


def run_diagnose(inventory, state, *, unreachable=(), api=None):
    session = FakeSession(inventory, {}, unreachable=unreachable)

    @contextlib.contextmanager
    def open_session(inv, nodes, command, console):
        yield session

    @contextlib.contextmanager
    def connect(inv, st):
        if api is None:
            raise ClusterError("no server answers over SSH: cp-1: timed out")
        yield SimpleNamespace(api_client=api, kubeconfig="/nonexistent")

    releases = [{"name": "volcano", "namespace": "volcano-system", "status": "failed", "chart": "volcano-1.15.1"},
                {"name": "multus", "namespace": "kube-system", "status": "deployed", "chart": "rke2-multus"}]
    return flow.diagnose(inventory, state, SimpleNamespace(), open_session=open_session, connect=connect,
                         read_host=lambda s, inv, node, script: host_answer(node, script),
                         list_releases=lambda kubeconfig: releases)


def members_of(path) -> dict[str, str]:
    with tarfile.open(path) as archive:
        assert all(m.isfile() and m.mode == 0o600 for m in archive.getmembers())
        return {m.name: archive.extractfile(m).read().decode() for m in archive.getmembers()}


API = {
    "/api/v1/nodes": {"items": [
        {"metadata": {"name": "cp-1"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "gpu-1"}, "status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "PLEG is not healthy"}]}}]},
    "/api/v1/events": {"items": [{"type": "Warning", "reason": "BackOff", "message": "Back-off restarting",
                                  "involvedObject": {"kind": "Pod", "namespace": "gpu-operator", "name": "plugin-x",
                                                     "uid": "u1"}, "lastTimestamp": "2026-12-03T09:00:00Z"}]},
    "/api/v1/pods": {"items": [
        {"metadata": {"namespace": "gpu-operator", "name": "plugin-x", "uid": "u1", "managedFields": [{"x": 1}]},
         "spec": {"containers": [{"name": "plugin"}]},
         "status": {"phase": "Running", "containerStatuses": [
             {"name": "plugin", "ready": False, "restartCount": 6, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
        {"metadata": {"namespace": "a", "name": "pending-1"}, "spec": {"containers": [{"name": "c"}]},
         "status": {"phase": "Pending", "message": f"pulling with password {REGISTRY_PASSWORD} failed"}},
        {"metadata": {"namespace": "a", "name": "fine"}, "spec": {"containers": [{"name": "c"}]},
         "status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": True, "state": {"running": {}}}]}}]},
    "/api/v1/namespaces/gpu-operator/pods/plugin-x/log": f"plugin failed, registry password {REGISTRY_PASSWORD}\n",
}


def test_the_bundle_has_both_halves_a_summary_first_and_no_secret(lab):
    inventory, state = lab
    api = FakeApi(API)
    path, summary = run_diagnose(inventory, state, api=api)
    assert path.parent == state.path and flow.BUNDLE_NAME.fullmatch(path.name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    members = members_of(path)
    names = list(members)
    assert names[0] == "diagnose/summary.txt"
    for node in ("cp-1", "gpu-1", "gpu-2"):
        for section in ("k3s-unit.txt", "k3s-journal.txt", "config.yaml", "registries.yaml", "containerd-config.toml",
                        "nvidia-smi-q.txt", "xid.txt", "network.txt", "disk.txt", "memory.txt", "facts.json"):
            assert f"diagnose/hosts/{node}/{section}" in members
    for member in ("cluster/nodes.json", "cluster/events.txt", "cluster/pods.txt", "cluster/helm-releases.json",
                   "inventory.yaml", "logs/20260101-000000-up.log"):
        assert f"diagnose/{member}" in members
    (described,) = [n for n in names if n.startswith("diagnose/cluster/pods/") and "plugin-x" in n]
    assert "plugin failed" in members[described] and "Back-off restarting" in members[described]
    assert "managedFields" not in members[described]
    text = members["diagnose/summary.txt"]
    assert text.splitlines() == summary
    assert "gpu-1: k3s-agent.service is activating/auto-restart (result exit-code, 9 restarts)" in text
    assert "node gpu-1: NotReady (KubeletNotReady: PLEG is not healthy)" in text
    assert "pod gpu-operator/plugin-x: Running (plugin: CrashLoopBackOff, 6 restarts)" in text
    assert "helm release volcano-system/volcano: failed" in text and "multus" not in text
    assert "gpu-1: GPU health:" in text and "cp-1: GPU health" not in text
    assert "pod a/pending-1: Pending (pulling with password <redacted" in text  # printed as written
    for name, content in [*members.items(), ("the printed summary", "\n".join(summary))]:
        for secret in SECRETS:
            assert secret not in content, (name, secret)
    assert "etcd-s3-secret-key: <redacted" in members["diagnose/hosts/gpu-1/config.yaml"]
    assert "node-ip: 10.0.0.2" in members["diagnose/hosts/gpu-1/config.yaml"]


def test_with_the_api_down_and_a_host_down_the_host_half_is_written_and_both_are_named(lab):
    inventory, state = lab
    path, summary = run_diagnose(inventory, state, unreachable=["gpu-2"])
    members = members_of(path)
    text = "\n".join(summary)
    assert "hosts: 2 of 3 answered" in text and "host gpu-2: did not answer (gpu-2: no SSH answer)" in text
    assert "API: no answer (no server answers over SSH: cp-1: timed out): host half only" in text
    assert "diagnose/hosts/cp-1/k3s-journal.txt" in members and not any("/gpu-2/" in n for n in members)
    assert not any(n.startswith("diagnose/cluster/") for n in members)


def test_a_host_whose_probe_fails_is_named_and_the_others_are_kept(lab):
    from bootstrap.remote_data import RemoteDataError

    inventory, state = lab

    def read_host(session, inv, node, script):
        if node.name == "cp-1":
            raise RemoteDataError("the diagnose probe is 99999999 bytes, more than the tool accepts")
        return host_answer(node, script)

    session = FakeSession(inventory, {})
    findings = d.Findings("diag", "now", "1", hosts_total=3)
    members, facts = flow.collect_hosts(session, inventory, read_host, findings)
    assert "cp-1" in findings.unreachable and "more than the tool accepts" in findings.unreachable["cp-1"]
    assert set(facts) == {"gpu-1", "gpu-2"} and not any("/cp-1/" in n for n in members)


def test_the_command_is_registered_and_takes_the_inventory():
    args = build_parser().parse_args(["diagnose", "inv.yaml"])
    assert args.command == "diagnose" and args.inventory == "inv.yaml"
