"""Remote data cannot stop other hosts: every parser of what a host (or the cluster) returns
gives data or that host's failure with its reason, whatever the host sends.

Property-based (hypothesis): probe output built from the real recordings
(tests/fixtures/gpu-vm-h200, the golden manifest) and mutated with hostile pieces (random
bytes, terminal escapes, wrong JSON types, nulls, 10 000-deep nesting, multi-MB input), each
parser asserted to return its data or raise exactly RemoteDataError. Then the flows: with one
hostile host, `down` and `up` still build and run every other host's script, and the hostile
one fails with the reason."""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from fakes import FakeSession
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_facts_parsers import h200_probe_output, recorded, section

from bootstrap import progress, remote_data
from bootstrap.cluster import client
from bootstrap.errors import BootstrapError, HostsFailed
from bootstrap.host.facts import gpu_health
from bootstrap.host.facts.host_facts import HostFacts, K3sInstall, SystemdUnit
from bootstrap.host.facts.probe import SECTIONS, parse_host_facts, split_sections
from bootstrap.host.facts.render import render_host
from bootstrap.flows.host_phase import UpOptions, bring_up
from bootstrap.flows.uninstall import tear_down
from bootstrap.host.parts import manifest
from bootstrap.host.plan.all_hosts import make_plans
from bootstrap.host.plan.join_tokens import SERVER_TOKEN_FILE, JoinTokens
from bootstrap.inventory.loader import load_inventory
from bootstrap.remote_data import RemoteDataError
from bootstrap.checks.ownership import ownership
from bootstrap.state.folder import StateDir, new_cluster_id
from bootstrap.host.teardown import teardown_script
from repo_paths import TESTS

FIXTURES = TESTS / "fixtures"
GOLDEN_MANIFEST = json.loads((FIXTURES / "golden" / "teardown-manifest.json").read_text())
OUR_ID = GOLDEN_MANIFEST["cluster_id"]
H200_XML = recorded("nvidia-smi-q-x.txt")[1]
XID_LINES = [*(FIXTURES / "gpu-vm-h200-variants" / "dmesg-xid79.txt").read_text().splitlines(),
             *(FIXTURES / "gpu-vm-h200-variants" / "dmesg-xid-mig.txt").read_text().splitlines()]
HOSTILE_MANIFEST = '{"cluster_id": null, "files": [{}]}'
FAST = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- what a hostile host sends ------------------------------------------------------------------

ESCAPES = ["\x1b]52;c;aGVsbG8=\x07", "\x1b[2J\x1b[H", "\x1b\\", "\r", "\x00", "\u202e", "\ufeff", "\udcff"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(ESCAPES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)


def deep(depth: int, opener: str = "[") -> str:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return '{"a":' * depth + "1" + closer * depth
    return opener * depth + closer * depth


# Multi-MB and 10k-deep inputs are built from a size, so hypothesis keeps them cheap to draw.
huge = st.integers(min_value=1, max_value=6).map(lambda mib: "x" * (mib * 1024 * 1024))
nested = st.sampled_from(["[", "{"]).flatmap(lambda o: st.integers(10_000, 20_000).map(lambda d: deep(d, o)))
hostile_text = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.lists(st.sampled_from(ESCAPES), max_size=8).map("".join),
    json_values.map(json.dumps),
    nested,
    huge,
)
hostile_bytes = st.one_of(st.binary(max_size=400), hostile_text.map(lambda t: t.encode("utf-8", "surrogatepass")))


@st.composite
def mutated_manifests(draw) -> dict:
    """The golden manifest with keys replaced, removed or added: wrong types, nulls, escapes."""
    data = dict(GOLDEN_MANIFEST)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from([*GOLDEN_MANIFEST, "extra"]))
        if draw(st.booleans()):
            data.pop(key, None)
        else:
            data[key] = draw(json_values)
    return data


def assert_refused_or_data(call, *args, **kwargs):
    """`call` returns (its data) or raises RemoteDataError: nothing else escapes."""
    try:
        return call(*args, **kwargs)
    except RemoteDataError as exc:
        assert str(exc)
        return None


# --- the strict reader --------------------------------------------------------------------------


