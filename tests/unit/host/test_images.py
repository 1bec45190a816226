"""Image distribution: k3s's embedded registry mirror, registries.yaml, pre-pulls."""

import pytest
import yaml
from upstream import k3s_flags

from bootstrap.host.plan import k3sconfig
from bootstrap.host.parts.registries import embedded_mirror_on, registries_yaml
from bootstrap.state.secrets import with_secret_values
from bootstrap.inventory.loader import parse_inventory
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.topology import gpu_nodes  # the run's GPU nodes, as its topology resolves them

TOKENS = JoinTokens("tok", "agent-tok")

BASE = """\
cluster: t
nodes:
  - {name: cp-1, address: 10.0.0.10, role: server}
  - {name: gpu-1, address: 10.0.0.21}
"""

# registries.yaml as k3s documents it (installation/private-registry): these keys and no others.
DOCUMENTED = {
    "top": {"mirrors", "configs"},
    "mirror": {"endpoint", "rewrite"},
    "config": {"auth", "tls"},
    "auth": {"username", "password", "auth", "identitytoken"},
    "tls": {"cert_file", "key_file", "ca_file", "insecure_skip_verify"},
}


def check_documented(data: dict) -> None:
    assert set(data) <= DOCUMENTED["top"]
    for registry, entry in data.get("mirrors", {}).items():
        assert set(entry or {}) <= DOCUMENTED["mirror"], registry
    for registry, entry in data.get("configs", {}).items():
        assert set(entry) <= DOCUMENTED["config"], registry
        assert set(entry.get("auth", {})) <= DOCUMENTED["auth"]
        assert set(entry.get("tls", {})) <= DOCUMENTED["tls"]


def test_the_embedded_mirror_is_on_for_gpu_clusters_unless_the_inventory_says_otherwise():
    inv = parse_inventory(BASE)
    assert embedded_mirror_on(inv, gpu_cluster=True) and not embedded_mirror_on(inv, gpu_cluster=False)
    off = parse_inventory(BASE + "images: {embedded_mirror: false}\n")
    assert not embedded_mirror_on(off, gpu_cluster=True)
    on = parse_inventory(BASE + "images: {embedded_mirror: true}\n")
    assert embedded_mirror_on(on, gpu_cluster=False)


def test_the_mirror_is_a_server_flag_and_agents_do_not_get_it():
    inv = parse_inventory(BASE)
    server = k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS, embedded_mirror=True)
    agent = k3sconfig.node_config(inv, inv.node("gpu-1"), TOKENS, embedded_mirror=True)
    assert server["embedded-registry"] is True and "embedded-registry" in k3s_flags("server")
    assert "embedded-registry" not in agent and "embedded-registry" not in k3s_flags("agent")
    assert set(server) <= k3s_flags("server") and set(agent) <= k3s_flags("agent")
    assert "embedded-registry" not in k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS)


def test_registries_yaml_lists_every_shared_registry_and_keeps_the_inventorys_mirrors(monkeypatch):
    monkeypatch.setenv("NGC_KEY", "secret")
    inv = parse_inventory(BASE + """\
registries:
  mirrors: {docker.io: ["https://mirror.example.com"]}
  auth: {nvcr.io: {username: $oauthtoken, password_env: NGC_KEY}}
images: {mirror_registries: [docker.io, nvcr.io, registry.k8s.io]}
""")
    data = yaml.safe_load(registries_yaml(with_secret_values(inv), embedded_mirror=True))
    check_documented(data)
    # An entry with no endpoint is what turns the embedded mirror on for a registry.
    assert data["mirrors"] == {"docker.io": {"endpoint": ["https://mirror.example.com"]}, "nvcr.io": {},
                               "registry.k8s.io": {}}
    assert data["configs"]["nvcr.io"]["auth"] == {"username": "$oauthtoken", "password": "secret"}


