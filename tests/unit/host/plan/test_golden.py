"""Golden files for the pure planning outputs, as pyinfra tests its operations: facts in
(JSON under tests/fixtures/golden/), actions and commands out (tests/fixtures/golden/expected/).

- the host plans of a fresh cluster and of the same cluster converged (bootstrap.host.plan.all_hosts.make_plans,
  which runs desired_state and plan_host per host),
- the step list `bootstrap.host.plan.steps.converge_steps` renders (step names, each host's command texts;
  the random staging dir name normalised),
- the teardown script for a recorded manifest (bootstrap.host.teardown.teardown_script).

When an output changes on purpose, regenerate and review the diff:

    BOOTSTRAP_UPDATE_GOLDEN=1 pytest tests/unit/host/plan/test_golden.py && git diff tests/fixtures/golden
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import io
import json
import os
import re
import types
import typing
from pathlib import Path

import pytest

from bootstrap.host.plan.all_hosts import make_plans
from bootstrap.host.plan.join_tokens import JoinTokens
from bootstrap.host.plan.steps import converge_steps
from bootstrap.host.release import online_artifacts
from bootstrap.host.facts import host_facts as model
from bootstrap.inventory.loader import load_inventory
from bootstrap.host.teardown import teardown_script
from repo_paths import TESTS

GOLDEN = TESTS / "fixtures" / "golden"
EXPECTED = GOLDEN / "expected"
UPDATE = os.environ.get("BOOTSTRAP_UPDATE_GOLDEN") == "1"
TOKEN = "golden-join-token"  # fixed, so config.yaml's checksum is too; never shown in a golden file
# The joins of a cluster whose first server runs: secure tokens naming a fixed CA hash.
TOKENS = JoinTokens(TOKEN, "golden-agent-token", ca_hash="c0" * 32)
CLUSTER_ID = "0123456789abcdef"
TOOLKIT_SOURCE = "deb [trusted=yes] http://10.200.0.1:8000/ ./"  # the apt line `up` wrote (its lists go too)
STAGE = re.compile(r"/tmp/bootstrap-stage-[0-9a-f]+")


# --- facts in ---------------------------------------------------------------------------------

def from_json(kind, value):
    """A value of type `kind` (model's annotations) from its JSON form (HostFacts.to_dict())."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, value)
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        fields = {f.name for f in dataclasses.fields(kind)}
        unknown = set(value) - fields - {name for name, a in vars(kind).items() if isinstance(a, property)}
        assert not unknown, f"{kind.__name__} has no fields {sorted(unknown)}"
        return kind(**{name: from_json(hints[name], v) for name, v in value.items() if name in fields})
    if origin is list:
        return [from_json(args[0], v) for v in value]
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in value.items()}
    if origin is tuple or kind is tuple:
        return tuple(value) if not args or args[-1] is Ellipsis else tuple(from_json(a, v) for a, v in zip(args, value))
    return value


def load_facts(name: str) -> dict[str, model.HostFacts]:
    data = json.loads((GOLDEN / name).read_text())
    return {node: from_json(model.HostFacts, facts) for node, facts in data.items()}


def test_facts_fixtures_round_trip():
    """The JSON is exactly what HostFacts.to_dict() writes, so the loader above loses nothing."""
    for name in ("facts-fresh.json", "facts-converged.json"):
        data = json.loads((GOLDEN / name).read_text())
        assert set(data) == {"cp-1", "gpu-1", "cpu-1"}
        assert {node: facts.to_dict() for node, facts in load_facts(name).items()} == data


INVENTORY = load_inventory(GOLDEN / "inventory.yaml")


def plans_for(facts: dict[str, model.HostFacts]):
    artifacts = {"amd64": online_artifacts(INVENTORY.k3s.version, "amd64")}
    return make_plans(INVENTORY, facts, TOKENS, artifacts, CLUSTER_ID).plans


# --- rendering --------------------------------------------------------------------------------

def content(data: bytes, secret: bool) -> list[str]:
    digest = hashlib.sha256(data).hexdigest()
    if secret:
        return [f"    <secret: {len(data)} bytes, sha256 {digest}>"]
    try:
        return [f"    | {line}" for line in data.decode().splitlines()]
    except UnicodeDecodeError:
        return [f"    <binary: {len(data)} bytes, sha256 {digest}>"]


def render_plan(name: str, plan) -> list[str]:
    out = [f"== {name} (unit {plan.unit})", f"changed: {plan.changed}", f"service: {plan.service}",
           f"verify_nvidia_runtime: {plan.verify_nvidia_runtime}",
           f"actions: {', '.join(sorted(str(getattr(a, 'name', a)) for a in getattr(plan, 'actions', ())))}",
           "changes:", *[f"  {c}" for c in plan.changes], "uploads:"]
    for spec in plan.uploads:
        out.append(f"  {spec.path} mode {spec.mode:04o}{' secret' if spec.secret else ''}"
                   f"{' restarts k3s' if spec.restarts_k3s else ''}")
        out += [f"    <local file {spec.local}>"] if spec.local else content(spec.content, spec.secret)
    out.append("prepare:")
    out += [f"  | {line}" for text in plan.prepare for line in text.splitlines()]
    out += ["prepull:", *[f"  {image}" for image in plan.prepull], ""]
    return out


