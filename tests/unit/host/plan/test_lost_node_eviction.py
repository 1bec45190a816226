"""Recovery in about a minute: servers evict a lost node's pods k3s.lost_node_eviction_s after
its last heartbeat (private default 60 s, public 180 s) instead of Kubernetes' ~6 minutes
(node-monitor-grace-period 40/50 s + default-*-toleration-seconds 300 s)."""

from __future__ import annotations

import pytest
import yaml

from bootstrap.errors import InvalidInput
from bootstrap.host.plan import k3sconfig
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.inventory.loader import parse_inventory
from bootstrap.checks import k3s_flags

TOKENS = JoinTokens("tok", "agent-tok")


def inventory(k3s: str = "{}", network: str = "{}"):
    return parse_inventory(f"""\
cluster: t
k3s: {k3s}
network: {network}
nodes:
  - {{name: cp-1, address: 203.0.113.10, role: server}}
  - {{name: gpu-1, address: 203.0.113.21}}
""", "inv.yaml")


def server_and_agent(inv):
    return (k3sconfig.node_config(inv, inv.node("cp-1"), TOKENS), k3sconfig.node_config(inv, inv.node("gpu-1"), TOKENS))


def eviction(config: dict) -> tuple[list, list]:
    return config.get("kube-apiserver-arg"), config.get("kube-controller-manager-arg")


def test_private_mode_evicts_a_lost_nodes_pods_in_about_a_minute():
    server, agent = server_and_agent(inventory())
    assert eviction(server) == (["default-not-ready-toleration-seconds=10", "default-unreachable-toleration-seconds=10"],
                                ["node-monitor-grace-period=50s"])  # 50 + 10 = 60 s
    assert eviction(agent) == (None, None)  # the API server and controller manager run on servers only
    written = yaml.safe_load(k3sconfig.render(server))
    assert written["kube-controller-manager-arg"] == ["node-monitor-grace-period=50s"]


def test_public_mode_waits_longer_because_internet_paths_flap():
    server, _ = server_and_agent(inventory(network="{mode: public}"))
    assert eviction(server) == (["default-not-ready-toleration-seconds=120",
                                 "default-unreachable-toleration-seconds=120"], ["node-monitor-grace-period=60s"])


@pytest.mark.parametrize("seconds, toleration, grace", [(90, 40, 50), (60, 10, 50), (50, 0, 50), (600, 550, 50)])
def test_the_inventory_key_sets_the_total(seconds, toleration, grace):
    server, _ = server_and_agent(inventory(f"{{lost_node_eviction_s: {seconds}}}"))
    assert eviction(server) == ([f"default-not-ready-toleration-seconds={toleration}",
                                 f"default-unreachable-toleration-seconds={toleration}"],
                                [f"node-monitor-grace-period={grace}s"])


@pytest.mark.parametrize("seconds, grace", [(50, 50), (55, 55), (60, 60), (180, 60)])
def test_public_mode_keeps_the_grace_period_at_50_s_or_more(seconds, grace):
    server, _ = server_and_agent(inventory(f"{{lost_node_eviction_s: {seconds}}}", "{mode: public}"))
    assert server["kube-controller-manager-arg"] == [f"node-monitor-grace-period={grace}s"]


@pytest.mark.parametrize("seconds", [20, 30, 45, 49])
def test_a_total_below_the_kubelets_connection_stall_is_refused_with_the_reason(seconds):
    """A grace period under 50 s marks a healthy node lost while its kubelet waits out a stalled
    HTTP/2 connection (45 s, kubernetes#121793), and evicts every pod on it."""
    (found,) = problems(f"{{lost_node_eviction_s: {seconds}}}")
    assert found.path == "k3s.lost_node_eviction_s" and found.line == 2
    assert found.message.startswith(f"{seconds} is below the minimum of 50: ")
    assert "kubernetes/kubernetes#121793" in found.message and "kubernetes/kubernetes#126287" in found.message
    assert "healthy" in found.message and found.hint == "write a number of at least 50"


def test_an_inventory_built_by_hand_still_gets_a_50_s_grace_period():
    import dataclasses

    inv = inventory()
    inv = dataclasses.replace(inv, k3s=dataclasses.replace(inv.k3s, lost_node_eviction_s=30))
    assert k3sconfig.eviction_args(inv)["kube-controller-manager-arg"] == ["node-monitor-grace-period=50s"]


def test_the_shipped_spot_inventory_keeps_a_50_s_grace_period():
    from pathlib import Path

    path = Path(__file__).parents[4] / "inventories" / "spot-timeslicing.yaml"
    inv = parse_inventory(path.read_text(), str(path))
    assert k3sconfig.eviction_args(inv)["kube-controller-manager-arg"] == ["node-monitor-grace-period=50s"]


