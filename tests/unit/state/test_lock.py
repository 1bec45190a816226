"""One command at a time per cluster; the lock goes with the process that held it."""

import subprocess
import sys

import pytest

from clirun import run_bootstrap

INVENTORY = """\
cluster: locked
state_dir: {state}
ssh: {{user: root, connect_timeout: 1}}
nodes: [{{name: cp-1, address: 10.200.9.250, role: server}}]
"""

HOLD = """
import sys, time
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.lock import cluster_lock
from bootstrap.state.folder import StateDir
with cluster_lock(StateDir(load_inventory(sys.argv[1])), "up"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_second_command_refuses_while_the_first_runs_and_not_after_a_crash(tmp_path):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(INVENTORY.format(state=tmp_path / "state"))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(inventory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = run_bootstrap("up", inventory)
        assert second.returncode == 1
        assert "already working on this cluster" in second.stderr and "`up`" in second.stderr
        assert f"pid {holder.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        holder.kill()  # a crash: no cleanup runs
        holder.wait()
    after = run_bootstrap("up", inventory)
    assert "already working" not in after.stderr  # the kernel released the lock


@pytest.mark.parametrize("command", [["validate"], ["kubeconfig"], ["forget-host", "cp-1"], ["facts"], ["plan"],
                                     ["status"]], ids=lambda c: c[0])
def test_every_command_that_can_write_known_hosts_takes_the_lock(tmp_path, command):
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(INVENTORY.format(state=tmp_path / "state"))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(inventory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        known_hosts = tmp_path / "state" / "known_hosts"
        known_hosts.write_text("10.200.9.250 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
        second = run_bootstrap(command[0], inventory, *command[1:])
        assert second.returncode == 1, second.stdout + second.stderr
        assert "already working on this cluster" in second.stderr and "`up`" in second.stderr
        assert "10.200.9.250" in known_hosts.read_text()  # forget-host did not run
    finally:
        holder.kill()
        holder.wait()
