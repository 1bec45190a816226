"""The local test hosts themselves: boot, SSH, network, spot loss, restart, cleanup."""

import os
import subprocess
import time
from pathlib import Path

import pytest

import testhosts

pytestmark = pytest.mark.hosts


def _tcp_ok(host, address, port=22):
    probe = f"import socket; socket.create_connection(({address!r}, {port}), 3).close()"
    return host.ssh(f"python3 -c {probe!r}", check=False).returncode == 0


def _pids(hosts):
    """nspawn and everything in the hosts' namespaces."""
    pids = {h.pid for h in hosts}
    for h in hosts:
        out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout
        pids.update(int(p) for p in out.split())
    return pids


def _leftovers(hosts, pids):
    return {
        "netns": {h.netns for h in hosts if Path("/run/netns", h.netns).exists()},
        "veths": {h.veth for h in hosts if Path("/sys/class/net", h.veth).exists()},
        "processes": {p for p in pids if Path(f"/proc/{p}").exists()},
        "dirs": {h.name for h in hosts if h.dir.exists()},
    }


def test_three_hosts_boot_talk_die_and_come_back(lab, tmp_path):
    # Names of our own: a concurrent run of this test on the machine need not wait for us.
    names = [f"t{os.getpid()}-{x}" for x in "abc"]
    # A crashed earlier run left a namespace and a veth behind.
    stale = testhosts.TestHost(names[0], "")
    subprocess.run(["ip", "netns", "add", stale.netns], check=True)
    subprocess.run(["ip", "link", "add", stale.veth, "type", "veth", "peer", "name", f"x{os.getpid()}"], check=True)
    if not testhosts.NVIDIA_SMI_STANDIN.exists():
        placeholder = tmp_path / "nvidia-smi"
        placeholder.write_text("#!/bin/sh\necho 'GPU 0: placeholder'\n")
        lab.nvidia_smi = placeholder
    marker = {"/etc/bootstrap-test/marker": (b"hello\n", 0o600)}

    t0 = time.monotonic()
    a, b, c = lab.start(names, gpu=[names[2]], extra_files=marker)
    started = time.monotonic() - t0
    print(f"3 hosts ready in {started:.1f}s; boot to SSH: "
          + ", ".join(f"{h.name} {h.boot_seconds:.1f}s" for h in (a, b, c)))

    # Own name, own address, own host key; both users; passwordless sudo.
    keys = set()
    for h in (a, b, c):
        assert h.ssh("hostname").stdout.strip() == h.name
        assert h.ssh("sudo -n id -u").stdout.strip() == "0"
        assert h.ssh("id -u", user="root").stdout.strip() == "0"
        assert f"{h.address}/24" in h.ssh("ip -4 -o addr show eth0").stdout
        assert h.ssh("sudo stat -c '%a %s' /etc/bootstrap-test/marker").stdout.split() == ["600", "6"]
        keys.add(h.host_key())
    assert len(keys) == 3
    assert len({h.ssh("cat /etc/machine-id").stdout for h in (a, b, c)}) == 3

    # GPU stand-in only where asked for.
    assert c.ssh("stat -c %a /usr/bin/nvidia-smi").stdout.strip() == "755"
    assert c.ssh("nvidia-smi -L").stdout.startswith("GPU 0")
    assert c.ssh(f"test -d {testhosts.GPU_FIXTURES_REMOTE}", check=False).returncode == 0
    assert a.ssh("command -v nvidia-smi", check=False).returncode != 0

    # Hosts reach each other (TCP to sshd).
    for src, dst in ((a, b), (b, c), (c, a)):
        assert _tcp_ok(src, dst.address), f"{src.name} cannot reach {dst.name}"

    # The upper dir records what happens on the host after boot.
    assert a.created_files() == set()
    a.ssh("sudo mkdir -p /etc/rancher/k3s && echo x | sudo tee /etc/rancher/k3s/config.yaml >/dev/null")
    assert "etc/rancher/k3s/config.yaml" in a.created_files()
    a.ssh("sudo rm -r /etc/rancher")
    assert a.created_files() == set()

    # Spot loss: no answer at all; restart brings the same machine back.
    key_b = b.host_key()
    b.kill()
    assert not b.is_running()
    assert not _tcp_ok(a, b.address)
    b.restart()
    assert b.ssh("hostname").stdout.strip() == b.name
    assert b.host_key() == key_b
    assert _tcp_ok(a, b.address)

    # Host key change (key pinning tests) and a dead sshd.
    new_key = c.regenerate_host_key()
    assert new_key not in keys
    assert c.host_key() == new_key
    c.stop_sshd()
    assert c.ssh("true", check=False).returncode == 255

    pids = _pids((a, b, c))
    lab.cleanup()
    assert _leftovers((a, b, c), pids) == {"netns": set(), "veths": set(), "processes": set(), "dirs": set()}
    lab.cleanup()  # idempotent
