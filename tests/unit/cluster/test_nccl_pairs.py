"""Whose fault a failing NCCL pair is (bootstrap.cluster.nccl_pairs), pure: the pair tests'
outcomes are the test's data. Issue 32 item 12: the gate pinned a pair's failure on the gated
node, so a hostile partner (one that fails every pair it is in) failed every honest node."""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.cluster.checks import CheckResult
from bootstrap.cluster.nccl_pairs import judge_node, partners_of


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
    verdict, warning = judge_node(honest, [liar, other], test)
    assert (verdict.status, verdict.node) == ("PASS", "gpu-1") and verdict.reason.startswith("with gpu-3: bus bandwidth")
    assert (warning.status, warning.node) == ("WARN", "gpu-1")
    assert warning.reason.startswith("the pair with liar failed, not this node's (it passed with gpu-3)")
    assert asked == [("gpu-1", "liar"), ("gpu-1", "gpu-3")]
    # the only partner is the liar: the pair is reported, the node not failed
    (alone,) = judge_node(honest, [liar], test)
    assert alone.status == "WARN" and "not attributed to this node" in alone.reason


def test_a_node_fails_only_with_two_partners_that_pass_together():
    broken, a, b = N("gpu-1"), N("gpu-2"), N("gpu-3")
    test, asked = outcomes(pairs("gpu-1+gpu-2", "gpu-1+gpu-3"))
    (verdict,) = judge_node(broken, [a, b], test)
    assert verdict.status == "FAIL" and verdict.reason.startswith("failed with gpu-2")
    assert "which pass together" in verdict.reason and asked[-1] == ("gpu-2", "gpu-3")
    # every pair fails (the image, the fabric, two colluding partners): nobody's fault alone
    test, _ = outcomes(pairs("gpu-1+gpu-2", "gpu-1+gpu-3", "gpu-2+gpu-3"))
    assert [r.status for r in judge_node(broken, [a, b], test)] == ["WARN"]


def test_partners_are_at_the_nodes_provider_and_a_lone_node_is_skipped():
    node = N("gpu-1")
    peers = [N("gpu-1"), N("far", "q"), N("gpu-2"), N("gpu-3")]
    assert [p.name for p in partners_of(node, peers)] == ["gpu-2", "gpu-3"]
    test, asked = outcomes(set())
    assert [r.status for r in judge_node(node, [], test)] == ["SKIP"] and asked == []
