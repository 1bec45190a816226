"""No import circles in the tool: every `import` in bootstrap/ and deploys/ (bootstrap.deploys),
at module level AND inside functions, is an edge; a cycle among them fails with its path.

A function-level import hides a circle from Python (it runs later, when both modules are
loaded) but not from a reader: two modules that need each other are one module in two
files. Imports under `if TYPE_CHECKING:` never run and are left out."""

from __future__ import annotations

import ast
from pathlib import Path
from repo_paths import ROOT

PACKAGES = {"bootstrap": ROOT / "bootstrap", "bootstrap.deploys": ROOT / "deploys"}


def module_files() -> dict[str, Path]:
    """{module name: file} for every module of the tool."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom in the tree, at any depth, except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The tool's modules that `name` imports (`from a import b`: a.b when it is a module, else a)."""
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = _package_of(name, path)
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names]
        for candidate in candidates:
            while candidate and candidate not in modules:  # `import bootstrap.x.y as z`, a name in a module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    names = set(files)
    # Package __init__ modules of the tool are import plumbing (bootstrap's maps deploys/);
    # an edge into a package is an edge into its __init__, which imports none of the tool.
    return {name: imported_modules(name, path, names) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), as one cycle's path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter[0]
                    counter[0] += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(_one_cycle(graph, set(component)))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return components


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & component):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    return sorted(component)


def test_the_walker_sees_function_level_imports_and_cycles(tmp_path):
    """The walker itself: a circle hidden in a function is found; TYPE_CHECKING is not an edge."""
    (tmp_path / "a.py").write_text("import bootstrap.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from bootstrap import a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bootstrap.a\n")
    files = {"bootstrap.a": tmp_path / "a.py", "bootstrap.b": tmp_path / "b.py", "bootstrap.c": tmp_path / "c.py"}
    graph = {name: imported_modules(name, path, set(files)) for name, path in files.items()}
    assert graph == {"bootstrap.a": {"bootstrap.b"}, "bootstrap.b": {"bootstrap.a"}, "bootstrap.c": set()}
    assert cycles(graph) == [["bootstrap.a", "bootstrap.b", "bootstrap.a"]]


def test_the_graph_covers_the_tool():
    graph = import_graph()
    assert "bootstrap.remote.session" in graph and "bootstrap.deploys.converge" in graph
    assert "bootstrap.remote.archive" in graph["bootstrap.deploys.converge"]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (module-level or function-level imports):\n" + \
        "\n".join(" -> ".join(cycle) for cycle in found)


def test_paramiko_is_imported_by_one_module():
    """paramiko only where pyinfra has no API (the bastion hop, the API tunnel, the byte
    channels under pyinfra's connection), in one module: bootstrap.remote.sshlink."""
    importers = set()
    for name, path in module_files().items():
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "paramiko" or n.startswith("paramiko.") for n in names):
                importers.add(name)
    assert importers == {"bootstrap.remote.sshlink"}
