"""The source tree is testable in place: with nothing installed, `bootstrap.deploys` and
`bootstrap.manifests` (top-level folders that pyproject maps into the package only at
install time) import from a checkout, and pytest runs there.

The subprocesses run `python -S` (no site-packages, no .pth files, so no editable-install
finder) with PYTHONPATH = the repository root and a folder of links to every third-party
package on this interpreter's path (site-packages and what .pth files add) except an installed
bootstrap."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import upstream
from repo_paths import ROOT

OURS = ("bootstrap", "__editable__", "gpu_cluster_bootstrap")  # an install of this project, any kind


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    """The interpreter's third-party packages without any installed bootstrap."""
    folder = tmp_path_factory.mktemp("deps")
    stdlib = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    tests = ROOT / "tests"
    scripts = {Path(sysconfig.get_paths()["scripts"]).resolve(), Path(sys.argv[0]).resolve().parent}
    for site in dict.fromkeys(Path(p).resolve() for p in sys.path if p and Path(p).is_dir()):
        if site in scripts:
            continue  # `pytest` run as a script puts bin/ on the path: bin/pyinfra is no package
        if site in stdlib or site.parent in stdlib and site.name == "lib-dynload" or site in (ROOT, tests) \
                or site.is_relative_to(tests):
            continue  # the standard library comes with -S; the checkout and its tests are what we test
        for entry in site.iterdir():
            if not entry.name.startswith(OURS) and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


def bare_python(code_or_args, pythonpath, cwd=ROOT, env=None):
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    merged = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    merged.update(PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath), **(env or {}))
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, cwd=cwd,
                          env=merged, timeout=120)


def test_the_bare_interpreter_has_no_bootstrap_but_has_the_dependencies(deps, tmp_path):
    assert bare_python("import bootstrap", [deps], cwd=tmp_path).returncode != 0
    found = bare_python("import yaml, jinja2, pyinfra, paramiko; print('ok')", [deps], cwd=tmp_path)
    assert found.stdout == "ok\n", found.stderr


def test_deploys_and_manifests_import_from_a_checkout(deps):
    result = bare_python(
        "import sys, importlib.resources as r, bootstrap.deploys.converge, bootstrap.manifests\n"
        "print(bootstrap.__file__, bootstrap.deploys.converge.__file__, bootstrap.manifests.__file__)\n"
        "print(r.files('bootstrap.manifests').joinpath('host').is_dir())\n"
        "print(any('Editable' in type(f).__name__ or 'Editable' in getattr(f, '__name__', '') "
        "for f in sys.meta_path))\n",
        [ROOT, deps])
    assert result.returncode == 0, result.stderr
    files, is_dir, editable = result.stdout.splitlines()
    assert files.split() == [str(ROOT / "bootstrap" / "__init__.py"), str(ROOT / "deploys" / "converge.py"),
                             str(ROOT / "manifests" / "__init__.py")]
    assert is_dir == "True" and editable == "False"


def test_pytest_collects_the_whole_suite_in_a_checkout(deps):
    """What the issue found: `python -m pytest` in a checkout failed to collect."""
    env = {"BOOTSTRAP_UPSTREAM_DIR": str(upstream.UPSTREAM)}
    result = bare_python(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], [ROOT, deps], env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error" not in result.stdout.splitlines()[-1]
    assert "tests/unit/deploys/test_converge.py::" in result.stdout


def test_every_package_of_the_tree_ships_in_the_wheel():
    """pyproject lists the packages by hand (deploys/ and manifests/ are mapped in): a new
    package missing from the list imports from a checkout and is absent from a real install."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "bootstrap").rglob("__init__.py")}
    found |= {"bootstrap.deploys", "bootstrap.manifests"}
    assert found - listed == set(), f"add to pyproject's packages: {sorted(found - listed)}"