def test_without_the_mirror_registries_yaml_is_only_what_the_inventory_asks_for():
    inv = parse_inventory(BASE)
    assert registries_yaml(inv, embedded_mirror=False) is None
    data = yaml.safe_load(registries_yaml(inv, embedded_mirror=True))
    check_documented(data)
    assert set(data["mirrors"]) == {"docker.io", "registry.k8s.io", "nvcr.io", "ghcr.io", "quay.io"}


@pytest.mark.parametrize("text, field", [
    ("images: {embedded_mirror: maybe}\n", "images.embedded_mirror"),
    ("images: {prepull: ['Not An Image']}\n", "images.prepull"),
    ("images: {prepul: [a]}\n", "images.prepul"),
])
def test_bad_image_settings_are_refused_naming_the_field(text, field):
    from bootstrap.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        parse_inventory(BASE + text)
    assert any(p.path.startswith(field) for p in info.value.problems), [p.render() for p in info.value.problems]


# `k3s crictl images --digests` on a k3s node (columns as crictl prints them).
CRICTL_IMAGES = """\
IMAGE                                        TAG                    DIGEST              IMAGE ID            SIZE
docker.io/library/busybox                    1.36                   f5d7d2c1f4ab3       8135583d97feb       2.16MB
docker.io/rancher/mirrored-pause             3.6                    74c4244427b7b       6270bb605e12e       301kB
nvcr.io/nvidia/k8s/cuda-sample               vectoradd-cuda12.5.0   ab1c2d3e4f5a6       3f2e1d0c9b8a7       131MB
ghcr.io/coreweave/nccl-tests                 <none>                 9a8b7c6d5e4f3       1a2b3c4d5e6f7       4.2GB
"""


def test_crictl_images_are_parsed_into_references():
    from bootstrap.host.facts.parsers import parse_crictl_images

    refs = parse_crictl_images(CRICTL_IMAGES.splitlines())
    assert refs == ("docker.io/library/busybox:1.36", "docker.io/rancher/mirrored-pause:3.6",
                    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                    "ghcr.io/coreweave/nccl-tests@sha256:9a8b7c6d5e4f3")


def test_short_image_names_match_what_containerd_stores():
    from bootstrap.host.images import missing, normalise

    assert normalise("busybox:1.36") == "docker.io/library/busybox:1.36"
    assert normalise("rancher/pause") == "docker.io/rancher/pause:latest"
    assert normalise("localhost:5000/x:1") == "localhost:5000/x:1"
    present = ("docker.io/library/busybox:1.36", "ghcr.io/coreweave/nccl-tests@sha256:9a8b7c6d5e4f3")
    assert missing(["busybox:1.36", "busybox:1.37", "ghcr.io/coreweave/nccl-tests@sha256:" + "9" * 64], present) \
        == ["busybox:1.37"]
    assert missing(["busybox:1.36"], None) == ["busybox:1.36"]  # k3s not running: unknown, so pull


def test_gpu_nodes_prepull_the_validation_images_and_the_inventorys():
    from bootstrap.host.images import prepull_images

    inv = parse_inventory(BASE + """\
validate: {nccl: {enabled: true, min_busbw_gbps: 100}}
images: {prepull: [nvcr.io/nvidia/pytorch:25.01-py3, "busybox:1.36"]}
""")
    operator = ["nvcr.io/nvidia/gpu-operator:v26.7.0", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
                "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless",
                "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0", "registry.k8s.io/nfd/node-feature-discovery:v0.19.0"]
    assert prepull_images(inv) == ["nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", "busybox:1.36",
                                   "ghcr.io/coreweave/nccl-tests:12.4.1-cudnn-devel-ubuntu22.04-nccl2.21.5-1-85f9143",
                                   "nvcr.io/nvidia/pytorch:25.01-py3"] + operator


