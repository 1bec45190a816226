"""Rolling k3s upgrades on the test hosts: k3s.version changes in the inventory, `up` rolls it.

Each version is a k3s stand-in built into its own air-gap folder; the stand-in reports its
version and, like k3s, refuses to start on a data dir that skips a minor.
"""

import json
import re

import pytest
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts

OLD, NEW, NEXT = "v1.33.5+k3s1", "v1.34.1+k3s1", "v1.35.0+k3s1"


def k3s_version(host):
    return host.ssh("k3s --version").stdout.split()[2]


def api_sim(server):
    """What the stand-in API remembers of cordons (max at once, order)."""
    data = json.loads(server.ssh("sudo cat /var/lib/rancher/k3s/server/standin-api.json").stdout)
    return data["sim"]


def inventory_for(tmp_path, hosts, folder, version):
    return write_inventory(tmp_path / "inv.yaml", hosts, extra={"k3s": {"airgap": str(folder), "version": version}})


def test_rolling_upgrade_one_node_at_a_time_stops_at_a_failure_and_resumes(lab, tmp_path):
    from standins.airgap import build_airgap, upstream_missing

    if upstream_missing():
        pytest.skip(upstream_missing())
    folders = {v: build_airgap(tmp_path / f"airgap-{v}", version=v) for v in (OLD, NEW, NEXT)}
    hosts = lab.start(["ug-cp", "ug-a1", "ug-a2", "ug-a3"])
    cp, a1, a2, a3 = hosts
    inventory = inventory_for(tmp_path, hosts, folders[OLD], OLD)
    first = run_bootstrap("up", inventory, "--hosts-only")
    assert first.returncode == 0, first.stdout + first.stderr
    assert {k3s_version(h) for h in hosts} == {OLD}

    inventory = inventory_for(tmp_path, hosts, folders[NEW], NEW)
    plan = run_bootstrap("plan", inventory)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"k3s rolling upgrade to {NEW}, in this order:" in plan.stdout
    order = re.findall(r"^  \d+\. (?:server|agent) (\S+) \(", plan.stdout, re.M)
    assert order == ["ug-cp", "ug-a1", "ug-a2", "ug-a3"], plan.stdout
    assert {k3s_version(h) for h in hosts} == {OLD}  # plan changed nothing

    upgrade = run_bootstrap("up", inventory, "--hosts-only")
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert re.findall(r"^upgraded (\S+) to", upgrade.stdout, re.M) == ["ug-cp", "ug-a1", "ug-a2", "ug-a3"]
    assert {k3s_version(h) for h in hosts} == {NEW}
    sim = api_sim(cp)
    assert sim["max_cordoned"] == 1 and sim["cordon_order"] == ["ug-a1", "ug-a2", "ug-a3"], sim
    assert sim["cordoned_now"] == []
    for host in hosts:  # the way back is kept on each node
        assert host.ssh("sudo /var/lib/bootstrap/k3s.previous --version").stdout.split()[2] == OLD

    # ug-a2's k3s will not start: the rollout stops there, ug-a3 keeps running the old version.
    a2.ssh("sudo mkdir -p /etc/systemd/system/k3s-agent.service.d && printf '[Service]\\nExecStartPre=/bin/false\\n'"
           " | sudo tee /etc/systemd/system/k3s-agent.service.d/broken.conf >/dev/null && sudo systemctl daemon-reload")
    inventory = inventory_for(tmp_path, hosts, folders[NEXT], NEXT)
    stopped = run_bootstrap("up", inventory, "--hosts-only")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr + a2.ssh("sudo journalctl -u k3s-agent --no-pager -n 40", check=False).stdout
    assert "rolling upgrade stopped at ug-a2" in stopped.stderr, stopped.stdout + stopped.stderr + a2.ssh("sudo journalctl -u k3s-agent --no-pager -n 40", check=False).stdout
    assert "untouched: ug-a3" in stopped.stderr
    assert "run `bootstrap up` again to resume" in stopped.stderr and "k3s.previous" in stopped.stderr
    assert (k3s_version(cp), k3s_version(a1), k3s_version(a3)) == (NEXT, NEXT, NEW)
    assert a3.ssh("systemctl is-active k3s-agent").stdout.strip() == "active"
    assert api_sim(cp)["cordoned_now"] == ["ug-a2"]

    a2.ssh("sudo rm -rf /etc/systemd/system/k3s-agent.service.d && sudo systemctl daemon-reload")
    resumed = run_bootstrap("up", inventory, "--hosts-only")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert re.findall(r"^upgraded (\S+) to", resumed.stdout, re.M) == ["ug-a3"]
    assert {k3s_version(h) for h in hosts} == {NEXT}
    sim = api_sim(cp)
    assert sim["cordoned_now"] == [] and sim["max_cordoned"] == 1, sim

    # What k3s refuses is refused before any host changes.
    before = {h.name: h.ssh("sudo sha256sum /usr/local/bin/k3s /etc/rancher/k3s/config.yaml").stdout for h in hosts}
    down = run_bootstrap("up", inventory_for(tmp_path, hosts, folders[NEW], NEW), "--hosts-only")
    assert down.returncode != 0 and "cannot be downgraded" in down.stdout, down.stdout + down.stderr
    assert f"keep k3s.version at {NEXT} or newer" in down.stdout
    skip = build_airgap(tmp_path / "airgap-skip", version="v1.37.0+k3s1")
    skipped = run_bootstrap("up", inventory_for(tmp_path, hosts, skip, "v1.37.0+k3s1"), "--hosts-only")
    assert skipped.returncode != 0 and "cannot skip minor versions" in skipped.stdout
    assert "newest v1.36.x release" in skipped.stdout
    # A repair is not an upgrade: rebuild refuses to restart running nodes on another release.
    later = build_airgap(tmp_path / "airgap-later", version="v1.36.0+k3s1")
    rebuild = run_bootstrap("rebuild", inventory_for(tmp_path, hosts, later, "v1.36.0+k3s1"), "--no-validate")
    assert rebuild.returncode == 1 and "upgrade with `bootstrap up`" in rebuild.stderr, rebuild.stdout + rebuild.stderr
    assert before == {h.name: h.ssh("sudo sha256sum /usr/local/bin/k3s /etc/rancher/k3s/config.yaml").stdout
                      for h in hosts}


