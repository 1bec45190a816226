"""Day two on test hosts: rebuild after spot loss, control-plane restore, scale-down."""

import time

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts


def api_nodes(inventory_path):
    from bootstrap.cluster.client import connect, get
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory_path)
    with connect(inv, StateDir(inv)) as api:
        return {n["metadata"]["name"]: n for n in get(api, "/api/v1/nodes")["items"]}


def ready(node):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def wait_not_ready(inventory_path, name, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not ready(api_nodes(inventory_path)[name]):
            return
        time.sleep(3)
    raise AssertionError(f"{name} never went NotReady")


def edit(inventory_path, change):
    data = yaml.safe_load(inventory_path.read_text())
    change(data)
    inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_lost_agent_is_replaced_and_healthy_agents_see_no_change(lab, tmp_path, airgap):
    hosts = lab.start(["rb-cp", "rb-a1", "rb-a2", "rb-a3"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    lab["rb-a3"].kill()  # spot loss
    wait_not_ready(inventory, "rb-a3")
    (replacement,) = lab.start(["rb-a4"])
    edit(inventory, lambda d: d["nodes"].__setitem__(3, {"name": "rb-a4", "address": replacement.address,
                                                        "role": "agent"}))
    result = run_bootstrap("rebuild", inventory, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lost rb-a3" in result.stdout and "joined rb-a4" in result.stdout
    assert "unchanged rb-cp, rb-a1, rb-a2" in result.stdout
    nodes = api_nodes(inventory)
    assert "rb-a3" not in nodes
    assert all(ready(nodes[n]) for n in ("rb-a1", "rb-a2", "rb-a4"))
    # Nothing ran on the healthy agents but the facts probe.
    assert "rb-a1" not in [l.split()[1] for l in result.stdout.splitlines() if l.startswith("✓")]


def test_lost_server_is_restored_from_the_snapshot_and_agents_rejoin(lab, tmp_path, airgap):
    hosts = lab.start(["rs-cp", "rs-a1", "rs-a2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    from bootstrap.cluster.client import apply_object, connect, get
    from bootstrap.inventory.loader import load_inventory
    from bootstrap.state.folder import StateDir

    inv = load_inventory(inventory)
    marker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before-loss", "namespace": "default"},
              "data": {"keep": "me"}}
    with connect(inv, StateDir(inv)) as api:
        apply_object(api, marker)
    snap = run_bootstrap("snapshot", inventory)
    assert snap.returncode == 0, snap.stderr
    lab["rs-cp"].kill()
    (new_server,) = lab.start(["rs-cp2"])
    edit(inventory, lambda d: d["nodes"].__setitem__(0, {"name": "rs-cp2", "address": new_server.address,
                                                        "role": "server"}))
    # Without --restore nothing is restored: the command says from which snapshot it would.
    refused = run_bootstrap("rebuild", inventory, timeout=900)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "the control plane is lost" in refused.stderr and "--restore" in refused.stderr
    assert "rs-cp2: has no k3s service" in refused.stdout  # the inventory's server: a fresh machine
    assert "k3s" not in new_server.ssh("ls /etc/rancher /usr/local/bin", check=False).stdout
    # Not on a terminal and without --yes: it asks, so it refuses.
    unconfirmed = run_bootstrap("rebuild", inventory, "--restore", timeout=900)
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    assert "Lost: everything the cluster recorded after it" in unconfirmed.stderr
    result = run_bootstrap("rebuild", inventory, "--restore", "--yes", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "restored rs-cp2 from" in result.stdout
    nodes = api_nodes(inventory)
    assert "rs-cp" not in nodes and ready(nodes["rs-cp2"])
    assert ready(nodes["rs-a1"]) and ready(nodes["rs-a2"])
    for agent in ("rs-a1", "rs-a2"):
        config = lab[agent].ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
        assert f"server: https://{new_server.address}:6443" in config
    inv = load_inventory(inventory)
    with connect(inv, StateDir(inv)) as api:
        kept = get(api, "/api/v1/namespaces/default/configmaps/before-loss")
    assert kept and kept["data"] == {"keep": "me"}


def test_scale_down_removes_an_agent_and_refuses_the_only_server(lab, tmp_path, airgap):
    hosts = lab.start(["sd-cp", "sd-a1", "sd-a2"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    refused = run_bootstrap("scale-down", inventory, "--node", "sd-cp")
    assert refused.returncode == 2 and "no server left" in refused.stderr
    result = run_bootstrap("scale-down", inventory, "--node", "sd-a2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sd-a2" not in api_nodes(inventory)
    assert "{name: sd-a2" in result.stdout  # the inventory edit to make
    from test_up_hosts import ALLOWED_AFTER_DOWN

    left = {f for f in lab["sd-a2"].created_files() if not ALLOWED_AFTER_DOWN.match(f)}
    assert left == set(), sorted(left)


def test_scale_down_of_a_server_stops_its_k3s_before_its_etcd_member_goes(lab, tmp_path, airgap):
    """k3s joins again whenever it starts (Restart=always), so the member must go only once
    k3s is stopped and disabled on its host: the stop job in that host's journal against the
    line the etcd member controller logs on the first server (one clock: the lab machine)."""
    import json

    hosts = lab.start(["sds-s1", "sds-s2", "sds-s3"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, servers=3, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    result = run_bootstrap("scale-down", inventory, "--node", "sds-s3", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr

    def journal(host, match):
        lines = lab[host].ssh("sudo journalctl -u k3s.service -o json --no-pager").stdout.splitlines()
        return [int(e["__REALTIME_TIMESTAMP"]) for e in map(json.loads, lines) if match(e)]

    stopped = journal("sds-s3", lambda e: e.get("JOB_TYPE") == "stop" and e.get("JOB_RESULT") == "done")
    removed = journal("sds-s1", lambda e: "Removing name=sds-s3" in str(e.get("MESSAGE")))
    assert stopped and removed and stopped[0] < removed[0], (stopped, removed)
    assert set(api_nodes(inventory)) == {"sds-s1", "sds-s2"}
    from test_up_hosts import ALLOWED_AFTER_DOWN

    left = {f for f in lab["sds-s3"].created_files() if not ALLOWED_AFTER_DOWN.match(f)}
    assert left == set(), sorted(left)


def test_one_of_three_servers_lost_its_etcd_member_is_removed_and_the_replacement_joins(lab, tmp_path, airgap):
    hosts = lab.start(["ha-s1", "ha-s2", "ha-s3", "ha-ag"])
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, servers=3, extra={"k3s": {"airgap": str(airgap)}})
    first = run_bootstrap("up", inventory, "--no-validate", timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    lab["ha-s3"].kill()
    wait_not_ready(inventory, "ha-s3")
    (replacement,) = lab.start(["ha-s4"])
    edit(inventory, lambda d: d["nodes"].__setitem__(2, {"name": "ha-s4", "address": replacement.address,
                                                        "role": "server"}))
    result = run_bootstrap("rebuild", inventory, "--no-validate", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lost ha-s3" in result.stdout and "joined ha-s4" in result.stdout
    nodes = api_nodes(inventory)
    assert "ha-s3" not in nodes and ready(nodes["ha-s4"])
    config = replacement.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
    assert "cluster-init" not in config and f"server: https://{hosts[0].address}:6443" in config