def test_the_gpu_operators_images_follow_its_chart_version_and_driver_mode():
    from bootstrap.host.images import gpu_operator_images

    host = gpu_operator_images(parse_inventory(BASE + "gpu: {driver: host}\n"), "ubuntu", "24.04")
    assert "nvcr.io/nvidia/gpu-operator:v26.7.0" in host and not any("driver" in i or "toolkit" in i for i in host)
    operator = parse_inventory(BASE + "gpu: {driver: operator}\n")
    with_driver = gpu_operator_images(operator, "ubuntu", "24.04")
    assert {"nvcr.io/nvidia/k8s/container-toolkit:v1.20.0", "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
            "nvcr.io/nvidia/driver:595.91.07-ubuntu24.04"} <= set(with_driver)
    # the driver's tag names the OS: unknown, or not a plain name (a host's answer), no driver image
    assert not any(i.startswith("nvcr.io/nvidia/driver:") for i in gpu_operator_images(operator))
    assert not any(i.startswith("nvcr.io/nvidia/driver:") for i in gpu_operator_images(operator, "ubu ntu", "1;x"))
    # a chart version the table does not know: nothing guessed
    assert gpu_operator_images(parse_inventory(BASE + "charts: {gpu_operator: v99.1.0}\n")) == []


def test_the_gpu_operator_image_table_matches_the_upstream_chart():
    """Every version in the table against its chart's values.yaml and Chart.yaml (../shared/upstream)."""
    from upstream import upstream

    from bootstrap.host.images import GPU_OPERATOR_IMAGES

    def image(section):
        return f"{section['repository']}/{section['image']}:{section.get('version') or version}"

    for version, table in GPU_OPERATOR_IMAGES.items():
        values = yaml.safe_load(upstream(f"gpu-operator/{version}/values.yaml").read_text())
        chart = yaml.safe_load(upstream(f"gpu-operator/{version}/Chart.yaml").read_text())
        # the validator and the operator: no version in values, the chart's appVersion (= its version)
        assert values["validator"].get("version") is None and values["operator"].get("version") is None
        assert table["validator"] == image(values["validator"]) == image(values["operator"])
        assert table["device_plugin"] == image(values["devicePlugin"]) == image(values["gfd"])
        assert table["dcgm_exporter"] == image(values["dcgmExporter"])
        assert table["mig_manager"] == image(values["migManager"])
        assert table["toolkit"] == image(values["toolkit"])
        assert table["driver_manager"] == image(values["driver"]["manager"])
        assert table["driver"] == image(values["driver"])
        (nfd,) = [d for d in chart["dependencies"] if d["name"] == "node-feature-discovery"]
        assert table["nfd"] == f"registry.k8s.io/nfd/node-feature-discovery:v{nfd['version']}"
        # What the defaults run for container workloads is all in the table: every other
        # section with an image is off, or only for sandbox workloads (off by default).
        listed = {"validator", "operator", "devicePlugin", "gfd", "dcgmExporter", "migManager", "toolkit", "driver"}
        sandbox_only = {"vgpuDeviceManager", "vfioManager", "sandboxDevicePlugin", "kataSandboxDevicePlugin",
                        "ccManager", "kataManager", "vgpuManager"}
        assert values["sandboxWorkloads"]["enabled"] is False and values["nfd"]["enabled"] is True
        for name, section in values.items():
            if isinstance(section, dict) and "image" in section and name not in listed | sandbox_only:
                assert section.get("enabled") is False or name == "draDriver", name


