"""The two commands of the README's first screen (scripts/try-lab and scripts/test, with
scripts/try-lab-down) and .ci/run: valid bash (shellcheck too, where it is installed), one
source of truth for what is installed (scripts/lib/install.sh) and for what CI runs
(scripts/test). scripts/try-lab itself runs for real on the lab (see the report of issue 26:
`flock /tmp/bootstrap-hosttests.lock scripts/try-lab`, then scripts/try-lab-down)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from repo_paths import ROOT

SCRIPTS = [ROOT / "scripts" / name for name in ("test", "try-lab", "try-lab-down", "lib/install.sh", "lib/lab.sh")] \
    + [ROOT / ".ci" / "run"]
COMMANDS = [p for p in SCRIPTS if p.parent.name != "lib"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_script_is_valid_bash(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", "-x", "-P", str(ROOT), str(script)], capture_output=True, text=True,
                              cwd=ROOT)
        assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("script", COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_are_executable_and_install_only_through_the_shared_steps(script):
    assert os.access(script, os.X_OK)
    text = script.read_text()
    for duplicated in ("apt-get", "npm pack", "python3 -m venv", "pip install"):
        assert duplicated not in text, f"{script.name} installs by itself ({duplicated}): use scripts/lib/install.sh"


def test_ci_runs_exactly_the_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test \"\$@\"$", ci, re.MULTILINE)
    assert "pytest" not in ci.replace("runs\n# pytest", "")  # no second way of running the suite
    test = (ROOT / "scripts" / "test").read_text()
    assert re.search(r"^exec pytest \"\$@\"$", test, re.MULTILINE)
    for step in ("install_system_packages", "install_helm_kubectl", "install_venv"):
        assert re.search(rf"^{step}$", test, re.MULTILINE)


def test_the_lab_script_builds_the_shipped_lab_and_says_how_to_look_around():
    text = (ROOT / "scripts" / "try-lab").read_text()
    assert "require_root" in text and "tests/testhosts.py up" in text
    for command in ('bootstrap" up "$INVENTORY"', 'bootstrap" kubeconfig "$INVENTORY" --merge',
                    "bootstrap status $INVENTORY", "kubectl --context $CONTEXT get nodes", "bootstrap down $INVENTORY"):
        assert command in text
    # Run again, the machines stay (testhosts.py up would replace them); new ones forget the old pins.
    assert "if lab_running; then" in text and "forget_old_lab" in text
    down = (ROOT / "scripts" / "try-lab-down").read_text()
    assert 'down "$INVENTORY" --yes' in down and "forget_old_lab" in down and "tests/testhosts.py down" in down


def test_the_lab_names_are_the_shipped_inventorys_and_the_context_the_one_the_tool_writes():
    import yaml

    from bootstrap.cluster.kubeconfig_file import context_name
    from bootstrap.inventory.loader import load_inventory

    lab = (ROOT / "scripts" / "lib" / "lab.sh").read_text()
    inventory = load_inventory(str(ROOT / re.search(r"^INVENTORY=(\S+)$", lab, re.MULTILINE).group(1)))
    assert re.search(rf"^CONTEXT={context_name(inventory)} ", lab, re.MULTILINE)
    nodes = re.search(r"^NODES=\((.*)\)$", lab, re.MULTILINE).group(1).split()
    assert nodes == [n["name"] for n in yaml.safe_load((ROOT / "inventories" / "lab.yaml").read_text())["nodes"]]


def test_the_readme_names_both_commands_on_its_first_screen():
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for command in ("scripts/try-lab", "scripts/try-lab-down", "scripts/test"):
        assert command in first_screen
    assert "root" in first_screen


def test_the_shared_steps_refuse_to_run_the_lab_without_root(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root: nothing to refuse")
    result = subprocess.run(["bash", "-c", ". scripts/lib/install.sh; require_root"], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 2 and "run it as root" in result.stderr


def test_the_python_picked_is_3_11_or_newer():
    result = subprocess.run(["bash", "-c", ". scripts/lib/install.sh; p=$(pick_python); "
                             "$p -c 'import sys; print(sys.version_info >= (3, 11))'"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.stdout.strip() == "True", result.stderr
