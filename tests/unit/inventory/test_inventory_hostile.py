"""The inventory is hostile input: YAML bombs, injected lines, look-alike characters and
names that break what the tool derives from them are refused before any host is touched;
what is accepted is shown to land harmlessly."""

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from clirun import BOOTSTRAP

from bootstrap.errors import Problem
from bootstrap.host.plan import k3sconfig
from bootstrap.host.parts.registries import registries_yaml
from bootstrap.inventory import cron, kube
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks import k3s_flags
from bootstrap.host.plan.join_tokens import JoinTokens

TOKENS = JoinTokens("tok", "agent-tok")
from test_inventory import MINIMAL, problems
from repo_paths import ROOT

GIB = 1 << 30
INVENTORY_CODE = sorted((ROOT / "bootstrap" / "inventory").glob("*.py"))


def check_bounded(path: Path) -> tuple[subprocess.CompletedProcess, float]:
    """`bootstrap check PATH` with its address space capped at 1 GiB: what a bomb would exceed."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

    command = [str(BOOTSTRAP)] if BOOTSTRAP.exists() else [sys.executable, "-m", "bootstrap"]
    started = time.monotonic()
    result = subprocess.run(command + ["check", str(path)], capture_output=True, text=True, timeout=60,
                            preexec_fn=limit)
    return result, time.monotonic() - started


def assert_refused_quickly(path: Path, line: int, words: str) -> None:
    result, seconds = check_bounded(path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert seconds < 5, f"took {seconds:.1f}s"
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert f"{path}:{line}:" in result.stderr, result.stderr[:2000]
    assert words in result.stderr


BILLION_LAUGHS = 'lol0: &lol0 "lol"\n' + "".join(
    f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 10)}]\n" for i in range(1, 10))


def test_billion_laughs_is_refused_without_expanding(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    assert_refused_quickly(path, 1, "anchor &lol0")


def test_many_aliases_up_to_the_size_cap_stay_bounded(tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("a: &x [1, 2, 3]\nb: [" + "*x, " * 200_000 + "]\n")
    assert_refused_quickly(path, 1, "anchor &x")


def test_recursive_alias_is_refused():
    found = problems("cluster: &a [*a]\n" + MINIMAL.split("\n", 1)[1])
    assert {p.message for p in found} >= {"unsupported YAML syntax: anchor &a", "unsupported YAML syntax: alias *a"}


@pytest.mark.parametrize("shape, line", [("[" * 100_000, 3), ("{a: " * 100_000, 3), ("[" * 900, 3),
                                         ("".join(f"{' ' * i}- \n" for i in range(1000)), 18)])
def test_deep_nesting_is_refused_without_recursion(tmp_path, shape, line):
    path = tmp_path / "deep.yaml"
    path.write_text("cluster: h\nx:\n" + shape + "\n")
    assert_refused_quickly(path, line, "syntax")  # beyond our depth, or beyond libyaml's own


def test_a_60_mb_file_is_refused_unread(tmp_path):
    path = tmp_path / "huge.yaml"
    with path.open("w") as out:
        out.write(MINIMAL)
        for _ in range(60):
            out.write(("#" * 1023 + "\n") * 1024)
    assert_refused_quickly(path, 1, "larger than 1024 KiB")


@pytest.mark.parametrize("body", [
    "".join(f"k{i}: 1\n" for i in range(120_000)),  # unknown keys, each with a did-you-mean
    "nodes:\n" + "  - a\n" * 170_000,  # list items of the wrong type
    "x: " + "a-" * 500_000,  # one long plain scalar
])
def test_the_worst_file_under_the_size_cap_is_quick(tmp_path, body):
    path = tmp_path / "big.yaml"
    path.write_text(("cluster: h\n" + body)[: (1 << 20) - 1])
    result, seconds = check_bounded(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert seconds < 5, f"took {seconds:.1f}s"
    assert len(result.stderr.splitlines()) < 300  # the first problems, not all of them


def test_text_over_the_cap_is_refused_by_parse_inventory_too():
    (problem,) = problems(MINIMAL + "#" * (1 << 20))
    assert problem.line == 1 and problem.path == "" and "larger than" in problem.message


def test_python_tags_never_run(tmp_path):
    marker = tmp_path / "ran"
    found = problems(f'cluster: !!python/object/apply:os.system ["touch {marker}"]\n'
                     + MINIMAL.split("\n", 1)[1])
    assert not marker.exists()
    assert found[0].path == "cluster" and "tag tag:yaml.org,2002:python/object/apply:os.system" in found[0].message


def test_not_utf8_is_refused_with_its_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(MINIMAL.encode() + "  - {name: caf\xe9, address: 10.0.0.2}\n".encode("latin-1"))
    assert_refused_quickly(path, 7, "not UTF-8")


def test_raw_control_character_is_refused_with_its_line():
    (problem,) = problems(MINIMAL + "labels: \x1b[2J\n")
    assert (problem.line, problem.column) == (7, 9) and "U+001B" in problem.message


def test_nan_and_infinity_are_refused_everywhere():
    for value in (".nan", ".inf", "-.inf", "1e999"):
        found = problems(MINIMAL + f"validate: {{nccl: {{min_busbw_gbps: {value}}}}}\n")
        assert [p.path for p in found] == ["validate.nccl.min_busbw_gbps"], value
    assert parse_inventory(MINIMAL + "validate: {nccl: {min_busbw_gbps: 1.5e+2}}\n").validate.nccl.min_busbw_gbps == 150


# ---- what a terminal shows ---------------------------------------------------------------------

def test_problem_render_escapes_what_a_terminal_would_act_on():
    problem = Problem("inv\x1b.yaml", 3, 1, "nodes.\x1b[2J", "bad \u202evalue\u2028next", "use \x9b")
    text = problem.render()
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u202e]", text)
    assert "inv\\x1b.yaml:3:1: nodes.\\x1b[2J: bad \\u202evalue\\u2028next" in text and "use \\x9b" in text


def test_a_key_cannot_fake_a_clean_result():
    found = problems(MINIMAL + '"\\e[2J\\e[H\\nall checks passed": x\n')
    rendered = "\n".join(p.render() for p in found)
    assert "\x1b" not in rendered and "\nall checks passed" not in rendered
    assert found[0].path == "\\x1b[2J\\x1b[H\\nall checks passed"


def test_no_pattern_in_the_inventory_code_uses_unicode_classes():
    assert {"loader.py", "schema.py", "model.py"} <= {p.name for p in INVENTORY_CODE}, INVENTORY_CODE
    for path in INVENTORY_CODE:
        code = path.read_text()
        assert not re.search(r"\\[dwsDWS]", code.replace("\\\\", "")), f"{path.name}: use [0-9] or an explicit class"


# ---- addresses ---------------------------------------------------------------------------------

@pytest.mark.parametrize("first, second", [("2001:db8::1", "2001:DB8:0::1"), ("box.example.com", "BOX.example.COM"),
                                           ("10.0.0.7", "10.0.0.7"), ("203.0.113.10", "::ffff:203.0.113.10")])
def test_one_address_in_two_spellings_is_a_duplicate(first, second):
    found = problems(MINIMAL.replace("203.0.113.10", f"'{first}'") + f"  - {{name: b, address: '{second}'}}\n")
    assert [p.path for p in found] == ["nodes[1].address"]


def test_one_private_address_behind_two_bastions_is_two_nodes():
    inv = parse_inventory(MINIMAL + "  - {name: a, address: 10.0.0.5, ssh: {jump: 'u@[2001:db8::9]:2222'}}\n"
                                    "  - {name: b, address: 10.0.0.5, ssh: {jump: u@bastion-2.example.com}}\n")
    assert [inv.ssh_for(n).jump for n in inv.agents] == ["u@[2001:db8::9]:2222", "u@bastion-2.example.com"]


@pytest.mark.parametrize("jump", ["bastion.example.com", "ubuntu@203.0.113.5", "ubuntu@203.0.113.5:2222",
                                  "u_1@[2001:db8::1]", "[2001:db8::1]:22"])
def test_plain_bastions_are_accepted(jump):
    assert parse_inventory(MINIMAL.replace("{user: ubuntu}", f"{{user: ubuntu, jump: '{jump}'}}")).ssh.jump == jump


@pytest.mark.parametrize("jump", ["u@2001:db8::1", "u@[10.0.0.1]", "u@host:0", "U@host", "a@b@host", "host:22:22",
                                  "u@[fe80::1%eth0]", "u@host name", "-J@host"])
def test_bastions_that_are_not_user_host_port_are_refused(jump):
    found = problems(MINIMAL.replace("{user: ubuntu}", f"{{user: ubuntu, jump: '{jump}'}}"))
    assert [p.path for p in found] == ["ssh.jump"], jump


# ---- k3s flags ---------------------------------------------------------------------------------

def test_the_flag_list_ships_in_the_package():
    assert k3s_flags.flags("agent") <= k3s_flags.flags("server")
    assert {"kubelet-arg", "kube-apiserver-arg", "node-label"} <= k3s_flags.flags("server")
    assert "kube-apiserver-arg" not in k3s_flags.flags("agent")


def test_the_shipped_flag_list_matches_upstream():
    from upstream import k3s_flags as upstream_flags

    assert k3s_flags.flags("server") == upstream_flags("server") | upstream_flags("agent")
    assert k3s_flags.flags("agent") == upstream_flags("agent")


def test_every_owned_flag_is_a_real_one():
    real = k3s_flags.flags("server")
    assert set(k3s_flags.OWNED) <= real
    assert {f for f in real if f.startswith("etcd-s3")} and all(k3s_flags.owned(f) for f in real
                                                                if f.startswith("etcd-s3"))


def test_accepted_flags_keep_lists_and_land_as_yaml():
    inv = parse_inventory(MINIMAL + """\
  - {name: gpu-1, address: 203.0.113.11}
