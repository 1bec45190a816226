"""The holds `up` places and `down --purge-drivers` lifts, run against a real dpkg database with
this machine's apt and dpkg (an admindir in a temp folder; nothing of the machine's own).

apt-get purge -y refuses to change a held package and then removes nothing of its whole list
("Held packages were changed and -y was used without --allow-change-held-packages", exit 100):
every hold the tool placed, the driver's that an install brings included, must be lifted first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts import packages
from bootstrap.host.parts.base import Action, Draft
from bootstrap.host.parts.manifest import STATE_DIR
from bootstrap.host.plan.host_plan import HostPlan
from bootstrap.inventory.model import Node

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("apt-get", "apt-mark", "dpkg", "dpkg-query")),
    reason="needs root and apt-get, apt-mark, dpkg (the Debian tools)")

DRIVER = "nvidia-driver-550"
CAME_WITH = "libnvidia-compute-550"  # the driver's dependency: installed with it, named by no plan
OPERATORS = "libnvidia-gl-550"  # held by the host's operator before the tool came


def stanza(name: str, status: str, depends: str = "") -> str:
    return (f"Package: {name}\nStatus: {status}\nPriority: optional\nSection: non-free/libs\nInstalled-Size: 10\n"
            f"Maintainer: t <t@example.com>\nArchitecture: amd64\nVersion: 550.127.05-1\n"
            + (f"Depends: {depends}\n" if depends else "") + "Description: test package\n\n")


class Host:
    """A dpkg database and apt configuration in `root`; the tool's state folder under it."""

    def __init__(self, root: Path):
        self.root = root
        self.admin = root / "dpkg"
        for d in ("dpkg/info", "dpkg/updates", "cache/archives/partial", "lists/partial", "etc/parts",
                  "etc/preferences.d", "etc/sources.list.d", "log", "state"):
            (root / d).mkdir(parents=True)
        (self.admin / "available").touch()
        (root / "apt.conf").write_text(
            f'Dir::State "{root}";\nDir::State::status "{self.admin}/status";\nDir::State::lists "{root}/lists";\n'
            f'Dir::Cache "{root}/cache";\nDir::Etc::sourcelist "/dev/null";\n'
            f'Dir::Etc::sourceparts "{root}/etc/sources.list.d";\nDir::Etc::parts "{root}/etc/parts";\n'
            f'Dir::Etc::preferencesparts "{root}/etc/preferences.d";\nDir::Log "{root}/log";\n'
            f'DPkg::Options {{ "--admindir={self.admin}"; "--log={root}/log/dpkg.log"; }};\n'
            'Debug::NoLocking "true";\n')
        self.env = {**os.environ, "APT_CONFIG": str(root / "apt.conf"), "DPKG_ADMINDIR": str(self.admin),
                    "DEBIAN_FRONTEND": "noninteractive"}

    def status(self, text: str) -> None:
        (self.admin / "status").write_text(text)

    def run(self, lines: list[str]) -> subprocess.CompletedProcess:
        script = "\n".join(lines).replace(STATE_DIR, str(self.root / "state"))
        return subprocess.run(["sh", "-c", script], env=self.env, capture_output=True, text=True, timeout=120)

    def selections(self) -> dict[str, str]:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n"], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        return {line.split()[0]: line.split()[1] for line in out.splitlines()}


def install_with_driver(host: Host) -> dict:
    """`up` with gpu.driver: host on a node without a driver: the plan's install, as dpkg has it
    afterwards, then the plan's hold lines. Returns the manifest the plan recorded."""
    draft = Draft(HostPlan(node=Node(name="g", address="10.0.0.2"), unit="k3s-agent"), {})
    facts = HostFacts(packages={OPERATORS: "550.127.05-1"}, held_packages=[OPERATORS])
    packages.plan(draft, [DRIVER], None, facts)
    assert Action.HOLD_PACKAGES in draft.plan.actions
    host.status(stanza(OPERATORS, "hold ok installed") + stanza(DRIVER, "install ok installed", CAME_WITH)
                + stanza(CAME_WITH, "install ok installed"))
    holds = [line for line in draft.plan.prepare if "apt-mark hold" in line]
    done = host.run(holds)
    assert done.returncode == 0, done.stderr
    assert host.selections() == {DRIVER: "hi", CAME_WITH: "hi", OPERATORS: "hi"}
    return draft.manifest