@FAST
@given(hostile_text | hostile_bytes)
def test_loads_returns_json_or_refuses(data):
    assert_refused_or_data(remote_data.loads, data, what="test data")


def test_deep_nesting_is_refused_before_the_decoder_recurses():
    for text in (deep(10_000), deep(10_000, "{"), "[" * 100_000, '["\\"[[[[' + "]" * 3 + '"]'):
        try:
            remote_data.loads(text, what="x")
        except RemoteDataError as exc:
            assert "deeper" in str(exc) or "not valid JSON" in str(exc)
    assert remote_data.json_depth('["[[[[", {"a": "]]]{"}]') == 2  # brackets in strings do not count
    assert remote_data.loads('{"a": [1, {"b": null}]}', what="x") == {"a": [1, {"b": None}]}


def nesting(value) -> int:
    """How deep `value` nests, as json's decoder recurses into it."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


# Strings full of what the scan must see through: brackets, quotes and backslashes.
tricky_text = st.text(alphabet='[]{}"\\\\/u0:, ab', max_size=12)
tricky_json = st.recursive(
    st.none() | st.integers() | tricky_text | st.sampled_from(ESCAPES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=20)


@FAST
@given(tricky_json, st.booleans())
def test_the_depth_scan_agrees_with_json_on_valid_json(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert remote_data.json_depth(text) == nesting(json.loads(text))


@pytest.mark.parametrize("shape", ['"\\', '"', '\\"', '["\\', '"\\\\', '[', '{"a":"\\', '"\\u'])
def test_the_depth_scan_is_linear_whatever_the_text(shape):
    """256 KiB (the manifest's cap) of a shape that made the scan quadratic (`"\\` repeated:
    each opening quote scanned to the end, 26 s for 64 KiB) is read in well under a second."""
    text = shape * (256 * 1024 // len(shape))
    started = time.process_time()
    remote_data.json_depth(text)
    assert time.process_time() - started < 1.0


def test_size_and_constants_are_refused():
    with pytest.raises(RemoteDataError, match="more than"):
        remote_data.loads(b"[" + b"1," * 600_000 + b"1]", what="x")
    with pytest.raises(RemoteDataError, match="not valid JSON"):
        remote_data.loads("[NaN]", what="x")
    assert remote_data.loads(b'"\xff"', what="x") == "\ufffd"  # invalid UTF-8: replaced, not fatal


# --- the host manifest --------------------------------------------------------------------------


@FAST
@given(st.one_of(mutated_manifests(), json_values))
def test_manifest_read_and_teardown_give_data_or_the_hosts_failure(value):
    record = assert_refused_or_data(manifest.read, value)
    script = assert_refused_or_data(teardown_script, value, purge_drivers=False)
    assert (record is None) == (script is None)
    if record is not None:
        assert isinstance(script, str) and script.endswith("exit 0\n")
        assert not any(c in script for c in "\x1b\x00\r\u202e")
        verdict = ownership(HostFacts(manifest=value), OUR_ID).verdict
        assert verdict in ("ours", "foreign", "empty")
        if record.get(manifest.ID_KEY) != OUR_ID and manifest.ID_KEY in record:
            assert verdict == "foreign"
    elif value is not None:  # None: no manifest at all
        assert ownership(HostFacts(manifest=value), OUR_ID).verdict == "unknown"


@FAST
@given(st.one_of(mutated_manifests().map(json.dumps), hostile_text, hostile_bytes))
def test_manifest_parse_gives_data_or_the_hosts_failure(text):
    assert_refused_or_data(manifest.parse, text)


def test_golden_manifest_reads_back_as_it_was_written():
    assert manifest.read(GOLDEN_MANIFEST) == GOLDEN_MANIFEST
    assert manifest.CLUSTER_ID.fullmatch(new_cluster_id())


@pytest.mark.parametrize("value, reason", [
    ({"cluster_id": None, "files": [{}]}, "cluster_id is null, not a string"),
    ({"cluster_id": OUR_ID, "files": [{}]}, r"files\[0\] is an object, not a string"),
    ({"cluster_id": OUR_ID, "files": ["relative/path"]}, r"files\[0\] is not of the form"),
    ({"cluster_id": OUR_ID, "files": ["/etc/../etc/passwd"]}, "not a normalised absolute path"),
    ({"cluster_id": OUR_ID, "packages_installed": ["x; reboot"]}, "packages_installed"),
    ({"cluster_id": OUR_ID, "sysctl_before": {"a=1 $(reboot)": "1"}}, "sysctl_before key"),
    ({"cluster_id": OUR_ID, "swap_disabled": "yes"}, "swap_disabled is a string"),
    ({"cluster_id": "\x1b[2J" + OUR_ID}, "cluster_id is not of the form"),
    ([], "is a list, not an object"),
])
def test_manifests_the_tool_never_writes_are_refused_with_the_reason(value, reason):
    with pytest.raises(RemoteDataError, match=reason):
        manifest.read(value)
    with pytest.raises(RemoteDataError, match=reason):
        teardown_script(value, purge_drivers=False)


def test_a_null_cluster_id_is_never_ours():
    facts = parse_host_facts(h200_probe_output() + section("manifest", HOSTILE_MANIFEST))
    assert facts.manifest == {} and "cluster_id is null" in facts.manifest_error
    assert "refused: /var/lib/bootstrap/manifest.json: cluster_id is null" in render_host("n", "a", facts)
    owner = ownership(facts, OUR_ID)
    assert owner.verdict == "unknown" and "cluster_id is null" in owner.reason
    # Built by hand (not through the probe) it is refused all the same.
    assert ownership(HostFacts(manifest={"cluster_id": None}), OUR_ID).verdict == "unknown"
    # A manifest from before ids existed (no key at all) is still adopted.
    assert ownership(HostFacts(manifest={"files": []}), OUR_ID).verdict == "ours"


# --- the whole probe output ---------------------------------------------------------------------

# Past 4300 digits int() raises; '١٢' and '1_000' are numbers to int() and float(); 'nan' and
# '1e999' are floats that are not JSON.
NUMBERS = st.sampled_from(["9" * 5000, "1" * 25, "\u0661\u0662", "1_000", "nan", "inf", "1e999", "-1", "0x10",
                           "\u00b2", "4294967296"])
BASE_OUTPUTS = [
    h200_probe_output(),
    h200_probe_output() + section("manifest", json.dumps(GOLDEN_MANIFEST, indent=1)),
    h200_probe_output() + section("nvidia-smi-xml", H200_XML) + section("xid", ["boot_id x", *XID_LINES]),
]


@st.composite
def hostile_probe_output(draw) -> list[str] | str | bytes:
    """A recorded probe output with sections added, replaced or cut, lines made hostile."""
    lines = list(draw(st.sampled_from(BASE_OUTPUTS)))
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(SECTIONS))
        body = draw(st.one_of(hostile_text, mutated_manifests().map(json.dumps)))
        at = draw(st.integers(0, len(lines)))
        lines[at:at] = section(name, body, draw(st.sampled_from([0, 1, 124, 127, 255])))
    if lines and draw(st.booleans()):
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = draw(hostile_text)
    numbered = [i for i, line in enumerate(lines) if re.search(r"[0-9]", line)]
    for _ in range(draw(st.integers(0, 12)) if numbered else 0):  # numbers no parser expects, where numbers were
        at = draw(st.sampled_from(numbered))
        number = draw(NUMBERS)
        lines[at] = re.sub(r"[0-9]+", lambda _: number, lines[at], count=draw(st.integers(0, 3)))
    form = draw(st.sampled_from(["lines", "text", "bytes"]))
    if form == "lines":
        return lines
    text = "\n".join(lines)
    if form == "text":
        return text
    data = text.encode("utf-8", "surrogatepass")
    return data + draw(st.binary(max_size=64))  # and bytes that are not UTF-8 at all


@FAST
@given(hostile_probe_output())
def test_parse_host_facts_always_gives_facts(output):
    facts = parse_host_facts(output)
    assert isinstance(facts, HostFacts)
    json.dumps(facts.to_dict(), allow_nan=False)  # strict JSON, as `facts --json` prints it
    assert isinstance(facts.manifest, dict)
    if facts.manifest_error:
        assert facts.manifest == {} and ownership(facts, OUR_ID).verdict == "unknown"
    else:
        manifest.read(facts.manifest)  # what was kept is a manifest the tool would write
    # The planners take the facts as they are: a script or that host's failure.
    assert_refused_or_data(teardown_script, facts.manifest, purge_drivers=True)
    assert isinstance(render_host("n", "10.0.0.1", facts), str)  # `bootstrap facts`


@FAST
@given(hostile_bytes | hostile_text)
def test_split_sections_takes_any_bytes(data):
    assert isinstance(split_sections(data), dict)


def test_probe_output_is_capped_and_decoded_on_the_tools_side():
    flood = b"\xff\xfe" * (20 * 1024 * 1024)
    facts = parse_host_facts(b"\n".join(l.encode() for l in h200_probe_output()) + b"\n" + flood)
    assert facts.gpus and facts.gpus[0].name == "NVIDIA H200"
    long_line = section("os-release", ["PRETTY_NAME=" + "A" * 1_000_000])
    assert len(parse_host_facts(long_line).os_pretty) <= 64 * 1024


# --- GPU health and the kernel log --------------------------------------------------------------


@FAST
@given(st.one_of(hostile_text, hostile_bytes.map(lambda b: b.decode("utf-8", "replace")),
                 st.lists(hostile_text, max_size=5).map(lambda extra: H200_XML + extra)))
def test_nvidia_smi_xml_and_the_kernel_log_give_data(text):
    assert isinstance(gpu_health.parse_nvsmi_xml(text), list)
    assert isinstance(gpu_health.gpu_health(text, text, text), list)
    events = gpu_health.parse_xid(text if isinstance(text, list) else [*XID_LINES, *text.splitlines()])
    assert all(isinstance(e, gpu_health.XidEvent) and e.text.isprintable() for e in events)
    assert all(e.gpu_instance is None or 0 <= e.gpu_instance <= 999 for e in events)
    assert isinstance(gpu_health.parse_nvlink_status(text), dict)
    assert isinstance(gpu_health.parse_topo_nvlinks(text), dict)


# --- JSON from the cluster ----------------------------------------------------------------------


@FAST
@given(hostile_text | hostile_bytes)
def test_cluster_api_bodies_give_data(body):
    parsed = client._parse(body)
    assert isinstance(parsed, dict)


def test_cluster_api_body_too_deep_is_a_message_not_a_recursion_error():
    assert "message" in client._parse(deep(50_000))
    assert client._parse(b'{"kind": "Node"}') == {"kind": "Node"}


# --- one hostile host, the others go on ---------------------------------------------------------

K3S = K3sInstall("/usr/local/bin/k3s", "v1.33.5+k3s1", True, [SystemdUnit("k3s.service", "loaded", "active")])


def three_hosts(tmp_path, extra: str = ""):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "t", "state_dir": "state", "nodes": [
        {"name": "cp", "address": "10.0.0.1", "role": "server"}, {"name": "a1", "address": "10.0.0.2"},
        {"name": "a2", "address": "10.0.0.3"}]}) + extra)
    inventory = load_inventory(path)
    return inventory, StateDir(inventory)


def hostile_host() -> HostFacts:
    return replace(parse_host_facts(h200_probe_output() + section("manifest", HOSTILE_MANIFEST)), k3s=K3S)


def test_down_removes_the_others_and_names_the_hostile_hosts_reason(tmp_path, capsys):
    inventory, state = three_hosts(tmp_path)
    state.write_secret("token", "secret\n")
    ours = {"cluster_id": state.cluster_id, "files": []}
    facts = {"cp": HostFacts(manifest=ours, k3s=K3S), "a1": hostile_host(), "a2": HostFacts(manifest=ours, k3s=K3S)}
    session = FakeSession(inventory, facts)
    with pytest.raises(HostsFailed, match="1 host failed: a1"):
        tear_down(inventory, state, progress.Console(progress.Reporter()), purge_drivers=False, force=False,
                  open_session=lambda *a: contextlib.nullcontext(session))
    assert session.executed == [("remove agent", "a2"), ("remove server", "cp")]
    assert "cluster_id is null" in session.failures["a1"].message
    assert "nothing was removed" in session.failures["a1"].message
    assert "FAILED a1: its /var/lib/bootstrap/manifest.json: cluster_id is null" in capsys.readouterr().err


def test_down_force_wipes_k3s_from_a_host_whose_manifest_cannot_be_read(tmp_path):
    inventory, state = three_hosts(tmp_path)
    ours = {"cluster_id": state.cluster_id, "files": []}
    facts = {"cp": HostFacts(manifest=ours, k3s=K3S), "a1": hostile_host(), "a2": HostFacts(manifest=ours, k3s=K3S)}
    session = FakeSession(inventory, facts)
    tear_down(inventory, state, progress.Console(progress.Reporter()), purge_drivers=False, force=True,
              open_session=lambda *a: contextlib.nullcontext(session))
    assert ("remove agent", "a1") in session.executed and not session.failures


def test_down_with_a_raw_manifest_fact_still_tears_the_others_down(tmp_path):
    # Facts not from the probe (as tests and other callers build them) holding the raw value.
    inventory, state = three_hosts(tmp_path)
    ours = {"cluster_id": state.cluster_id, "files": []}
    facts = {"cp": HostFacts(manifest=ours, k3s=K3S), "a1": HostFacts(manifest={"cluster_id": None, "files": [{}]}),
             "a2": HostFacts(manifest=ours, k3s=K3S)}
    session = FakeSession(inventory, facts)
    with pytest.raises(HostsFailed):
        tear_down(inventory, state, progress.Console(progress.Reporter()), purge_drivers=False, force=False,
                  open_session=lambda *a: contextlib.nullcontext(session))
    assert session.executed == [("remove agent", "a2"), ("remove server", "cp")]


def test_every_other_hosts_plan_is_built(tmp_path):
    from test_hostparts import airgap_inventory

    inventory = airgap_inventory(tmp_path)
    from bootstrap.host.release import k3s_artifacts

    artifacts = k3s_artifacts(inventory, {"amd64"})
    facts = {"cp-1": HostFacts(arch="amd64"), "gpu-1": HostFacts(arch="amd64", manifest={"cluster_id": None,
                                                                                         "files": [{}]})}
    plans = make_plans(inventory, facts, JoinTokens("tok", "agent-tok"), artifacts, OUR_ID)
    assert set(plans.plans) == {"cp-1"}
    assert "cluster_id is null" in plans.failures["gpu-1"]


class KubeconfigSession(FakeSession):
    def __init__(self, inventory, *args, **kwargs):
        super().__init__(inventory, *args, **kwargs)
        self.state = StateDir(inventory)

    def read_root_file(self, name, path):
        if path == SERVER_TOKEN_FILE:  # as k3s writes it once the first server started
            token = (self.state.path / "token").read_text().strip()
            return f"K10{'0' * 64}::server:{token}\n"
        return None  # the hosts' half only: no kubeconfig to read here


def three_hosts_to_bring_up(tmp_path):
    """Three hosts with an air-gap folder, and the facts of a healthy host without GPUs."""
    folder = tmp_path / "air"
    folder.mkdir()
    (folder / "k3s").write_bytes(b"k3s")
    (folder / "k3s-airgap-images-amd64.tar.zst").write_bytes(b"images")
    inventory, state = three_hosts(tmp_path, f"k3s: {{airgap: {folder}, version: v1.33.5+k3s1}}\n")
    healthy = replace(parse_host_facts(h200_probe_output()), init_process="systemd", has_systemd=True, gpus=[],
                      nvidia_pci=[])
    return inventory, state, healthy


def test_up_converges_the_others_and_names_the_hostile_hosts_reason(tmp_path, capsys):
    inventory, state, healthy = three_hosts_to_bring_up(tmp_path)
    facts = {"cp": replace(healthy, hostname="cp"), "a1": replace(hostile_host(), init_process="systemd",
                                                                   has_systemd=True, gpus=[], nvidia_pci=[],
                                                                   hostname="a1", k3s=None),
             "a2": replace(healthy, hostname="a2")}
    session = KubeconfigSession(inventory, facts)
    with pytest.raises(HostsFailed, match="a1"):
        bring_up(inventory, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter()),
                 open_session=lambda *a: contextlib.nullcontext(session))
    ran = {host for _, host in session.executed}
    assert {"cp", "a2"} <= ran and "a1" not in ran
    assert "cluster_id is null" in session.failures["a1"].message
    out = capsys.readouterr()
    assert "a1: owner: its /var/lib/bootstrap/manifest.json: cluster_id is null" in out.out


# --- the probe's output is read as bytes, on the tool's side ------------------------------------


class FakeChannel:
    """A paramiko channel that hands out `chunks` (None: a silent poll, socket.timeout)."""

    def __init__(self, chunks, status: int = 0):
        import threading

        self.chunks, self.closed, self.combined, self.command = list(chunks), False, False, None
        self.status, self.status_event = status, threading.Event()
        self.status_event.set()

    def recv_exit_status(self):
        return self.status

    def set_combine_stderr(self, combine):
        self.combined = combine

    def settimeout(self, seconds):
        pass

    def exec_command(self, command):
        self.command = command

    def shutdown_write(self):
        pass

    def recv(self, size):
        import socket

        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if chunk is None:
            self.chunks.insert(0, None)  # silent for ever
            raise socket.timeout()
        return chunk

    def close(self):
        self.closed = True


class FakeClient:
    def __init__(self, channel):
        self.channel = channel

    def get_transport(self):
        client = self

        class Transport:
            def is_active(self):
                return True

            def open_session(self, timeout=None):
                return client.channel

        return Transport()


def test_read_command_keeps_bytes_and_refuses_floods_and_silence():
    from bootstrap.remote.remote_output import read_command, sh_command

    channel = FakeChannel([b"ok \xff\x1b[2J", b"\n"])
    assert read_command(FakeClient(channel), sh_command("echo 'x'"), max_bytes=100, timeout=5, what="p") \
        == b"ok \xff\x1b[2J\n"
    assert channel.combined and channel.closed and channel.command == "sh -c 'echo '\"'\"'x'\"'\"''"
    flood = FakeChannel([b"x" * 65536] * 40)
    with pytest.raises(RemoteDataError, match="printed more than 1 MiB"):
        read_command(FakeClient(flood), "probe", max_bytes=1024 * 1024, timeout=5, what="p")
    assert flood.closed
    silent = FakeChannel([b"start", None])
    with pytest.raises(RemoteDataError, match="did not finish in 0 s"):
        read_command(FakeClient(silent), "probe", max_bytes=100, timeout=0, what="p")
    assert silent.closed


def session_over(inventory, channels, sudo=True):
    """A HostSession whose hosts' SSH connections are FakeClients over `channels`."""
    from bootstrap.remote.session import HostSession

    class Host:
        data = {"_sudo": sudo}

    class State:
        failed_hosts, active_hosts = set(), set(channels)

        class inventory:
            get_host = staticmethod(lambda name, default=None: Host())

        def fail_hosts(self, hosts):  # pyinfra's State.fail_hosts, less its "No hosts remaining!"
            self.failed_hosts |= hosts
            self.active_hosts -= hosts

    session = HostSession.__new__(HostSession)
    session.nodes, session.failures, session._state = list(inventory.nodes), {}, State()
    session.ssh_client = lambda name: FakeClient(channels[name])
    return session


