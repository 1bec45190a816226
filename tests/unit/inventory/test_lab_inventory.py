"""inventories/lab.yaml names what `python tests/testhosts.py up` builds (the lab charts at
the versions the tool installs), and the README's lab block has a check for each step in
the host test that runs it (tests/hosts/test_readme_lab_hosts.py), so neither drifts
without a test failing here, with no root and no test hosts."""

import shutil
from pathlib import Path

import pytest
import yaml
from clirun import run_bootstrap
from hosts.test_readme_lab_hosts import README, checks_in_order, readme_lab_commands

from bootstrap.cluster.components import versions
from repo_paths import ROOT

LAB = ROOT / "inventories" / "lab.yaml"
LAB_CHARTS = "/var/tmp/bootstrap-lab/charts"  # testhosts.LAB_CHARTS with the default BOOTSTRAP_LAB_DIR


def test_lab_inventory_names_every_lab_chart_at_the_tools_version():
    expected = {str(component): {"version": source.version,
                                 "archive": f"{LAB_CHARTS}/{source.chart}-{source.version}.tgz"}
                for component, source in versions.DEFAULTS.items() if source.chart}
    assert yaml.safe_load(LAB.read_text())["charts"] == expected


@pytest.mark.skipif(shutil.which("helm") is None, reason="the real helm is not on PATH (CI installs it)")
def test_lab_inventory_checks_with_the_charts_testhosts_builds(tmp_path):
    from labcharts import lab_charts

    built = lab_charts(tmp_path / "charts")  # what `testhosts.py up` runs, into LAB_CHARTS
    assert {c: Path(v["archive"]).name for c, v in built.items()} == \
        {c: Path(v["archive"]).name for c, v in yaml.safe_load(LAB.read_text())["charts"].items()}
    copy = tmp_path / "lab.yaml"
    copy.write_text(LAB.read_text().replace(LAB_CHARTS, str(tmp_path / "charts")))
    result = run_bootstrap("check", copy)
    assert result.returncode == 0, result.stderr
    assert "valid: cluster lab, 1 server(s), 2 agent(s)" in result.stdout


def test_every_step_of_the_readme_lab_block_has_a_check():
    commands = readme_lab_commands()
    assert commands[0] == "python tests/testhosts.py up" and commands[-1] == "python tests/testhosts.py down"
    assert len(checks_in_order(commands)) == len(commands)
    for needed in ("bootstrap up inventories/lab.yaml", "bootstrap kubeconfig inventories/lab.yaml --merge",
                   "kubectl --context bootstrap-lab get nodes", "bootstrap rebuild inventories/lab.yaml",
                   "bootstrap down inventories/lab.yaml --yes"):
        assert needed in commands


def test_a_readme_step_without_a_check_is_refused():
    text = README.read_text().replace("bootstrap status inventories/lab.yaml\n",
                                      "bootstrap status inventories/lab.yaml\nbootstrap snapshot inventories/lab.yaml\n")
    with pytest.raises(AssertionError, match="bootstrap snapshot inventories/lab.yaml"):
        checks_in_order(readme_lab_commands(text))