def test_down_purge_drivers_unholds_the_driver_that_came_with_the_install_and_purges_it(tmp_path):
    host = Host(tmp_path)
    recorded = install_with_driver(host)
    assert DRIVER in recorded["packages_held"]
    lines, kept = packages.teardown(recorded, purge_drivers=True, toolkit_source=None)
    done = host.run([line.replace(" >/dev/null", "") for line in lines])
    assert done.returncode == 0, done.stderr
    assert "Held packages were changed" not in done.stderr
    after = host.selections()
    assert DRIVER not in after  # purged
    assert after[CAME_WITH] == "ii"  # the hold the install placed is lifted
    assert after[OPERATORS] == "hi"  # the operator's hold is not the tool's to lift
    assert kept == {}


def test_an_older_manifest_that_does_not_list_the_drivers_hold_still_purges(tmp_path):
    """A manifest written before the driver's hold was recorded: the purge unholds what it purges."""
    host = Host(tmp_path)
    recorded = {**install_with_driver(host), "packages_held": []}
    lines, _ = packages.teardown(recorded, purge_drivers=True, toolkit_source=None)
    assert host.run(lines).returncode == 0
    assert DRIVER not in host.selections()


def test_down_without_purge_drivers_keeps_the_driver_and_every_hold_for_a_later_purge(tmp_path):
    host = Host(tmp_path)
    recorded = install_with_driver(host)
    lines, kept = packages.teardown(recorded, purge_drivers=False, toolkit_source=None)
    assert host.run(lines).returncode == 0
    assert host.selections() == {DRIVER: "hi", CAME_WITH: "hi", OPERATORS: "hi"}
    assert kept["packages_held"] == [DRIVER]
    lines, _ = packages.teardown(kept, purge_drivers=True, toolkit_source=None)  # the later --purge-drivers
    assert host.run(lines).returncode == 0
    assert host.selections() == {CAME_WITH: "ii", OPERATORS: "hi"}


def test_a_record_with_no_package_name_in_it_unholds_nothing(tmp_path):
    """The host's own record is read in that host's shell: only package-form names count, and
    none means no dpkg-query at all (without names it would list, and unhold, every package)."""
    host = Host(tmp_path)
    install_with_driver(host)
    record = tmp_path / "state" / Path(packages.HELD_ON_HOST).name
    record.write_text("$(touch /tmp/owned)\n../../x\n*\n")
    assert host.run([packages.unhold_recorded_on_host()]).returncode == 0
    assert host.selections() == {DRIVER: "hi", CAME_WITH: "hi", OPERATORS: "hi"}


def test_a_purge_that_fails_fails_the_host_and_keeps_the_record(tmp_path):
    """The driver's prerm fails (dpkg's error, apt's exit 100): the host fails with the reason and
    what follows (the manifest's removal) does not run. The script ended `exit 0` before, and
    the record of what the tool installed went with the state folder."""
    host = Host(tmp_path)
    recorded = install_with_driver(host)
    prerm = host.admin / "info" / f"{DRIVER}.prerm"
    prerm.write_text("#!/bin/sh\necho 'prerm: the driver is in use' >&2\nexit 1\n")
    prerm.chmod(0o755)
    lines, _ = packages.teardown(recorded, purge_drivers=True, toolkit_source=None)
    done = host.run([*lines, f"touch {tmp_path}/record-removed"])
    assert done.returncode == 1
    assert "apt-get purge failed" in done.stderr and "the record of what bootstrap installed is kept" in done.stderr
    assert not (tmp_path / "record-removed").exists()
    assert DRIVER in host.selections()