def test_root_files_are_read_as_capped_bytes(tmp_path):
    inventory, _ = three_hosts(tmp_path)
    channels = {"cp": FakeChannel([b"apiVersion: v1\n", b"\xff\x1b[2J\n"]), "a1": FakeChannel([b"x"], status=1),
                "a2": FakeChannel([b"y" * 65536] * 20)}
    session = session_over(inventory, channels)
    assert session.read_root_file("cp", "/etc/rancher/k3s/k3s.yaml") == "apiVersion: v1\n\ufffd\x1b[2J\n"
    assert channels["cp"].command == "sudo -H -n cat /etc/rancher/k3s/k3s.yaml 2>/dev/null"
    assert session.read_root_file("a1", "/x") is None  # cat failed
    assert session.read_root_file("a2", "/x") is None and channels["a2"].closed  # over 1 MiB: refused
    assert not session.failures  # the caller decides what a missing file means


def test_the_probe_filters_nothing_on_the_host():
    from bootstrap.host.facts.probe import PROBE_SCRIPT

    assert "tr -c" not in PROBE_SCRIPT  # a filter on the host runs as the host decides


def test_gather_reads_each_host_as_bytes_and_fails_only_the_flooding_one(tmp_path):
    from bootstrap.host.facts.pyinfra_fact import HostFactsFact

    inventory, _ = three_hosts(tmp_path)
    probe = "\n".join(h200_probe_output()).encode() + b"\n"
    channels = {"cp": FakeChannel([probe]),
                "a1": FakeChannel([b"\xff\xfe\x1b]52;c;eA==\x07" * 6000] * 300),  # 19 MiB
                "a2": FakeChannel([probe.replace(b"Ubuntu 24.04.3 LTS", b"Ubuntu \xff\x1b[2J")])}
    session = session_over(inventory, channels)
    facts = session.gather(HostFactsFact, paths=("/etc/rancher/k3s/config.yaml",))
    assert set(facts) == {"cp", "a2"} and "printed more than 16 MiB" in session.failures["a1"].message
    assert facts["cp"].gpus[0].name == "NVIDIA H200"
    assert facts["a2"].os_pretty == "Ubuntu \ufffd\x1b[2J"  # decoded here; printing escapes it
    assert channels["cp"].command.startswith("sh -c ") and "BOOTSTRAP_FILES=" in channels["cp"].command