def test_image_pulls_start_in_the_background_once_k3s_runs():
    from bootstrap.host.facts.host_facts import HostFacts
    from bootstrap.host.parts import k3s_images
    from bootstrap.host.parts.base import Action, Draft
    from bootstrap.host.plan.host_plan import HostPlan
    from bootstrap.inventory.model import Node

    def plan(service, images, version="v1.33.5+k3s1", asked=True):
        wanted = ["busybox:1.36", "nvcr.io/nvidia/gpu-operator:v26.7.0"]
        uploads = k3s_images.pulls_record(wanted) if asked else []
        draft = Draft(HostPlan(node=Node(name="g", address="10.0.0.2"), unit="k3s-agent", service=service,
                               uploads=list(uploads)), {})
        k3s_images.plan_prepull(draft, ["busybox:1.36", "nvcr.io/nvidia/gpu-operator:v26.7.0"],
                                HostFacts(images=images), version)
        return draft.plan

    # joining: an old list goes before the start (it would hold it), the new one right after it
    joining = plan("start", None)
    assert joining.prepare == ["rm -f /var/lib/rancher/k3s/agent/images/bootstrap-pull-*.txt"]
    assert Action.PULL_IMAGES in joining.actions
    script = "\n".join(joining.pull_after_start)
    assert "/var/lib/rancher/k3s/agent/images/bootstrap-pull-$(date +%s%N).txt" in script
    assert "printf '%s\\n' busybox:1.36 nvcr.io/nvidia/gpu-operator:v26.7.0 > \"$l.part\" && mv -f" in script
    assert "crictl pull" not in script
    # and, detached, what pins them by containerd's names once pulled and removes the list
    assert joining.pull_after_start[-1].startswith("setsid sh -c ")
    assert joining.pull_after_start[-1].endswith(
        "pin \"$l\" docker.io/library/busybox:1.36 nvcr.io/nvidia/gpu-operator:v26.7.0 </dev/null >/dev/null 2>&1 &")
    # k3s runs already and the list asked for changed: with the host's other changes; only what it lacks
    running = plan(None, ("docker.io/library/busybox:1.36",), asked=True)
    assert running.pull_after_start == [] and running.prepull == ["nvcr.io/nvidia/gpu-operator:v26.7.0"]
    assert "bootstrap-pull-" in "\n".join(running.prepare)
    # the same list asked before, k3s running: its pulls run already (a second `up` changes nothing)
    same = plan(None, ("docker.io/library/busybox:1.36",), asked=False)
    assert same.prepull == [] and same.prepare == [] and not same.changed
    # a restart: the old lists go first, so the restart does not wait for their pulls
    assert plan("restart", None).prepare == ["rm -f /var/lib/rancher/k3s/agent/images/bootstrap-pull-*.txt"]
    # a k3s that does not watch agent/images: crictl pulls, detached
    old = plan(None, (), "v1.31.4+k3s1", asked=True)
    assert len(old.prepare) == 1 and old.prepare[0].startswith("setsid sh -c ") and old.prepare[0].endswith("&")
    assert plan(None, ("docker.io/library/busybox:1.36", "nvcr.io/nvidia/gpu-operator:v26.7.0")).prepare == []
    # an air-gap binary of unknown version: the host's `k3s --version` decides
    unknown = "\n".join(plan("start", None, None).pull_after_start)
    assert unknown.startswith("if k3s --version 2>/dev/null | awk ") and "bootstrap-pull-" in unknown
    assert "setsid sh -c" in unknown and unknown.endswith("fi")


def test_the_version_check_on_the_host_agrees_with_the_table():
    import subprocess

    from bootstrap.host.parts.k3s_images import WATCHES_FOLDER_AWK, imports_while_running

    for version in ("v1.33.5+k3s1", "v1.32.0+k3s1", "v1.31.4+k3s1", "v1.31.5+k3s1", "v1.30.8+k3s1", "v1.30.9+k3s1",
                    "v1.29.13+k3s1", "v1.29.12+k3s1", "v1.28.15+k3s1", "v1.34.1+k3s1"):
        said = subprocess.run(["sh", "-c", f"echo 'k3s version {version} (0123abcd)' | {WATCHES_FOLDER_AWK}"])
        assert (said.returncode == 0) == imports_while_running(version), version
    assert subprocess.run(["sh", "-c", f"true | {WATCHES_FOLDER_AWK}"]).returncode != 0  # no k3s: crictl


