"""The tool's image lists against the k3s stand-in, which treats agent/images as k3s does (issue
32, item 4): k3s pulls every list it finds before a start goes on, pins what a list brought
with its own label beside the CRI's, and clears those pins at its next start
(k3s-io/k3s pkg/agent/containerd/containerd.go: PreloadImages, labelImages, clearLabels). So
a list must not outlive its pulls, a start must never wait on one, and the pin must be the
tool's own."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from test_k3s_standin import (PASSWORD, airgap_dir, interpreter, k3s, needs_upstream, procs, run,  # noqa: F401
                              start_server)

from bootstrap.host.parts import k3s_images, k3s_service
from bootstrap.host.parts.manifest import STATE_DIR
from bootstrap.inventory.loader import parse_inventory


def on_host(text: str, root: Path) -> str:
    """The tool's shell text with the host's paths under the sandbox root."""
    return text.replace("/var/lib/rancher", f"{root}/var/lib/rancher").replace(STATE_DIR, f"{root}{STATE_DIR}")


def k3s_command(tmp_path: Path, k3s: Path, root: Path) -> dict:
    """PATH with a `k3s` that is the stand-in in this sandbox, as the tool's lines call it."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "k3s"
    wrapper.write_text(f"#!/bin/sh\nK3S_STANDIN_ROOT={root} exec {' '.join(interpreter(k3s))} \"$@\"\n")
    wrapper.chmod(0o755)
    return {**{k: v for k, v in os.environ.items() if not k.startswith("K3S_")},
            "PATH": f"{bindir}:/usr/bin:/bin"}


def labels(k3s: Path, root: Path) -> dict[str, str]:
    listed = run(k3s, "ctr", "-n", "k8s.io", "images", "ls", root=root).stdout.splitlines()[1:]
    return {line.split("\t")[0]: line.split("\t")[-1] for line in listed}


def images_dir(root: Path) -> Path:
    return root / k3s_images.IMAGES_DIR.lstrip("/")


@needs_upstream
def test_the_stand_in_pins_what_a_list_brought_and_unpins_it_at_the_next_start(k3s, tmp_path, procs):  # noqa: F811
    root = tmp_path / "root"
    images_dir(root).mkdir(parents=True)
    (images_dir(root) / "full.txt").write_text("docker.io/example/full:1\n")
    (images_dir(root) / "short.txt").write_text("busybox:1.36\n")
    p, _ = start_server(procs, k3s, root, f"token: {PASSWORD}\n", env={"K3S_STANDIN_PULL_SECONDS": "0.1"})
    held = labels(k3s, root)
    assert held["docker.io/example/full:1"] == "io.cattle.k3s.pinned=pinned,io.cri-containerd.pinned=pinned"
    # a short name is not what the CRI stored: k3s's lookup of the list's own text fails, no pin
    assert held["docker.io/library/busybox:1.36"] == "-"
    assert f'Error encountered while importing {images_dir(root)}/short.txt: failed to pull images from' in p.log()
    p.stop()
    (images_dir(root) / "full.txt").unlink()
    start_server(procs, k3s, root, env={"K3S_STANDIN_PULL_SECONDS": "0.1"})
    assert labels(k3s, root)["docker.io/example/full:1"] == "-"  # its list gone: k3s cleared its pin


@needs_upstream
@pytest.mark.parametrize("wanted", [["busybox:1.36", "ghcr.io/example/train:1.0"],
                                    # written in full: k3s pins them too, with its own label beside
                                    ["docker.io/library/busybox:1.36", "ghcr.io/example/train:1.0"]])