# --- whatever one host answers, preflight and the plans of the others are made ---------------------

def _golden_inventory():
    from test_golden import INVENTORY

    return INVENTORY


@FAST
@given(hostile_probe_output(), hostile_probe_output())
def test_preflight_and_every_plan_are_made_whatever_the_hosts_answer(first, second):
    from collections import defaultdict

    from bootstrap.host.release import online_artifacts
    from bootstrap.host.plan.rollout import plan_rollout, version_findings
    from bootstrap.checks.preflight import ownership_findings, preflight
    from bootstrap.cluster.liveness import service_verdict
    from bootstrap.checks import reachability as rr
    from bootstrap.checks.lost_nodes import classify

    inventory = _golden_inventory()
    honest = replace(parse_host_facts(h200_probe_output()), manifest=GOLDEN_MANIFEST)
    facts = {"cp-1": parse_host_facts(first), "gpu-1": parse_host_facts(second), "cpu-1": honest}
    findings = preflight(inventory, facts) + ownership_findings(inventory, facts, OUR_ID)
    assert all(f.node in facts for f in findings)
    artifacts = defaultdict(lambda: online_artifacts("v1.33.5+k3s1", "amd64"))
    findings += version_findings(inventory, facts, "v1.34.1+k3s1", {})
    probes = rr.plan_probes(inventory, facts, embedded_mirror=True)
    assert isinstance(rr.findings(inventory, probes, []), list)
    plans = make_plans(inventory, facts, JoinTokens("tok", "agent-tok"), artifacts, OUR_ID)
    assert "cpu-1" in plans.plans  # the honest host's plan, whatever the others said
    assert set(plans.plans) | set(plans.failures) == set(facts)
    plan_rollout(inventory, facts, plans.plans, "v1.34.1+k3s1")
    classify(inventory, {}, facts)  # rebuild: what is lost, from the same answers
    for server in inventory.servers:  # whether a server's k3s runs, from its answers alone
        service_verdict(server, facts.get(server.name))


