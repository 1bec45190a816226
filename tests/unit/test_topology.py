"""The derived facts of the cluster's shape (bootstrap.topology) are resolved once per run
and read by everyone: no module but bootstrap/topology.py works out the GPU nodes or the
embedded mirror itself (issue 24, item 3: "Nobody recomputes them")."""

import ast

from repo_paths import ROOT

PACKAGES = ("bootstrap", "deploys")
DERIVED = {"gpu_nodes", "embedded_mirror_on"}  # what resolve_topology works out
ALLOWED = {"bootstrap/topology.py"}


def recomputations(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call of a derivation (`gpu_nodes(...)`, `x.embedded_mirror_on(...)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in DERIVED:
                found.append((node.lineno, name))
    return found


def test_only_the_topology_derives_the_gpu_nodes_and_the_embedded_mirror():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}(...): read it from the run's topology"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in ALLOWED
             for line, name in recomputations(path.read_text())]
    assert found == [], "\n".join(found)


def test_the_check_finds_a_call_by_name_or_attribute_and_not_a_field():
    source = ("from bootstrap import topology\n"
              "a = gpu_nodes(inventory, facts)\n"
              "b = topology.embedded_mirror_on(inventory, True)\n"
              "c = run.topology.gpu_nodes\n"  # the resolved field: reading it is the point
              "def f(gpu_nodes): return len(gpu_nodes)\n")
    assert recomputations(source) == [(2, "gpu_nodes"), (3, "embedded_mirror_on")]
