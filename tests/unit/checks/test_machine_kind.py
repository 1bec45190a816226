"""A container sold as a "GPU pod" is refused at preflight, naming what was found and what to
rent instead; a systemd container with what k3s needs passes with a note. The probe's
"machine" section is parsed strictly (hypothesis: hostile lines never raise, never invent)."""

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from test_facts_parsers import section
from test_preflight import CPU, H200, inventory

from bootstrap.host.facts import parsers as p
from bootstrap.host.facts.host_facts import MachineKind
from bootstrap.host.facts.probe import PROBE_SCRIPT, parse_host_facts
from bootstrap.checks.preflight import preflight

V2_RO = "cgroup 36 25 0:31 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate"
V2_RW = "cgroup 36 25 0:31 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw"
V1_RW = ["cgroup 31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
         "cgroup 35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
         "cgroup 39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids"]

# What the probe printed (its own words) on the kinds of machine people rent.
DOCKER_GPU_POD = ["virt docker", "marker /.dockerenv", V2_RO, "netns denied", "netfilter denied"]
PODMAN = ["virt podman", "marker /run/.containerenv", V2_RO, "netns denied", "netfilter missing"]
PRIVILEGED_LXC = ["virt lxc", V2_RW, "netns ok", "netfilter ok"]
PRIVILEGED_V1 = ["virt lxc", *V1_RW, "netns ok", "netfilter ok"]
# The test lab's systemd-nspawn machine on a cgroup-v1 host, as recorded: the controllers
# read-only, the container's own name=systemd and unified hierarchies writable.
NSPAWN_ON_V1 = ["virt systemd-nspawn", *(f"cgroup {line}" for line in """\
56 111 0:51 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:17 - tmpfs tmpfs ro,size=4096k,nr_inodes=1024,mode=755
63 56 0:31 / /sys/fs/cgroup/cpuset ro,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,cpuset
64 56 0:29 / /sys/fs/cgroup/cpu ro,nosuid,nodev,noexec,relatime shared:19 - cgroup cgroup rw,cpu
67 56 0:32 / /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime shared:22 - cgroup cgroup rw,memory
72 56 0:36 / /sys/fs/cgroup/pids ro,nosuid,nodev,noexec,relatime shared:25 - cgroup cgroup rw,pids
73 56 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:26 - cgroup2 cgroup rw
74 56 0:37 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:27 - cgroup cgroup rw,name=systemd
""".splitlines()), "netns ok", "netfilter ok"]
VM = ["virt none", V2_RW, "netns ok", "netfilter ok"]


def host(machine_lines, pid1="systemd"):
    """A healthy CPU node whose probe printed `machine_lines` and this PID 1."""
    parsed = parse_host_facts(section("pid1", pid1) + section("machine", machine_lines))
    return replace(CPU, has_systemd=parsed.has_systemd, init_process=parsed.init_process, machine=parsed.machine)


def machine_findings(facts):
    return [f for f in preflight(inventory(), {"cp-1": facts, "gpu-1": H200}) if f.check == "machine"]


def test_a_docker_gpu_pod_is_refused_naming_what_was_found_and_what_to_rent():
    (finding,) = machine_findings(host(DOCKER_GPU_POD, pid1="python3"))
    assert finding.severity == "error" and finding.node == "cp-1"
    for words in ("systemd-detect-virt --container: docker", "/.dockerenv exists", "PID 1 is python3, not systemd",
                  "cgroup v2 is mounted read-only", "no network namespace", "iptables is refused"):
        assert words in finding.message, finding.message
    assert "rent a VM or bare-metal offer" in finding.fix


def test_a_podman_container_with_systemd_but_read_only_cgroups_is_still_refused():
    (finding,) = machine_findings(host(PODMAN))
    assert finding.severity == "error" and "/run/.containerenv exists" in finding.message
    assert "PID 1" not in finding.message and "read-only" in finding.message
    assert "iptables" not in finding.message  # missing binaries: k3s brings its own iptables


def test_systemd_containers_with_what_k3s_needs_pass_with_a_note():
    for lines, kind in ((PRIVILEGED_LXC, "lxc"), (PRIVILEGED_V1, "lxc")):
        (finding,) = machine_findings(host(lines))
        assert finding.severity == "info", finding
        assert f"a container (systemd-detect-virt --container: {kind}) with what k3s needs" in finding.message
        assert "network namespaces, netfilter" in finding.message