def test_the_tools_list_goes_once_pulled_and_what_it_pulled_stays_pinned_across_starts(k3s, tmp_path, procs,  # noqa: F811
                                                                                       monkeypatch, wanted):
    monkeypatch.setattr(k3s_images, "PULLS_POLL_S", 1)
    root = tmp_path / "root"
    p, _ = start_server(procs, k3s, root, f"token: {PASSWORD}\n", env={"K3S_STANDIN_PULL_SECONDS": "1"})
    record = root / k3s_images.PULLS_REQUESTED.lstrip("/")
    record.parent.mkdir(parents=True)
    record.write_text("".join(f"{i}\n" for i in wanted))
    lines = on_host("\n".join(k3s_images.pull_in_background_lines(wanted, watches_folder=True)), root)
    subprocess.run(["sh", "-c", lines], env=k3s_command(tmp_path, k3s, root), check=True, timeout=30)
    deadline = time.monotonic() + 60
    while list(images_dir(root).glob("bootstrap-pull-*.txt")):
        assert time.monotonic() < deadline, "the tool's list outlived its pulls:\n" + p.log()
        time.sleep(0.5)
    assert "Pulling image ghcr.io/example/train:1.0" in p.log()
    pinned = {ref: labels(k3s, root)[ref] for ref in ("docker.io/library/busybox:1.36", "ghcr.io/example/train:1.0")}
    assert set(pinned.values()) == {"io.cri-containerd.pinned=pinned"}, pinned  # the CRI's label, not k3s's
    assert record.exists()  # asked and done: the next `up` asks nothing
    p.stop()
    again, _ = start_server(procs, k3s, root, env={"K3S_STANDIN_PULL_SECONDS": "30"})
    assert "Pulling image" not in again.log()
    assert {ref: labels(k3s, root)[ref] for ref in pinned} == pinned  # k3s's start kept the tool's pin


def test_the_unit_removes_the_tools_lists_before_every_start():
    inv = parse_inventory("cluster: t\nnodes:\n  - {name: cp, address: 10.0.0.1, role: server}\n"
                          "  - {name: g, address: 10.0.0.2}\n", "inv.yaml")
    unit = k3s_service.files(inv, inv.node("g"), "token: x\n", k3s_images.BEFORE_START)[0].content.decode()
    (line,) = k3s_images.BEFORE_START
    assert f"ExecStartPre=-{line}\n" in unit
    assert unit.index("ExecStartPre=-/bin/sh") < unit.index("ExecStart=")
    assert "$" not in line and "%" not in line  # systemd would expand those itself


@needs_upstream
def test_a_start_never_waits_on_a_list_the_tool_left_and_up_asks_again(k3s, tmp_path, procs):  # noqa: F811
    """A reboot (or a crash, or containerd dying) while a list's gigabytes were still coming: the
    unit's ExecStartPre removes the tool's list, and the record of what was asked, so the start
    goes on at once and the next `up` asks again for what is missing. A user's own list stays."""
    root = tmp_path / "root"
    images_dir(root).mkdir(parents=True)
    (images_dir(root) / "bootstrap-pull-1733270000000000000.txt").write_text("ghcr.io/example/huge:1\n")
    (images_dir(root) / "airgap-list.txt").write_text("docker.io/example/users:1\n")
    record = root / k3s_images.PULLS_REQUESTED.lstrip("/")
    record.parent.mkdir(parents=True)
    record.write_text("ghcr.io/example/huge:1\n")
    (line,) = k3s_images.BEFORE_START
    subprocess.run(["sh", "-c", on_host(line.removeprefix("/bin/sh -c ").strip("'"), root)], check=True, timeout=10)
    started = time.monotonic()
    p, _ = start_server(procs, k3s, root, f"token: {PASSWORD}\n", env={"K3S_STANDIN_PULL_SECONDS": "1"})
    log = p.log()
    assert "ghcr.io/example/huge:1" not in log and time.monotonic() - started < 20
    assert "Pulling image docker.io/example/users:1" in log  # the user's list: k3s's to pull, as documented
    assert not record.exists() and (images_dir(root) / "airgap-list.txt").exists()
    # with no list of the tool's there, the unit's line removes nothing
    record.write_text("x\n")
    subprocess.run(["sh", "-c", on_host(line.removeprefix("/bin/sh -c ").strip("'"), root)], check=True, timeout=10)
    assert record.exists()
