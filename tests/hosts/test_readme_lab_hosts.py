"""The README's "Try it on this machine" block, run as written: each line through the shell
from the repository root, `python`, `bootstrap`, `kubectl` and `helm` from the PATH (the
real clients; no BOOTSTRAP_HELM), the shipped inventories/lab.yaml unedited. The state
folder and ~/.kube/config are a temporary folder's (XDG_STATE_HOME, HOME; no KUBECONFIG), so
nothing of the user's is touched. Each step's exit code and what it printed are checked; a
step the README gains without a check here fails too."""

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import testhosts

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
HEADING = "### Try it on this machine"
LAB = yaml.safe_load((ROOT / "inventories" / "lab.yaml").read_text())
NODES = [n["name"] for n in LAB["nodes"]]
GPU_NODES = [n for n in NODES if n.startswith("gpu-")]


def readme_lab_commands(text: str | None = None) -> list[str]:
    """The commands of the first ```sh block under the heading, comments dropped, each as
    shlex.join writes it (the key of its check below)."""
    lines = (README.read_text() if text is None else text).splitlines()
    start = lines.index(HEADING)
    fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```sh")
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    words = (shlex.split(line, comments=True) for line in lines[fence + 1:end])
    return [shlex.join(w) for w in words if w]


# --------------------------------------------------------------------------- the checks
# Each gets the step's CompletedProcess (stdout and stderr) and the run's folders.


def answers_ssh(address: str) -> bool:
    """An SSH server's banner comes back (a bare connect is not enough: where no lab bridge
    routes the address, something on the way may accept any TCP connection)."""
    try:
        with socket.create_connection((address, 22), timeout=2) as conn:
            conn.settimeout(2)
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def k3s_left(name: str) -> str:
    host = testhosts.TestHost.load(name)
    return host.ssh("ls /usr/local/bin/k3s /etc/rancher/k3s /var/lib/rancher/k3s 2>/dev/null; true").stdout.strip()


def lab_up(done, run):
    assert re.search(r"^3 host\(s\) up", done.stdout, re.M), done.stdout
    assert "no k3s air-gap folder" not in done.stderr and "no lab charts" not in done.stderr, done.stderr
    for chart in LAB["charts"].values():  # what inventories/lab.yaml names is there
        assert Path(chart["archive"]).is_file(), chart
    assert Path(LAB["k3s"]["airgap"]).is_dir()
    assert all(answers_ssh(n["address"]) for n in LAB["nodes"])


def check(done, run):
    assert "inventories/lab.yaml: valid: cluster lab, 1 server(s), 2 agent(s)" in done.stdout


def facts(done, run):
    for name in NODES:
        assert re.search(rf"^{name} \(10\.200\.0\.\d+\) hostname {name}$", done.stdout, re.M), done.stdout
    assert done.stdout.count("1 x NVIDIA H200") == len(GPU_NODES)
    assert len(re.findall(r"^  k3s +not installed$", done.stdout, re.M)) == len(NODES), done.stdout


def plan(done, run):
    for name in NODES:
        assert f"{name}:\n" in done.stdout
    assert "install nvidia-container-toolkit" in done.stdout
    assert "component gpu-operator: install gpu-operator v26.7.0" in done.stdout


def up(done, run):
    assert "cluster: 2 release(s) applied" in done.stdout, done.stdout
    for name in GPU_NODES:
        assert f"PASS  gpu-pod:{name}" in done.stdout and f"PASS  gpu-capacity:{name}" in done.stdout
    assert "FAIL" not in done.stdout and "snapshot: " in done.stdout


def status(done, run):
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] and
            line.split()[0] in NODES}
    assert set(rows) == set(NODES), done.stdout
    assert all(row[2] == "Ready" for row in rows.values()), done.stdout
    assert all(rows[name][-1] == "nvidia.com/gpu=4" for name in GPU_NODES), done.stdout
    assert "component gpu-operator: v26.7.0 (applied)" in done.stdout


def validate(done, run):
    passed = re.findall(r"^PASS  (\S+)", done.stdout, re.M)
    assert {f"gpu-pod:{n}" for n in GPU_NODES} | {"pvc", "volcano-gang"} <= set(passed), done.stdout
    assert "FAIL" not in done.stdout


def kubeconfig_merge(done, run):
    config = run["home"] / ".kube" / "config"
    assert f"merged into {config} as context bootstrap-lab" in done.stdout, done.stdout
    assert config.stat().st_mode & 0o777 == 0o600
    merged = yaml.safe_load(config.read_text())
    assert [c["name"] for c in merged["contexts"]] == ["bootstrap-lab"]
    (cluster,) = merged["clusters"]
    assert cluster["cluster"]["server"] == "https://10.200.0.11:6443"
    assert "certificate-authority-data" in cluster["cluster"]  # verified, not skipped


def kubectl_nodes(expected):
    def check_nodes(done, run):
        lines = done.stdout.splitlines()
        assert lines[0].split()[:2] == ["NAME", "STATUS"], done.stdout
        assert {line.split()[0]: line.split()[1] for line in lines[1:]} == {n: "Ready" for n in expected}
    return check_nodes


def kill_gpu_2(done, run):
    assert "gpu-2 killed" in done.stdout
    assert not answers_ssh("10.200.0.13") and answers_ssh("10.200.0.12")


def rebuild_after_loss(done, run):
    # Run at once after the loss: gpu-2's Node may still say Ready (the node controller's
    # grace period), so it is named as not answering, not removed; never waited for.
    assert re.search(r"^rebuild done in [\d.]+s: .*(lost gpu-2|not answering gpu-2)", done.stdout, re.M), done.stdout
    assert done.stdout.index("gpu-2: left out of this rebuild") < done.stdout.index("rebuild done in")
    assert done.stdout.strip().splitlines()[-1] == (
        "gpu-2 is gone: rent a replacement, put its address in the inventory, run rebuild again "
        "(or remove gpu-2 from the inventory)"), done.stdout
    assert "PASS  gpu-pod:gpu-1" in done.stdout and "FAIL" not in done.stdout
    assert run["took"] < 60, f"rebuild with gpu-2 gone took {run['took']:.0f}s"


def replacement_up(done, run):
    assert "1 host(s) up" in done.stdout and answers_ssh("10.200.0.13")


def rebuild_replaced(done, run):
    assert "gpu-2: forgot the pinned host key of the replaced machine" in done.stdout, done.stdout
    assert re.search(r"^rebuild done in [\d.]+s: .*joined gpu-2;", done.stdout, re.M), done.stdout
    assert "PASS  gpu-pod:gpu-2" in done.stdout and "FAIL" not in done.stdout


def scale_down(done, run):
    assert "gpu-2: k3s stopped; removed from the cluster" in done.stdout, done.stdout
    assert "now remove from inventories/lab.yaml: the node named gpu-2" in done.stdout
    assert "k3s" not in k3s_left("gpu-2")


def down(done, run):
    assert "removed k3s from 2 host(s)" in done.stdout, done.stdout
    assert all(k3s_left(name) == "" for name in NODES), {name: k3s_left(name) for name in NODES}


def lab_down(done, run):
    assert "test hosts removed" in done.stdout
    assert testhosts.known_hosts() == [] and testhosts._apt_server_pid() is None
    assert not any(answers_ssh(n["address"]) for n in LAB["nodes"])


CHECKS = {
    "python tests/testhosts.py up": lab_up,
    "bootstrap check inventories/lab.yaml": check,
    "bootstrap facts inventories/lab.yaml": facts,
    "bootstrap plan inventories/lab.yaml": plan,
    "bootstrap up inventories/lab.yaml": up,
    "bootstrap status inventories/lab.yaml": status,
    "bootstrap validate inventories/lab.yaml": validate,
    "bootstrap kubeconfig inventories/lab.yaml --merge": kubeconfig_merge,
    "kubectl --context bootstrap-lab get nodes": kubectl_nodes(NODES),
    "python tests/testhosts.py kill gpu-2": kill_gpu_2,
    "bootstrap rebuild inventories/lab.yaml": rebuild_after_loss,
    "python tests/testhosts.py up gpu-2": replacement_up,
    "bootstrap rebuild inventories/lab.yaml --replace gpu-2": rebuild_replaced,
    "bootstrap scale-down inventories/lab.yaml --node gpu-2 --yes": scale_down,
    "bootstrap down inventories/lab.yaml --yes": down,
    "python tests/testhosts.py down": lab_down,
}


def checks_in_order(commands: list[str]) -> list:
    """The check of each command, in the block's order; a command with none (or used more
    often than it has checks) is an AssertionError naming it."""
    seen: dict[str, int] = {}
    out = []
    for command in commands:
        assert command in CHECKS, f"README step {command!r} has no check in {__name__}"
        known = CHECKS[command] if isinstance(CHECKS[command], list) else [CHECKS[command]]
        index = seen.get(command, 0)
        assert index < len(known), f"README step {command!r} appears more often than it has checks"
        seen[command] = index + 1
        out.append(known[index])
    return out


# --------------------------------------------------------------------------- the run


def user_env(tmp_path: Path) -> dict:
    """A user's shell: the venv's bin first on PATH (its `python` and `bootstrap`), the
    state folder and home in tmp_path, no BOOTSTRAP_* overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSTRAP_") and k != "KUBECONFIG"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", HOME=str(tmp_path / "home"),
               XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def test_the_readme_lab_sequence_runs_as_written(tmp_path):
    why = testhosts.requirements_missing()
    if why:
        pytest.skip(why)
    if os.environ.get("BOOTSTRAP_LAB_DIR", "/var/tmp/bootstrap-lab") != "/var/tmp/bootstrap-lab":
        pytest.skip("inventories/lab.yaml names /var/tmp/bootstrap-lab; BOOTSTRAP_LAB_DIR points elsewhere")
    env = user_env(tmp_path)
    (tmp_path / "home").mkdir()
    missing = [tool for tool in ("bootstrap", "kubectl", "helm") if not shutil.which(tool, path=env["PATH"])]
    if missing:
        pytest.skip(f"the README's path needs {', '.join(missing)} on PATH (.ci/run installs them)")
    commands = readme_lab_commands()
    steps = checks_in_order(commands)
    assert commands[0] == "python tests/testhosts.py up" and commands[-1] == "python tests/testhosts.py down"
    run = {"home": tmp_path / "home", "state": tmp_path / "state"}
    timings = []
    try:
        for command, step in zip(commands, steps):
            started = time.monotonic()
            done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=600, stdin=subprocess.DEVNULL)
            run["took"] = time.monotonic() - started
            timings.append(f"{run['took']:6.1f}s  {command}")
            assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            step(done, run)
    finally:
        print("\n".join(timings))
        if not commands or not timings or timings[-1].split("  ", 1)[1] != commands[-1]:
            subprocess.run([sys.executable, str(ROOT / "tests" / "testhosts.py"), "down"], capture_output=True,
                           timeout=300)
