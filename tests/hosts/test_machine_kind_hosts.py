"""A "GPU pod" is refused before any change; a systemd container with what k3s needs passes.

The lab's machines are systemd-nspawn containers with their own systemd and network; on this
cgroup-v1 machine their cgroup controllers are read-only (their systemd's own hierarchy is
not): they pass with a warning that real k3s's kubelet could not create pod cgroups there.
One is made to look like a docker "GPU pod" as far as this machine can honestly make one:
docker's marker file /.dockerenv, and every cgroup mount remounted read-only as docker
mounts them for a container that is not privileged. PID 1 stays
systemd (a lab machine without systemd as PID 1 would not boot sshd the way the lab does);
PID 1, network namespaces and netfilter refused are covered by the unit fixtures
(tests/unit/checks/test_machine_kind.py), read from the same probe words."""

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

import testhosts

pytestmark = pytest.mark.hosts

READ_ONLY_CGROUPS = (
    "awk '($5 == \"/sys/fs/cgroup\" || index($5, \"/sys/fs/cgroup/\") == 1) && $0 ~ / - cgroup2? / "
    "{ print $5 }' /proc/self/mountinfo | while read -r m; do mount -o remount,bind,ro \"$m\" || exit 1; done")


def test_a_container_without_writable_cgroups_is_refused_and_the_lab_container_passes(lab, tmp_path, airgap):
    cp, pod = lab.start(["mk-cp", testhosts.HostSpec("mk-pod")], extra_files=None)
    pod.ssh("touch /.dockerenv && " + READ_ONLY_CGROUPS, user="root")
    inventory = write_inventory(tmp_path / "inv.yaml", [cp, pod], extra={"k3s": {"airgap": str(airgap)}})

    check = run_bootstrap("check", inventory, "--hosts")
    out = check.stdout
    assert check.returncode == 1, out + check.stderr
    assert "FAIL mk-pod: machine: a container (systemd-detect-virt --container: systemd-nspawn; /.dockerenv " \
           "exists) that cannot run k3s: cgroup" in out, out
    assert "is mounted read-only (kubelet creates a cgroup per pod)" in out
    assert "fix: rent a VM or bare-metal offer instead" in out
    assert "WARN mk-cp: machine: a container (systemd-detect-virt --container: systemd-nspawn) whose cgroup v1 " \
           "controllers are mounted read-only (" in out, out
    assert "FAIL mk-cp" not in out and "no host was changed" in check.stderr
