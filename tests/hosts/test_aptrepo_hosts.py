"""On a test host, the tool's exact apt commands against the stand-in flat apt repository
(tests/standins/aptrepo.py; the repository itself is tested in tests/standin_tests/test_aptrepo.py)."""

from __future__ import annotations

import shlex
import time

import pytest

from standins.aptrepo import AptRepo, build_toolkit_deb, build_toolkit_debs
from standin_tests.test_aptrepo import APT_HOLD, APT_INSTALL, APT_UPDATE, LIST


def _root(host, cmd: str, timeout: float = 120):
    return host.ssh(cmd, user="root", timeout=timeout)


def _fetch_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.split(":", 1)[0] in ("Get", "Hit", "Ign", "Err")]


@pytest.mark.hosts
def test_tool_apt_commands_install_from_the_repo(lab, tmp_path, record_property):
    (host,) = lab.start(["ap-1"])
    deb = build_toolkit_deb(tmp_path)
    with AptRepo([deb]) as repo:  # after lab.start: the bridge address exists now
        _root(host, f"printf '%s\\n' {shlex.quote(repo.source_line)} > {LIST}")

        t0 = time.monotonic()
        update = _root(host, APT_UPDATE, timeout=60)
        t1 = time.monotonic()
        install = _root(host, APT_INSTALL, timeout=120)
        t2 = time.monotonic()
        record_property("apt_update_s", round(t1 - t0, 2))
        record_property("apt_install_s", round(t2 - t1, 2))
        print(f"ap-1: apt-get update {t1 - t0:.2f}s, apt-get install {t2 - t1:.2f}s")

        # Only our source was tried: nothing about the Debian mirror (unreachable from the
        # hosts; a plain "apt-get update" there waits on DNS for about 90 s), and fast.
        fetched = _fetch_lines(update.stdout)
        assert fetched and all(f"{repo.host}:{repo.port}" in line for line in fetched), update.stdout
        assert "debian" not in update.stdout + update.stderr
        assert t1 - t0 < 20
        # List-Cleanup=0 kept the Debian lists the rootfs came with
        lists = _root(host, "ls /var/lib/apt/lists").stdout.split()
        assert any(name.startswith("deb.debian.org_") for name in lists), lists
        assert f"{repo.host}:{repo.port}_._Packages" in lists

        assert f"Get:1 {repo.url.rstrip('/')} ./ nvidia-container-toolkit 1.17.8-1" in install.stdout
        assert repo.fetched("Release") and repo.fetched("Packages.gz")
        assert repo.fetched(deb.name)

        _root(host, "test -x /usr/bin/nvidia-container-runtime && test -x /usr/bin/nvidia-ctk")
        assert _root(host, "nvidia-ctk --version").stdout.startswith("NVIDIA Container Toolkit CLI version 1.17.8\n")
        status = _root(host, "dpkg -s nvidia-container-toolkit").stdout
        assert "Status: install ok installed" in status and "Version: 1.17.8-1" in status

        assert "nvidia-container-toolkit set on hold." in _root(host, APT_HOLD).stdout
        assert _root(host, "apt-mark showhold").stdout.split() == ["nvidia-container-toolkit"]
        assert "Status: hold ok installed" in _root(host, "dpkg -s nvidia-container-toolkit").stdout
        # rerunning the same steps (same version in the repo) is a no-op that succeeds
        _root(host, APT_UPDATE)
        again = _root(host, APT_INSTALL)
        assert "nvidia-container-toolkit is already the newest version (1.17.8-1)." in again.stdout
        assert _root(host, APT_HOLD).stdout.strip() == "nvidia-container-toolkit was already set on hold."


@pytest.mark.hosts
def test_hold_against_a_newer_version_and_the_split_packages(lab, tmp_path):
    """Once held, a newer toolkit in the repository is kept back by upgrades, and the tool's
    own install command then FAILS (apt refuses to change a held package under -y); after
    unhold, the install pulls the newer version's dependencies from the same flat repo."""
    (host,) = lab.start(["ap-2"])
    old = build_toolkit_deb(tmp_path / "old")
    new = build_toolkit_debs(tmp_path / "new", version="1.17.9-1")
    with AptRepo([old]) as repo_old, AptRepo(new) as repo_new:
        _root(host, f"printf '%s\\n' {shlex.quote(repo_old.source_line)} > {LIST}")
        _root(host, f"{APT_UPDATE} && {APT_INSTALL} && {APT_HOLD}")

        _root(host, f"printf '%s\\n' {shlex.quote(repo_new.source_line)} > {LIST}")
        _root(host, APT_UPDATE)
        upgrade = _root(host, "DEBIAN_FRONTEND=noninteractive apt-get upgrade -y")
        assert "The following packages have been kept back:\n  nvidia-container-toolkit" in upgrade.stdout
        refused = host.ssh(APT_INSTALL, user="root", check=False, timeout=120)
        assert refused.returncode == 100
        assert "Held packages were changed and -y was used without --allow-change-held-packages" in refused.stderr
        assert _root(host, "dpkg-query -W -f '${Version}' nvidia-container-toolkit").stdout == "1.17.8-1"

        _root(host, "apt-mark unhold nvidia-container-toolkit")
        _root(host, APT_INSTALL)
        versions = _root(host, "dpkg-query -W -f '${Package} ${Version}\\n' nvidia-container-toolkit "
                               "nvidia-container-toolkit-base libnvidia-container-tools").stdout.splitlines()
        assert sorted(versions) == ["libnvidia-container-tools 1.17.9-1", "nvidia-container-toolkit 1.17.9-1",
                                    "nvidia-container-toolkit-base 1.17.9-1"]
        assert _root(host, "nvidia-ctk --version").stdout.startswith("NVIDIA Container Toolkit CLI version 1.17.9\n")
        assert all(repo_new.fetched(d.name) for d in new)
