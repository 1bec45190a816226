"""The NCCL job's SSH keys: drawn per run, the private key in the launcher's pod only, so root
on a node that runs a worker cannot log in to another node's worker (with Volcano's `ssh`
plugin every pod held the one key, and every worker's sshd took it)."""

import kubernetes_validate
from cryptography.hazmat.primitives import serialization
from test_checks import EIGHT

from bootstrap.cluster import nccl_ssh
from bootstrap.cluster.checks import nccl_job
from bootstrap.inventory.loader import parse_inventory


def job():
    inventory = parse_inventory("cluster: t\nnodes: [{name: cp, address: 10.0.0.1, role: server}, "
                                "{name: a, address: 10.0.0.2}, {name: b, address: 10.0.0.3}, "
                                "{name: c, address: 10.0.0.4}]\nvalidate: {nccl: {min_busbw_gbps: 150}}\n")
    nodes = [inventory.node(n) for n in "abc"]
    return nccl_job(inventory, nodes, {n.name: EIGHT for n in nodes})


def task_spec(j, name):
    return next(t for t in j["spec"]["tasks"] if t["name"] == name)["template"]["spec"]


def mounted(spec):
    [volume] = [v for v in spec["volumes"] if v["name"] == nccl_ssh.VOLUME]
    [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == nccl_ssh.VOLUME]
    assert mount["mountPath"] == "/root/.ssh" and mount["subPath"] == ".ssh" and volume["secret"]["defaultMode"] == 0o600
    return volume["secret"]["secretName"], {item["key"] for item in volume["secret"]["items"]}


def test_only_the_launcher_holds_the_private_key():
    j = job()
    assert "ssh" not in j["spec"]["plugins"]  # Volcano's plugin would mount one key pair in every pod
    assert mounted(task_spec(j, "launcher")) == (nccl_ssh.LAUNCHER_SECRET, {"id_ed25519", "id_ed25519.pub", "config"})
    assert mounted(task_spec(j, "worker")) == (nccl_ssh.WORKER_SECRET, {"authorized_keys"})


def test_mpirun_starts_every_orted_itself():
    """A worker has no key to start another's orted (Open MPI's tree spawn)."""
    command = task_spec(job(), "launcher")["containers"][0]["command"][2]
    assert "--mca plm_rsh_no_tree_spawn 1 " in command


def test_the_workers_secret_holds_the_public_key_alone():
    launcher, workers = nccl_ssh.secrets_for("nccl", {"launcher": 1, "worker": 3}, "x")
    assert set(workers["stringData"]) == {"authorized_keys"}
    assert workers["stringData"]["authorized_keys"] == launcher["stringData"]["id_ed25519.pub"]
    private = serialization.load_ssh_private_key(launcher["stringData"]["id_ed25519"].encode(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert workers["stringData"]["authorized_keys"].startswith(public.decode() + " ")  # the pair matches
    for secret in (launcher, workers):
        assert secret["metadata"]["namespace"] == "x"
        kubernetes_validate.validate(secret, "1.33", strict=True)


def test_each_run_draws_its_own_key():
    first, second = (nccl_ssh.secrets_for("nccl", {"worker": 2}, "x")[0]["stringData"]["id_ed25519"] for _ in range(2))
    assert first != second


def test_the_config_is_the_volcano_plugins():
    assert nccl_ssh.ssh_config("nccl", {"launcher": 1, "worker": 2}) == (
        "StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n"
        "Host nccl-launcher-0\n  HostName nccl-launcher-0.nccl\n"
        "Host nccl-worker-0\n  HostName nccl-worker-0.nccl\nHost nccl-worker-1\n  HostName nccl-worker-1.nccl\n")