def render_plans(plans) -> str:
    return "\n".join(line.rstrip() for name in sorted(plans) for line in render_plan(name, plans[name]))


def render_command(command) -> list[str]:
    if hasattr(command, "function"):  # pyinfra FunctionCommand: a script with files on its stdin
        args, script = [], []
        for arg in command.args:
            if isinstance(arg, list):
                args.append("[" + ", ".join(f"<{len(s.getvalue())} bytes, sha256 "
                                            f"{hashlib.sha256(s.getvalue()).hexdigest()[:16]}>"
                                            if isinstance(s, io.BytesIO) else str(s) for s in arg) + "]")
            elif isinstance(arg, str) and "\n" in arg:
                assert TOKEN not in arg
                args.append("<script>")
                script = ["$ " + line if i == 0 else "  " + line for i, line in enumerate(arg.splitlines())]
            else:
                args.append(str(arg))
        return [f"call {command.function.__name__}({', '.join(args)})", *script]
    text = str(command)
    assert TOKEN not in text
    return ["$ " + line if i == 0 else "  " + line for i, line in enumerate(text.splitlines())]


def render_steps(steps) -> str:
    out = []
    for step in steps:
        out.append(f"== step: {step.name}")
        for host in sorted(step.commands):
            out.append(f"-- {host}")
            for command in step.commands[host]:
                out += render_command(command)
        out.append("")
    return STAGE.sub("/tmp/bootstrap-stage-<random>", "\n".join(line.rstrip() for line in out))


def check_golden(name: str, actual: str):
    path = EXPECTED / name
    actual = actual.rstrip("\n") + "\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != actual:
            path.write_text(actual)
            pytest.skip(f"BOOTSTRAP_UPDATE_GOLDEN=1: wrote {path}")
        return
    assert path.exists(), f"no golden file {path}: run BOOTSTRAP_UPDATE_GOLDEN=1 pytest tests/unit/host/plan/test_golden.py"
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"expected/{name}", f"actual/{name}"))
        pytest.fail(f"{name} differs from its golden file (- expected, + actual). If the change is intended:\n"
                    f"  BOOTSTRAP_UPDATE_GOLDEN=1 pytest tests/unit/host/plan/test_golden.py\n\n{diff}", pytrace=False)


# --- the golden tests -------------------------------------------------------------------------

def test_fresh_cluster_plans():
    plans = plans_for(load_facts("facts-fresh.json"))
    assert sorted(plans) == ["cp-1", "cpu-1", "gpu-1"] and all(p.changed and p.service == "start"
                                                                 for p in plans.values())
    text = render_plans(plans)
    assert TOKEN not in text
    check_golden("plan-fresh.txt", text)


def test_converged_cluster_plans_nothing():
    plans = plans_for(load_facts("facts-converged.json"))
    assert sorted(plans) == ["cp-1", "cpu-1", "gpu-1"]
    assert not [(name, p.changes) for name, p in plans.items() if p.changed]
    check_golden("plan-converged.txt", render_plans(plans))


def test_fresh_cluster_converge_steps():
    plans = plans_for(load_facts("facts-fresh.json"))
    steps = converge_steps(INVENTORY, plans, failed=set())
    names = [s.name for s in steps]
    assert names[0] == "prepare host" and "start server cp-1" in names and "join agents" in names
    assert all(step.commands for step in steps), [s.name for s in steps if not s.commands]
    text = render_steps(steps)
    assert text == render_steps(converge_steps(INVENTORY, plans, failed=set()))  # nothing random is left
    check_golden("steps-fresh.txt", text)


def test_converged_cluster_converge_steps_run_nothing():
    plans = plans_for(load_facts("facts-converged.json"))
    steps = converge_steps(INVENTORY, plans, failed=set())
    assert not [s.name for s in steps if any(s.commands.values())]
    check_golden("steps-converged.txt", render_steps(steps))


@pytest.mark.parametrize("purge", [False, True], ids=["keep-drivers", "purge-drivers"])
def test_teardown_script(purge):
    manifest = json.loads((GOLDEN / "teardown-manifest.json").read_text())
    assert manifest["files"] and manifest["packages_installed"]
    script = teardown_script(manifest, purge_drivers=purge, toolkit_source=TOOLKIT_SOURCE)
    check_golden(f"teardown-{'purge' if purge else 'keep'}-drivers.sh", script)
