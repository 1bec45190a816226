"""The k3s stand-in refuses a new machine under an old node name as real k3s does, and
restores as real k3s restores (tests/standins/k3s_standin.py, kubeapi.py; each behaviour
cites the upstream file it follows):

- an agent whose node password is not the one its name's node-password secret holds is
  refused (403) and keeps asking, until the Node (and with it the secret) is deleted;
- a server whose etcd member is another than the one its node name has is refused
  ("duplicate node name found") until that member is removed (deleting its Node);
- a server's own node is verified against its local password file, the secret only
  later: a mismatch is a Warning event, not a refusal;
- with etcd-s3 set, a restore path is looked up in S3: a local file needs --etcd-s3=false;
- after a restore, the other servers' old etcd members are gone: one that starts on its
  old etcd data is refused until that data is deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import yaml
from sandbox import FAST, TOKEN, Cluster, Proc, free_port, k3s, wait  # noqa: F401  (k3s: a fixture)

NODE_PASSWORD_REJECTED = ("Waiting to retrieve agent configuration; server is not ready: Node password rejected, "
                          "duplicate hostname or contents of '/etc/rancher/node/password' may not match server "
                          "node-passwd entry, try enabling a unique node name with the --with-node-id flag")


@pytest.fixture
def cluster(k3s, tmp_path):
    c = Cluster(k3s, tmp_path)
    yield c
    c.stop()
    for p in c.procs:
        assert "kubeapi simulator:" not in p.log(), p.log()


def configured(root, config: dict):
    path = root / "etc/rancher/k3s/config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return root


def machine(cluster, root, args, config, env=None) -> Proc:
    """A stand-in on its own root: another machine, whatever node name it is given."""
    p = Proc(cluster.k3s, args, configured(root, config), env)
    cluster.procs.append(p)
    return p


def joining_server(cluster, root, name, port=None, env=None) -> Proc:
    return machine(cluster, root, ["server", "--https-listen-port", str(port or free_port()), "--bind-address",
                                   "127.0.0.1", "--node-name", name],
                   {"server": f"https://127.0.0.1:{cluster.port}", "token": TOKEN}, env)


def exited(proc: Proc, timeout=90) -> int:  # generous: stand-ins start slowly on a loaded 2-core machine
    return proc.proc.wait(timeout)


def etcd_member(nodes_file, name) -> bool:
    """Whether the stand-in's node list has `name` as an etcd member yet: until the server
    records the rejoin, the name may be missing (the restore removed it)."""
    try:
        return bool(json.loads(nodes_file.read_text()).get("nodes", {}).get(name, {}).get("etcd"))
    except (OSError, ValueError):
        return False


def node_names(cluster):
    return {n.metadata.name for n in cluster.core.list_node().items}


def secrets(cluster):
    return {s.metadata.name for s in cluster.core.list_namespaced_secret("kube-system").items}


@pytest.mark.parametrize("gone_by", ["delete-node", "delete-secret"])
def test_an_agent_on_a_new_machine_is_refused_until_its_old_node_is_gone(cluster, tmp_path, gone_by):
    cluster.server()
    old = cluster.agent("w-1")
    cluster.wait_ready("cp-1", "w-1")
    old.stop(signal.SIGKILL)  # the spot VM is gone; its Node and node-password secret stay
    config = {"server": f"https://127.0.0.1:{cluster.port}", "token": TOKEN}
    new = machine(cluster, tmp_path / "w-1-new", ["agent", "--node-name", "w-1"], config,
                  {"K3S_STANDIN_JOIN_TIMEOUT": "3"})
    assert exited(new) == 1
    log = new.log()
    assert NODE_PASSWORD_REJECTED in log and log.count(NODE_PASSWORD_REJECTED) >= 2, log  # it keeps asking
    assert "w-1.node-password.k3s" in secrets(cluster)
    if gone_by == "delete-node":
        cluster.core.delete_node("w-1")  # the secret goes with its Node
        wait("the secret gone", lambda: "w-1.node-password.k3s" not in secrets(cluster))
    else:
        cluster.core.delete_namespaced_secret("w-1.node-password.k3s", "kube-system")
    again = machine(cluster, tmp_path / "w-1-new", ["agent", "--node-name", "w-1"], config)
    cluster.wait_ready("w-1")
    assert "Node password rejected" not in again.log()
    assert "w-1.node-password.k3s" in secrets(cluster)


def test_a_restarted_agent_keeps_its_password_and_rejoins(cluster):
    cluster.server()
    agent = cluster.agent("w-1")
    cluster.wait_ready("w-1")
    agent.stop()
    again = cluster.agent("w-1")  # the same machine (root): the same /etc/rancher/node/password
    cluster.wait_ready("w-1")
    assert "Node password rejected" not in again.log()


def test_a_server_on_a_new_machine_is_refused_until_its_old_member_is_removed(cluster, tmp_path):
    cluster.server()
    first = joining_server(cluster, tmp_path / "cp-2", "cp-2")
    cluster.wait_ready("cp-2")
    first.stop(signal.SIGKILL)
    replacement = joining_server(cluster, tmp_path / "cp-2-new", "cp-2")
    assert exited(replacement) == 1
    assert "etcd cluster join failed: duplicate node name found, please use a unique name for this node" in \
        replacement.log()
    cluster.core.delete_node("cp-2")  # k3s removes the member of a deleted etcd node
    wait("cp-2 gone", lambda: "cp-2" not in node_names(cluster))
    again = joining_server(cluster, tmp_path / "cp-2-new", "cp-2")
    cluster.wait_ready("cp-2")
    assert "duplicate node name" not in again.log()


def snapshot(cluster, root, holding=()) -> str:
    """`holding`: names the API's saved state must hold first (it is saved within 0.5 s)."""
    state = root / "var/lib/rancher/k3s/server/standin-api.json"
    for name in holding:
        wait(f"{name} saved", lambda: state.exists() and name in state.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_")}
    proc = subprocess.run([sys.executable, str(cluster.k3s), "etcd-snapshot", "save", "--name", "snap"],
                          capture_output=True, text=True, env=dict(env, K3S_STANDIN_ROOT=str(root)), timeout=30)
    assert proc.returncode == 0, proc.stderr
    (path,) = (root / "var/lib/rancher/k3s/server/db/snapshots").iterdir()
    return str(path)


def reset(cluster, root, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_")}
    return subprocess.run([sys.executable, str(cluster.k3s), "server", "--cluster-reset", *args], capture_output=True,
                          text=True, env=dict(env, K3S_STANDIN_ROOT=str(root)), timeout=30)


def test_with_etcd_s3_a_local_restore_path_needs_etcd_s3_false(cluster, tmp_path):
    cluster.server()
    path = snapshot(cluster, cluster.root)
    cluster.stop()
    new_host = configured(tmp_path / "new", {"token": TOKEN, "cluster-init": True, "etcd-s3": True,
                                            "etcd-s3-bucket": "backups", "etcd-s3-endpoint": "s3.example.test"})
    refused = reset(cluster, new_host, f"--cluster-reset-restore-path={path}")
    assert refused.returncode == 1
    assert f"Retrieving etcd snapshot {path} from S3" in refused.stderr
    assert "failed to download snapshot from S3" in refused.stderr
    restored = reset(cluster, new_host, f"--cluster-reset-restore-path={path}", "--etcd-s3=false")
    assert restored.returncode == 0, restored.stderr
    assert "Restored the cluster state from" in restored.stderr


def test_after_a_restore_another_server_rejoins_only_without_its_old_etcd_data(cluster, tmp_path):
    cluster.server()
    port2 = free_port()
    peer_root = tmp_path / "cp-2"
    peer = joining_server(cluster, peer_root, "cp-2", port2)
    cluster.wait_ready("cp-2")
    path = snapshot(cluster, cluster.root)
    peer.stop()
    server_root = cluster.root
    cluster.stop()
    restored = reset(cluster, server_root, f"--cluster-reset-restore-path={path}")
    assert restored.returncode == 0, restored.stderr
    cluster.server(root=server_root)
    stale = joining_server(cluster, peer_root, "cp-2", port2)
    assert exited(stale) == 1
    assert "the member has been permanently removed from the cluster" in stale.log()
    shutil.rmtree(peer_root / "var/lib/rancher/k3s/server/db")  # k3s's restore procedure, step 4
    again = joining_server(cluster, peer_root, "cp-2", port2)
    nodes = server_root / "var/lib/rancher/k3s/server/standin-nodes.json"
    wait("cp-2 an etcd member again", lambda: etcd_member(nodes, "cp-2"), 90)
    assert again.proc.poll() is None and "Managed etcd cluster membership added" in again.log()


def test_a_server_restored_onto_a_new_machine_keeps_its_name_with_a_warning(cluster, tmp_path):
    """Its own node's password is checked against its local file first (accepted), the
    cluster's secret later: real k3s only records the mismatch as an event."""
    cluster.server()
    cluster.wait_ready("cp-1")
    path = snapshot(cluster, cluster.root, holding=["cp-1.node-password.k3s"])
    cluster.stop()
    new_host = configured(tmp_path / "new", {})
    assert reset(cluster, new_host, f"--cluster-reset-restore-path={path}", "--token", TOKEN).returncode == 0
    cluster.server(root=new_host)
    cluster.wait_ready("cp-1")
    events = cluster.core.list_namespaced_event("default", field_selector="involvedObject.name=cp-1").items
    assert any(e.reason == "NodePasswordValidationFailed" and e.type == "Warning" for e in events), events
