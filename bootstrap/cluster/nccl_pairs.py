"""The acceptance gate's NCCL pair test, its pure half: whose fault a failing pair is. A pair
test measures two nodes at once, so its failure says only that one of them (or the path
between them) is wrong; a hostile partner can fail any pair it is in, and two hostile nodes
at one provider can pass with each other and fail any third. So a node fails only when that
is unambiguous: it failed with two different partners that pass together, both of them
proven: a node the operator vouches for (a server, or a node left trusted where the
inventory marks some node `trusted: false`), or a Node object that passed the gate in an
earlier run (the tool's verdict record, bootstrap.cluster.gate.read_verdicts). Otherwise the
failing pair is reported (WARN) and no node is failed for it (issue 32 item 12: the pair's
failure was pinned on the gated node, whoever caused it; then on a node that failed with two
new partners, who may collude). Proven partners are tried first.

`test(a, b)` runs (or recalls) the pair test of nodes `a` and `b` and returns its
bootstrap.cluster.checks.CheckResult; pairs are tested lazily, at most three per node."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Collection

from bootstrap.cluster.checks import CheckResult


def judge_node(node, partners: list, test: Callable, *, proven: Collection[str]) -> list[CheckResult]:
    """`node`'s NCCL verdict from pair tests with `partners` (nodes at its provider that
    passed their other checks): its result, and a WARN beside a PASS when a pair failed that
    was not its own. `proven`: the names of the nodes whose pairs may pin a failure on it."""
    if not partners:
        return [CheckResult("nccl", "SKIP", "no GPU node that passed the gate to pair with", node.name)]
    partners = sorted(partners, key=lambda p: p.name not in proven)  # stable: proven ones first
    a = partners[0].name
    first = test(node, partners[0])
    if first.status != "FAIL":
        return [_mine(first, node, f"with {a}: {first.reason}")]
    if len(partners) < 2:
        return [CheckResult("nccl", "WARN", f"the pair with {a} failed ({first.reason}); not attributed to this "
                            "node: no second partner to tell whose it is", node.name)]
    b = partners[1].name
    second = test(node, partners[1])
    if second.status != "FAIL":
        return [_mine(second, node, f"with {b}: {second.reason}"),
                CheckResult("nccl", "WARN", f"the pair with {a} failed, not this node's (it passed with {b}): "
                            f"{first.reason}", node.name)]
    between = test(partners[0], partners[1])
    unproven = [p for p in (a, b) if p not in proven]
    if between.status == "PASS" and not unproven:
        return [CheckResult("nccl", "FAIL", f"failed with {a} ({first.reason}) and with {b} ({second.reason}), "
                            "which pass together", node.name)]
    if between.status == "PASS":
        return [CheckResult("nccl", "WARN", f"the pairs with {a} and {b} failed ({first.reason}); they pass "
                            f"together, but {' and '.join(unproven)} passed no gate before and the operator does "
                            "not vouch for it (two new nodes may pass with each other and fail any third): "
                            "not attributed to this node", node.name)]
    return [CheckResult("nccl", "WARN", f"the pairs with {a} and {b} failed and {a} with {b} too "
                        f"({between.reason}); not attributed to this node: {first.reason}", node.name)]


def _mine(result: CheckResult, node, reason: str) -> CheckResult:
    return replace(result, node=node.name, reason=reason)


def partners_of(node, peers: list) -> list:
    """The nodes `node` may be paired with: at its provider (RDMA and NVLink stay within
    one), in the order given, itself left out."""
    return [p for p in peers if p.name != node.name and p.provider == node.provider]