k3s:
  server_config: {kube-apiserver-arg: ["audit-log-path=/var/log/a $(id).log"], secrets-encryption: true}
  agent_config: {kubelet-arg: ["max-pods=200"], lb-server-port: 6444}
""")
    server = k3sconfig.node_config(inv, inv.node("box-1"), TOKENS)
    agent = k3sconfig.node_config(inv, inv.node("gpu-1"), TOKENS)
    assert agent["kubelet-arg"][-1] == "max-pods=200" and agent["lb-server-port"] == 6444
    # A shell word in a value is data: config.yaml is written by a YAML dumper and read back the same.
    assert yaml.safe_load(k3sconfig.render(server))["kube-apiserver-arg"][-1] == "audit-log-path=/var/log/a $(id).log"


# ---- Kubernetes names --------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["pool", "example.com/pool", "node.kubernetes.io/instance-type",
                                 "kubelet.kubernetes.io/x", "team.node.kubernetes.io/a", "topology.kubernetes.io/zone",
                                 "kubernetes.io/arch", "beta.kubernetes.io/os", "A_b.c-D", "x" * 63,
                                 "a." * 126 + "b/" + "c"])
def test_label_keys_kubelet_takes(key):
    assert kube.node_label_key_error(key) is None


@pytest.mark.parametrize("key", ["node-role.kubernetes.io/worker", "kubernetes.io/role", "k8s.io/x", "sub.k8s.io/x",
                                 "x" * 64, "-a", "a-", "Example.com/a", "/a", "a/", "a/b/c", "a..b/c",
                                 "a." * 126 + "bb/" + "c"])
def test_label_keys_kubelet_or_the_api_server_refuses(key):
    assert kube.node_label_key_error(key)


@pytest.mark.parametrize("taint", ["gpu:NoSchedule", "gpu=:NoExecute", "example.com/gpu=true:PreferNoSchedule"])
def test_taints_accepted(taint):
    assert kube.taint_error(taint) is None


def test_derived_pod_names_are_cut_safely():
    base = "a" * 53 + "-"
    names = [base + "x" * 9, base + "y" * 9]
    derived = [kube.derived_name("gpu-test-", n) for n in names]
    assert len(set(derived)) == 2
    assert all(len(d) <= 63 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", d) for d in derived)
    assert kube.derived_name("gpu-test-", "box-1") == "gpu-test-box-1"
    inv = parse_inventory(MINIMAL + "".join(f"  - {{name: {n}, address: 10.0.0.{i}}}\n" for i, n in enumerate(names)))
    assert len(inv.agents) == 2


def test_an_interface_named_for_the_whole_cluster_and_a_node_is_one_interface():
    inv = parse_inventory(MINIMAL + "  - {name: gpu-1, address: 10.0.0.2, rdma_interfaces: [ib0, ib1]}\n"
                                    "network: {rdma: {interfaces: [ib0]}}\n")
    assert inv.nodes[1].rdma_interfaces == ("ib0", "ib1")


# ---- cron ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["0 */6 * * *", "@daily", "*/15 0-6,12 1-31/2 jan-DEC mon-fri", "0 0 ? * sun",
                                      "59 23 31 12 6", "5/10 * * * *"])
def test_cron_schedules_k3s_takes(schedule):
    assert cron.schedule_error(schedule) is None
    assert parse_inventory(MINIMAL + f"k3s: {{snapshots: {{schedule: '{schedule}'}}}}\n").k3s.snapshots.schedule


@pytest.mark.parametrize("schedule", ["* * * *", "0  0 * * *", "0 0 * * 7", "0 0 32 * *", "0 ? * * *", "a-b * * * *",
                                      "1-2-3 * * * *", "*/x * * * *", "@every 1h", "0 0 * * sat-sun"])
def test_cron_schedules_k3s_refuses(schedule):
    assert cron.schedule_error(schedule)


# ---- accepted, and harmless where it lands ---------------------------------------------------------

def test_ngc_user_name_lands_quoted_in_registries_yaml(monkeypatch):
    monkeypatch.setenv("NGC_KEY", "k")
    inv = parse_inventory(MINIMAL + "registries: {auth: {nvcr.io: {username: $oauthtoken, password_env: NGC_KEY}}}\n")
    from bootstrap.state.secrets import with_secret_values

    text = registries_yaml(with_secret_values(inv))
    assert yaml.safe_load(text)["configs"]["nvcr.io"]["auth"]["username"] == "$oauthtoken"


def test_local_paths_may_hold_any_printable_character():
    inv = parse_inventory(MINIMAL.replace("{user: ubuntu}", "{user: ubuntu, key: '/home/jos\u00e9/my keys/id'}"))
    assert inv.ssh.key == "/home/jos\u00e9/my keys/id"
    found = problems(MINIMAL.replace("{user: ubuntu}", '{user: ubuntu, key: "/home/x/id\\u202e"}'))
    assert [p.path for p in found] == ["ssh.key"]