def test_a_users_argument_of_the_same_name_wins_and_is_not_written_twice():
    server, _ = server_and_agent(inventory(
        '{server_config: {kube-apiserver-arg: ["--default-unreachable-toleration-seconds=30", "audit-log-maxage=7"], '
        'kube-controller-manager-arg: "node-monitor-grace-period=90s"}, agent_config: {kubelet-arg: '
        '["shutdown-grace-period=90s"]}}'))
    assert server["kube-apiserver-arg"] == ["default-not-ready-toleration-seconds=10",
                                            "--default-unreachable-toleration-seconds=30", "audit-log-maxage=7"]
    assert server["kube-controller-manager-arg"] == ["node-monitor-grace-period=90s"]
    _, agent = server_and_agent(inventory('{agent_config: {kubelet-arg: ["shutdown-grace-period=90s"]}}'))
    assert agent["kubelet-arg"] == ["shutdown-grace-period-critical-pods=10s", "shutdown-grace-period=90s"]
    assert [k3s_flags.arg_name(a) for a in ("--a=1", "a+=2", "a-=3", "a")] == ["a"] * 4  # k3s's GetArgs


def test_the_flags_are_not_refused_under_server_config():
    for flag in ("kube-apiserver-arg", "kube-controller-manager-arg"):
        assert k3s_flags.flag_problem("server", flag) is None


def problems(k3s: str) -> list:
    with pytest.raises(InvalidInput) as caught:
        inventory(k3s)
    return caught.value.problems


def test_the_key_and_the_same_argument_under_server_config_are_refused_with_the_way_out():
    (found,) = problems('{lost_node_eviction_s: 60, server_config: {kube-controller-manager-arg: '
                        '["--node-monitor-grace-period=20s"]}}')
    assert found.path == "k3s.server_config.kube-controller-manager-arg"
    assert found.message == "node-monitor-grace-period is set here and by k3s.lost_node_eviction_s"
    assert "keep k3s.lost_node_eviction_s" in found.hint and "or remove it" in found.hint
    # other arguments beside the key are fine
    inventory('{lost_node_eviction_s: 60, server_config: {kube-apiserver-arg: ["audit-log-maxage=7"]}}')


@pytest.mark.parametrize("value, words", [(10, "10 is below the minimum of 50"), (7200, "above the maximum of 3600"),
                                          ('"1m"', "expected seconds")])
def test_a_value_out_of_range_is_refused(value, words):
    (found,) = problems(f"{{lost_node_eviction_s: {value}}}")
    assert found.path == "k3s.lost_node_eviction_s" and words in found.message


@pytest.mark.parametrize("value", ["20s", "45s", "500ms", "49.9s", "0.5m", "40s", "-60s", "0", "+30s", "49s999ms",
                                   "49000000us"])
def test_a_raw_grace_period_below_the_floor_is_refused_at_load_with_the_reason(value):
    """The floor of k3s.lost_node_eviction_s holds for the argument written by hand under
    server_config too, in every form Go's ParseDuration reads."""
    (found,) = problems(f'{{server_config: {{kube-controller-manager-arg: ["audit-log-maxage=7", '
                        f'"--node-monitor-grace-period={value}"]}}}}')
    assert found.path == "k3s.server_config.kube-controller-manager-arg[1]" and found.line == 2
    assert found.message.startswith(f"node-monitor-grace-period={value} is below the minimum of 50s: ")
    assert "kubernetes/kubernetes#121793" in found.message and "healthy" in found.message
    assert found.hint == "write node-monitor-grace-period=50s or more"


def test_a_raw_grace_period_of_one_value_is_checked_too():
    (found,) = problems('{server_config: {kube-controller-manager-arg: "node-monitor-grace-period+=30s"}}')
    assert found.path == "k3s.server_config.kube-controller-manager-arg" and "below the minimum of 50s" in found.message


@pytest.mark.parametrize("value", ["50s", "1m", "1m30s", "0.84h", "50000ms", "3000000000us", "1h2m3.5s", "50.s"])
def test_a_raw_grace_period_at_or_above_the_floor_is_kept(value):
    server, _ = server_and_agent(inventory(f'{{server_config: {{kube-controller-manager-arg: '
                                           f'"node-monitor-grace-period={value}"}}}}'))
    assert server["kube-controller-manager-arg"] == [f"node-monitor-grace-period={value}"]


@pytest.mark.parametrize("value", ["60", "1x", ".s", "", "1m 30s", "99999999999h"])
def test_a_raw_grace_period_go_does_not_read_is_refused(value):
    (found,) = problems(f'{{server_config: {{kube-controller-manager-arg: "node-monitor-grace-period={value}"}}}}')
    assert found.message == f"node-monitor-grace-period={value} is not a duration kube-controller-manager reads"