# --- pod logs (served by the pod's node) ----------------------------------------------------------

LOG_PIECES = st.sampled_from(["# Avg bus bandwidth : ", "1.2.3", ".", "12.5", "gpu 0: ", "gpu ١: ", "x = ", "= ",
                              " single-precision GFLOP/s", " at 20 flops per interaction", "\n", "\x1b[2J",
                              "99999999999999999999", "> Compute 9.0 CUDA device: [", "]", "\u202e"])


@FAST
@given(st.one_of(hostile_text, st.lists(LOG_PIECES, max_size=30).map("".join)))
def test_pod_logs_give_numbers_or_nothing(log):
    from bootstrap.cluster.burn_in import device, gflops, throughputs
    from bootstrap.cluster.checks import parse_busbw

    assert parse_busbw(log) is None or isinstance(parse_busbw(log), float)
    assert all(isinstance(v, float) for v in throughputs({0: log, 1: log}).values())
    assert gflops(log) is None or isinstance(gflops(log), float)
    assert device(log) is None or device(log).isprintable()
    assert parse_busbw("# Avg bus bandwidth : 1.2.3") == 1.2


def test_package_names_a_host_prints_are_checked_before_they_reach_apt():
    from bootstrap.host.facts import parsers as p

    lines = ["hi nvidia-x;reboot 1.0", "ii nvidia-utils-580 580.159.04-0ubuntu1", "hi libnvidia-gl-580 $(id)",
             "hi nvidia-kernel-common-580:amd64 1:580.159.04"]
    assert p.parse_packages(lines) == {"nvidia-utils-580": "580.159.04-0ubuntu1",
                                       "nvidia-kernel-common-580": "1:580.159.04"}
    assert p.parse_held(lines) == ["nvidia-kernel-common-580"]


