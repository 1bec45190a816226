"""Whose fault a failing NCCL pair is (bootstrap.cluster.nccl_pairs), pure: the pair tests'
outcomes are the test's data. Issue 32 item 12: the gate pinned a pair's failure on the gated
node, so a hostile partner (one that fails every pair it is in) failed every honest node; then
two hostile partners that pass together failed an honest node that failed with both."""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.cluster.checks import CheckResult
from bootstrap.cluster.gate import proven_nodes
from bootstrap.cluster.gate_rules import GATE_TAINT
from bootstrap.cluster.nccl_pairs import judge_node, partners_of
from bootstrap.inventory.loader import parse_inventory


@dataclass(frozen=True)
class N:
    name: str
    provider: str | None = "p"


def outcomes(failing: set[frozenset]):
    """A pair test whose result the test decides: FAIL for the pairs in `failing`."""
    asked = []

    def test(a, b) -> CheckResult:
        asked.append((a.name, b.name))
        if frozenset((a.name, b.name)) in failing:
            return CheckResult("nccl", "FAIL", "all_reduce_perf failed")
        return CheckResult("nccl", "PASS", "bus bandwidth 180.0 GB/s")
    return test, asked


def pairs(*names: str) -> set[frozenset]:
    return {frozenset(p.split("+")) for p in names}


def test_a_hostile_partner_fails_no_honest_node():
    honest, liar, other = N("gpu-1"), N("liar"), N("gpu-3")
    test, asked = outcomes(pairs("gpu-1+liar", "liar+gpu-3"))  # the liar fails every pair it is in
    verdict, warning = judge_node(honest, [liar, other], test, proven={"liar", "gpu-3"})
    assert (verdict.status, verdict.node) == ("PASS", "gpu-1") and verdict.reason.startswith("with gpu-3: bus bandwidth")
    assert (warning.status, warning.node) == ("WARN", "gpu-1")
    assert warning.reason.startswith("the pair with liar failed, not this node's (it passed with gpu-3)")
    assert asked == [("gpu-1", "liar"), ("gpu-1", "gpu-3")]
    # the only partner is the liar: the pair is reported, the node not failed
    (alone,) = judge_node(honest, [liar], test, proven={"liar"})
    assert alone.status == "WARN" and "not attributed to this node" in alone.reason


def test_a_node_fails_only_with_two_proven_partners_that_pass_together():
    broken, a, b = N("gpu-1"), N("gpu-2"), N("gpu-3")
    test, asked = outcomes(pairs("gpu-1+gpu-2", "gpu-1+gpu-3"))
    (verdict,) = judge_node(broken, [a, b], test, proven={"gpu-2", "gpu-3"})
    assert verdict.status == "FAIL" and verdict.reason.startswith("failed with gpu-2")
    assert "which pass together" in verdict.reason and asked[-1] == ("gpu-2", "gpu-3")
    # every pair fails (the image, the fabric, two colluding partners): nobody's fault alone
    test, _ = outcomes(pairs("gpu-1+gpu-2", "gpu-1+gpu-3", "gpu-2+gpu-3"))
    assert [r.status for r in judge_node(broken, [a, b], test, proven={"gpu-2", "gpu-3"})] == ["WARN"]


def test_two_new_partners_that_pass_together_fail_no_honest_node():
    """Two hostile nodes at the node's provider pass with each other and fail every pair with
    anyone else: neither passed a gate before nor is vouched for, so the honest node is warned,
    not failed; a proven partner is tried first, and one honest pair is enough to pass."""
    honest, liar_1, liar_2, old = N("gpu-1"), N("liar-1"), N("liar-2"), N("gpu-0")
    test, asked = outcomes(pairs("gpu-1+liar-1", "gpu-1+liar-2"))
    (verdict,) = judge_node(honest, [liar_1, liar_2], test, proven=set())
    assert (verdict.status, verdict.node) == ("WARN", "gpu-1")
    assert "liar-1 and liar-2 passed no gate before" in verdict.reason and "not attributed" in verdict.reason
    assert asked == [("gpu-1", "liar-1"), ("gpu-1", "liar-2"), ("liar-1", "liar-2")]
    # one of the two proven is not enough: the other may be the colluder
    (verdict,) = judge_node(honest, [liar_1, liar_2], test, proven={"liar-1"})
    assert verdict.status == "WARN" and "liar-2 passed no gate before" in verdict.reason
    # a node proven before is paired first, whatever the order of the peers
    test, asked = outcomes(pairs("gpu-1+liar-1", "gpu-1+liar-2"))
    (verdict,) = judge_node(honest, [liar_1, liar_2, old], test, proven={"gpu-0"})
    assert verdict.status == "PASS" and asked == [("gpu-1", "gpu-0")]


def test_partners_are_at_the_nodes_provider_and_a_lone_node_is_skipped():
    node = N("gpu-1")
    peers = [N("gpu-1"), N("far", "q"), N("gpu-2"), N("gpu-3")]
    assert [p.name for p in partners_of(node, peers)] == ["gpu-2", "gpu-3"]
    test, asked = outcomes(set())
    assert [r.status for r in judge_node(node, [], test, proven=set())] == ["SKIP"] and asked == []


def test_proven_are_servers_nodes_vouched_for_and_open_nodes_that_passed_before():
    nodes = """\
  - {name: cp-1, address: 10.0.0.1, role: server}
  - {name: gpu-1, address: 10.0.0.2}
  - {name: gpu-2, address: 10.0.0.3}
  - {name: gpu-3, address: 10.0.0.4}
  - {name: gpu-4, address: 10.0.0.5%s}
"""
    objects = {"gpu-1": {"metadata": {"name": "gpu-1", "uid": "u1"}},
               "gpu-2": {"metadata": {"name": "gpu-2", "uid": "u2-again"}},  # registered again since it passed
               "gpu-3": {"metadata": {"name": "gpu-3", "uid": "u3"}, "spec": {"taints": [GATE_TAINT]}},  # gated again
               "gpu-4": {"metadata": {"name": "gpu-4", "uid": "u4"}}}
    verdicts = {"gpu-1": "u1", "gpu-2": "u2", "gpu-3": "u3"}
    every_node_trusted = parse_inventory("cluster: t\ngpu: {}\nnodes:\n" + nodes % "", "inv.yaml")
    assert proven_nodes(every_node_trusted, objects, verdicts) == {"cp-1", "gpu-1"}
    some_untrusted = parse_inventory("cluster: t\ngpu: {}\nnodes:\n" + nodes % ", trusted: false", "inv.yaml")
    assert proven_nodes(some_untrusted, objects, verdicts) == {"cp-1", "gpu-1", "gpu-2", "gpu-3"}
