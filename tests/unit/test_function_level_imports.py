"""An import inside a function hides what a module depends on. One is allowed only where it is
needed: to break an import circle, or to keep start-up fast (`bootstrap --help` imports every
command module; the kubernetes client takes ~0.3 s); and it says so, in a comment right above it
(or above the run of imports it opens): `# imported here: <why>`."""

import ast
import importlib.util
from pathlib import Path
from repo_paths import ROOT

PACKAGES = ("bootstrap", "deploys")
MARK = "# imported here:"



def function_level_imports(tree: ast.Module):
    """(import node, enclosing function, the modules and names the module's top level imports)"""
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= _imported(node)
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node, function, top


def unexplained(source: str) -> list[tuple[int, str, str]]:
    """(line, function, what is wrong) for each function-level import with no `# imported here:
    <why>` above it, or that imports again what the module's top level already imports."""
    tree = ast.parse(source)
    lines = source.splitlines()
    explained_until: dict[int, int] = {}  # an explained import's last line -> its indent
    found = []
    imports = sorted(function_level_imports(tree), key=lambda item: item[0].lineno)
    for node, function, top in imports:
        again = sorted(_imported(node) & top)
        if again:
            found.append((node.lineno, function.name, f"the module already imports {', '.join(again)} at its top"))
        if _has_reason(lines, node) or explained_until.get(node.lineno - 1) == node.col_offset:
            explained_until[node.end_lineno] = node.col_offset
        else:
            found.append((node.lineno, function.name, f"{lines[node.lineno - 1].strip()}: say why it is here "
                                                      f"({MARK} <why>)"))
    return found


def _imported(node) -> set[str]:
    """The names an import statement binds, and the modules it loads that cannot hold another
    submodule (`from pkg import a` at the top does not load pkg.b; `from mod import a` loads mod)."""
    if isinstance(node, ast.ImportFrom):
        names = {alias.asname or alias.name for alias in node.names}
        return names | ({node.module} if node.level == 0 and not _is_package(node.module) else set())
    return {alias.name for alias in node.names} | {alias.asname or alias.name.split(".")[0] for alias in node.names}


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is None or spec.submodule_search_locations is not None


def _has_reason(lines: list[str], node) -> bool:
    """`# imported here: <why>` on the import's own line or in the comment lines right above it."""
    if _reason_in(lines[node.lineno - 1].partition("#")[2]):
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].strip().startswith("#"):
        if _reason_in(lines[above].strip().lstrip("#")):
            return True
        above -= 1
    return False


def _reason_in(comment: str) -> bool:
    text = comment.strip()
    return text.startswith(MARK[2:]) and bool(text[len(MARK) - 2:].strip())


def _source_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT)


def test_every_function_level_import_says_why():
    found = [f"{path}:{line} in {function}(): {problem}" for path in _source_files()
             for line, function, problem in unexplained((ROOT / path).read_text())]
    assert found == [], "function-level imports with no reason:\n" + "\n".join(found)


def test_the_check_finds_an_import_with_no_reason():
    source = (
        "import os\n"
        "def a():\n"
        "    import json\n"                                   # no reason
        "def b():\n"
        "    # imported here: startup time\n"
        "    import json\n"
        "    from pathlib import Path\n"                      # the run the comment opens
        "\n"
        "    import csv\n"                                    # a new run: no reason
        "def c():\n"
        "    # imported here: breaks the circle a -> b -> a\n"
        "    import os\n"                                     # imported at the top already
        "def d():\n"
        "    import json  # imported here: startup time\n"
        "def e():\n"
        "    # imported here:\n"                              # a reason that says nothing
        "    import json\n"
        "def g():\n"
        "    # imported here: startup time\n"
        "    from os import sep\n"                           # os is imported at the top already
        "def f():\n"
        "    # imported here: startup time,\n"
        "    # and a second line of why\n"
        "    import json\n"
    )
    assert [(line, function) for line, function, _ in unexplained(source)] == [
        (3, "a"), (9, "b"), (12, "c"), (17, "e"), (20, "g")]
    assert unexplained(source)[2][2] == "the module already imports os at its top"
    assert unexplained(source)[4][2] == "the module already imports os at its top"