def test_ha_servers_are_upgraded_one_at_a_time_and_each_is_back_before_the_next(lab, tmp_path):
    from standins.airgap import build_airgap, upstream_missing

    if upstream_missing():
        pytest.skip(upstream_missing())
    folders = {v: build_airgap(tmp_path / f"airgap-{v}", version=v) for v in (OLD, NEW)}
    hosts = lab.start(["ha-cp1", "ha-cp2", "ha-cp3", "ha-a1", "ha-a2"])
    servers = hosts[:3]
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, servers=3,
                                extra={"k3s": {"airgap": str(folders[OLD]), "version": OLD}})
    assert run_bootstrap("up", inventory, "--hosts-only").returncode == 0
    inventory = write_inventory(tmp_path / "inv.yaml", hosts, servers=3,
                                extra={"k3s": {"airgap": str(folders[NEW]), "version": NEW}})
    upgrade = run_bootstrap("up", inventory, "--hosts-only", "--max-unavailable", "2", "--json")
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    events = [json.loads(line) for line in upgrade.stdout.splitlines()]
    order = [e["node"] for e in events if e["event"] == "upgraded"]
    assert order == ["ha-cp1", "ha-cp2", "ha-cp3", "ha-a1", "ha-a2"]
    # Each server's restart began only after the one before was back on the new version.
    restarts = [e for e in events if e["event"] == "step_start" and e["step"] == "upgrade k3s"]
    assert [e["host"] for e in restarts][:3] == ["ha-cp1", "ha-cp2", "ha-cp3"]
    done = {e["node"]: e["time"] for e in events if e["event"] == "upgraded"}
    assert restarts[1]["time"] >= done["ha-cp1"] and restarts[2]["time"] >= done["ha-cp2"]
    # Two agents at a time: one batch, both cordoned together.
    assert {e["host"] for e in restarts[3:]} == {"ha-a1", "ha-a2"}
    sim = api_sim(servers[0])
    assert sim["max_cordoned"] == 2 and sim["cordoned_now"] == []
    for host in hosts:
        assert k3s_version(host) == NEW
    status = run_bootstrap("status", inventory, "--json")
    rows = {r["node"]: r for r in json.loads(status.stdout)["nodes"]}
    assert {r["k3s"] for r in rows.values()} == {NEW} and not any(r["cordoned"] for r in rows.values())