def test_a_parser_bug_on_one_hosts_output_fails_only_that_host(tmp_path, monkeypatch):
    from bootstrap.host.facts.pyinfra_fact import HostFactsFact

    inventory, _ = three_hosts(tmp_path)
    probe = "\n".join(h200_probe_output()).encode() + b"\n"
    channels = {"cp": FakeChannel([probe]), "a1": FakeChannel([b"trigger\n"]), "a2": FakeChannel([probe])}
    real = HostFactsFact.process_bytes

    def buggy(self, output):
        if output.startswith(b"trigger"):
            raise KeyError("a bug no test found")
        return real(self, output)

    monkeypatch.setattr(HostFactsFact, "process_bytes", buggy)
    session = session_over(inventory, channels)
    facts = session.gather(HostFactsFact)
    assert set(facts) == {"cp", "a2"} and "could not be parsed" in session.failures["a1"].message


def test_pyinfras_reads_of_a_hosts_output_replace_bytes_that_are_not_utf8():
    import io

    import paramiko.file

    from bootstrap.remote.sshlink import decode_remote_output_leniently

    class Pipe(paramiko.file.BufferedFile):
        """A text-mode paramiko file over fixed bytes, as exec_command's stdout is."""

        def __init__(self, data: bytes):
            super().__init__()
            self._source = io.BytesIO(data)
            self._set_mode("r")

        def _read(self, size):
            return self._source.read(size) or None

    decode_remote_output_leniently()
    assert list(Pipe(b"ok\n\xff\xfe \x1b[2J\nlast")) == ["ok\n", "\ufffd\ufffd \x1b[2J\n", "last"]