def test_read_only_v1_controllers_beside_a_writable_systemd_hierarchy_are_a_warning():
    """systemd-nspawn on a cgroup-v1 host: its systemd runs, kubelet could not make pod cgroups."""
    (finding,) = machine_findings(host(NSPAWN_ON_V1))
    assert finding.severity == "warning"
    assert "cgroup v1 controllers are mounted read-only (cpu, cpuset, memory, pids)" in finding.message
    assert finding.message.startswith("a container (systemd-detect-virt --container: systemd-nspawn) whose ")


def test_a_vm_gets_no_finding_and_older_facts_are_judged_by_pid_1_only():
    assert machine_findings(host(VM)) == []
    assert machine_findings(CPU) == []  # no "machine" section: nothing to judge but PID 1
    (finding,) = machine_findings(replace(CPU, has_systemd=False, init_process="tini"))
    assert finding.severity == "error" and "PID 1 is tini" in finding.message


def test_without_root_the_unknown_checks_are_named_not_guessed():
    (finding,) = machine_findings(host(["virt lxc", V2_RW, "netns unknown", "netfilter unknown"]))
    assert finding.severity == "info" and "not checked without root: network namespaces, netfilter" in finding.message


def test_the_probe_asks_each_question_without_leaving_anything_behind():
    for words in ("systemd-detect-virt --container", "/.dockerenv", "/run/.containerenv", "/proc/self/mountinfo",
                  "unshare -n true", "iptables -w 5 -n -L INPUT"):
        assert words in PROBE_SCRIPT
    assert "ip netns add " not in PROBE_SCRIPT.replace("`ip netns add`", "")  # it would leave /run/netns/<name> behind


def test_parse_machine_reads_the_real_words_only():
    assert p.parse_machine(PRIVILEGED_V1) == MachineKind("lxc", [], "v1", "all", [], True, "ok")
    assert p.parse_machine(NSPAWN_ON_V1) == MachineKind("systemd-nspawn", [], "v1", "some", ["cpu", "cpuset", "memory",
                                                                                            "pids"], True, "ok")
    assert p.parse_machine(DOCKER_GPU_POD) == MachineKind("docker", ["/.dockerenv"], "v2", "none", ["/"], False,
                                                          "denied")
    hostile = ["virt none ok", "virt \x1b[2J", "marker /etc/passwd", "netns maybe", "netfilter ok ok",
               "cgroup 1 2 3 / /sys/fs/cgroup rw", "cgroup 1 2 3 / /sys/fs/cgroupx rw - cgroup2 c rw"]
    assert p.parse_machine(hostile) == MachineKind()
    # v1 with one read-only controller mount cannot create pod cgroups
    ro = [*V1_RW[:2], V1_RW[2].replace("/pids rw,", "/pids ro,")]
    assert p.parse_machine(ro).cgroup_writable == "some" and p.parse_machine(ro).read_only == ["pids"]


WORDS = st.sampled_from(["virt", "marker", "cgroup", "netns", "netfilter", "ok", "denied", "-", "/sys/fs/cgroup",
                         "cgroup2", "rw", "ro", "/.dockerenv", "docker", "none", "\x00", "\u202e", "9" * 30])
LINES = st.lists(st.one_of(st.text(max_size=80), st.lists(WORDS, max_size=14).map(" ".join)), max_size=80)


@given(LINES)
def test_parse_machine_never_raises_and_never_invents(lines):
    m = p.parse_machine(lines)
    assert m.container is None or (m.container.isascii() and len(m.container) <= 32)
    assert set(m.markers) <= {"/.dockerenv", "/run/.containerenv"}
    assert m.cgroup in (None, "v1", "v2") and (m.cgroup is None) == (m.cgroup_writable is None)
    assert m.cgroup_writable in (None, "all", "some", "none") and (m.cgroup_writable == "all") == (not m.read_only
                                                                                                  and m.cgroup is not None)
    assert m.netns in (None, True, False) and m.netfilter in (None, "ok", "denied", "missing")


@given(st.sampled_from(["none", "docker", "lxc", "podman"]), st.sets(st.sampled_from(["/.dockerenv", "/run/.containerenv"])),
       st.booleans(), st.sampled_from(["ok", "denied"]), st.sampled_from(["ok", "denied", "missing"]))
def test_parse_machine_reads_back_what_the_probe_prints(virt, markers, rw, netns, netfilter):
    lines = [f"virt {virt}", *(f"marker {m}" for m in sorted(markers)),
             V2_RW if rw else V2_RO, f"netns {netns}", f"netfilter {netfilter}"]
    assert p.parse_machine(lines) == MachineKind(virt, sorted(markers), "v2", "all" if rw else "none",
                                                 [] if rw else ["/"], netns == "ok", netfilter)