def test_no_step_waits_for_image_pulls():
    from bootstrap.host.plan.host_plan import HostPlan
    from bootstrap.host.plan.steps import converge_steps
    from bootstrap.inventory.model import Node

    inv = parse_inventory(BASE)
    plans = {"cp-1": HostPlan(node=inv.node("cp-1"), unit="k3s", service="start"),
             "gpu-1": HostPlan(node=inv.node("gpu-1"), unit="k3s-agent", service="start", prepull=["busybox:1.36"],
                               pull_after_start=["echo pulls-start"])}
    steps = converge_steps(inv, plans, set())
    assert [s.name for s in steps] == ["prepare host", "start server cp-1", "join agents", "check nvidia runtime"]
    (join,) = steps[2].commands["gpu-1"]
    assert "echo pulls-start" in join.bits[0] and "crictl pull" not in join.bits[0]
    assert "pulls-start" not in steps[1].commands["cp-1"][0].bits[0]


def test_repository_names_keep_registry_ports():
    from bootstrap.host.images import repository

    assert repository("localhost:5000/team/x:1") == "localhost:5000/team/x"
    assert repository("ghcr.io/a/b@sha256:abc") == "ghcr.io/a/b"
    assert repository("busybox") == "busybox"


def test_the_air_gap_folder_yields_exactly_what_k3s_imports(tmp_path):
    from bootstrap.host.release import image_archives

    names = ["k3s-airgap-images-amd64.tar.zst", "k3s-airgap-images-arm64.tar.zst", "cuda.tgz", "more.tzst",
             "old.tbz", "plain.tar", "x.tar.lz4", "y.tar.bz2", "z.tar.gz", "pull.txt", "images-arm64.txt",
             "sha256sum-amd64.txt", "notes.md", "image.tar.xz", "k3s"]
    for name in names:
        (tmp_path / name).write_text("x")
    got = [p.name for p in image_archives(tmp_path, "amd64")]
    assert got == sorted(["k3s-airgap-images-amd64.tar.zst", "cuda.tgz", "more.tzst", "old.tbz", "plain.tar",
                          "x.tar.lz4", "y.tar.bz2", "z.tar.gz", "pull.txt"])


def test_a_new_archive_on_a_running_node_is_awaited_or_restarts_an_older_k3s():
    from bootstrap.host.parts import k3s_images
    from bootstrap.host.parts.base import Action, Draft, FileSpec
    from bootstrap.host.plan.host_plan import HostPlan
    from bootstrap.inventory.model import Node

    gib = 1 << 30
    archive = FileSpec("/var/lib/rancher/k3s/agent/images/cuda.tgz", 0o644, "0" * 64, image_archive=True,
                       size=10 * gib)
    held = FileSpec("/var/lib/rancher/k3s/agent/images/k3s.tar.zst", 0o644, "1" * 64, image_archive=True, size=gib)

    def plan(version, service=None):
        draft = Draft(HostPlan(node=Node(name="g", address="10.0.0.2"), unit="k3s-agent", uploads=[archive],
                               service=service), {})
        k3s_images.plan_import(draft, version, [archive, held])
        return draft.plan

    new = plan("v1.33.5+k3s1")
    assert new.service is None and Action.AWAIT_IMAGE_IMPORT in new.actions
    assert "ctr" not in "\n".join(new.prepare) and "Imported images from $a in" in new.prepare[-1]
    assert "within 660 s" in new.prepare[-1]  # 10 GiB at 60 s a GiB, plus a minute
    assert new.start_timeout == 300 + 11 * 60  # a (re)start imports everything the node holds
    for version in ("v1.31.4+k3s1", "v1.29.12+k3s1", "v1.28.15+k3s1"):  # before the January 2025 releases
        old = plan(version)
        assert old.service == "restart" and Action.AWAIT_IMAGE_IMPORT not in old.actions, version
    assert plan("v1.31.5+k3s1").service is None
    starting = plan("v1.33.5+k3s1", service="start")
    assert starting.prepare == [] and starting.service == "start"  # imported at start, within its wait