def up_with_one_bad_answer(tmp_path, bad: str):
    inventory, state, healthy = three_hosts_to_bring_up(tmp_path)
    facts = {name: replace(healthy, hostname=name) for name in ("cp", "a1", "a2")}
    session = KubeconfigSession(inventory, facts, bad_answers=[bad])
    return inventory, state, session


def test_an_agent_whose_probe_answer_is_refused_is_left_out_and_the_others_converge(tmp_path):
    # A flood, a stall or an unparsable probe (bootstrap.remote.session._gather_untrusted) used
    # to read as an unreachable host: `up` stopped for every host.
    inventory, state, session = up_with_one_bad_answer(tmp_path, "a1")
    with pytest.raises(HostsFailed, match="a1"):
        bring_up(inventory, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter()),
                 open_session=lambda *a: contextlib.nullcontext(session))
    ran = {host for _, host in session.executed}
    assert {"cp", "a2"} <= ran and "a1" not in ran


def test_a_server_whose_probe_answer_is_refused_still_stops_the_run(tmp_path):
    inventory, state, session = up_with_one_bad_answer(tmp_path, "cp")
    with pytest.raises(BootstrapError, match="no host was changed"):
        bring_up(inventory, state, UpOptions(hosts_only=True), progress.Console(progress.Reporter()),
                 open_session=lambda *a: contextlib.nullcontext(session))
    assert session.executed == []