def test_up_says_which_gpu_node_is_still_downloading_what():
    from dataclasses import replace

    from test_host_phase_flow import healthy_host

    from bootstrap.host.images import download_lines, prepull_images

    inv = parse_inventory(BASE.replace("role: server}", "role: server, gpu: {enabled: false}}"))
    held = ("docker.io/library/busybox:1.36", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0")
    facts = {"cp-1": replace(healthy_host("cp-1"), gpus=[], images=()), "gpu-1": replace(healthy_host("gpu-1"), images=held)}
    (line,) = download_lines(inv, facts, gpu_nodes(inv, facts))
    assert line.startswith("images: gpu-1 is still downloading 5 in the background (k3s logs a failed pull): "
                           "nvcr.io/nvidia/gpu-operator:v26.7.0")
    assert "busybox" not in line and "cp-1" not in line
    everything = held + tuple(prepull_images(inv))
    assert download_lines(inv, {**facts, "gpu-1": replace(facts["gpu-1"], images=everything)}, gpu_nodes(inv, {**facts, "gpu-1": replace(facts["gpu-1"], images=everything)})) == []
    assert download_lines(inv, {**facts, "gpu-1": replace(facts["gpu-1"], images=None)}, gpu_nodes(inv, {**facts, "gpu-1": replace(facts["gpu-1"], images=None)})) == []  # k3s not read


def test_the_detached_pulls_of_an_older_k3s_end_by_the_deadline(tmp_path, monkeypatch):
    """A k3s that does not watch agent/images gets detached `crictl pull`s: a registry that
    stalls one (crictl's pull has no time-out of its own) had kept the helper on the host for
    good. Each pull gets what is left of PULLS_DEADLINE_S, and what was pulled is pinned after."""
    import subprocess
    import time

    from bootstrap.host.parts import k3s_images

    monkeypatch.setattr(k3s_images, "PULLS_DEADLINE_S", 2)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "k3s").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\n"
                                "[ \"$1 $2\" = 'crictl pull' ] && exec sleep 300\nexit 0\n")
    (bindir / "k3s").chmod(0o755)
    (line,) = k3s_images.pull_in_background_lines(["busybox:1.36", "ghcr.io/example/train:1.0"], watches_folder=False)
    assert line.startswith("setsid sh -c ") and line.endswith(" &")
    started = time.monotonic()
    subprocess.run(["sh", "-c", line.removeprefix("setsid ").removesuffix(" &")], timeout=60, check=True,
                   env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert time.monotonic() - started < 10
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "crictl pull docker.io/library/busybox:1.36"  # the second: no time left
    assert "ctr -n k8s.io images label docker.io/library/busybox:1.36 io.cri-containerd.pinned=pinned" in calls[-2]


def test_the_detached_helpers_ctr_and_crictl_calls_each_end_by_a_time_out(tmp_path, monkeypatch):
    """A containerd that stops answering must not hold the helper past its deadline: ctr and
    crictl set no time-out of their own on the socket (the label and inspect calls had none)."""
    import subprocess
    import time

    from bootstrap.host.parts import k3s_images

    monkeypatch.setattr(k3s_images, "CTR_TIMEOUT_S", 1)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "k3s").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\nexec sleep 300\n")
    (bindir / "k3s").chmod(0o755)
    started = time.monotonic()
    subprocess.run(["sh", "-c", k3s_images.pin_lines("a b")], timeout=30, env={"PATH": f"{bindir}:/usr/bin:/bin"})
    assert time.monotonic() - started < 10  # before: 300 s a call
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    waiting = k3s_images.pin_when_pulled("a")
    assert "timeout 1 k3s crictl inspecti" in waiting and "timeout 1 k3s ctr -n k8s.io images label" in waiting
