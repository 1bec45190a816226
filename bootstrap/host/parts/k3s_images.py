"""Images in k3s's containerd: the air-gap folder's archives, and the images pulled ahead.

k3s imports the archives in agent/images when it starts, and (from the January 2025
releases) a new one while it runs, so adding images restarts nothing; the tool only waits
for k3s to say it imported them.

GPU nodes get the images validation, the GPU Operator and the first jobs need pulled in
the background, starting as soon as k3s runs there: the tool writes them as an image list
(.txt) into agent/images once k3s runs, and k3s's image watcher pulls them through the CRI
(registries.yaml's mirrors apply, one image after the other: k3s-io/docs
docs/add-ons/import-images.md, "Online image importing", version gate v1.32.0+k3s1,
v1.31.5+k3s1, v1.30.9+k3s1, v1.29.13+k3s1) while `up` goes on. Never before k3s starts: k3s pulls
every list it finds at start before it starts the kubelet (k3s-io/k3s
pkg/agent/containerd/containerd.go, Run returns PreloadImages; the k3s docs' "Import
Images"), so a (re)start would wait for gigabytes. A k3s too old to watch the folder gets
`crictl pull`s started in the background instead.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from bootstrap.host.release import K3sArtifacts, airgap_folder, image_archives
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.parts.base import Action, Draft, FileSpec, text_file
from bootstrap.host.parts.k3s_service import K3S_DATA_DIR
from bootstrap.host.parts.manifest import STATE_DIR
from bootstrap.host.images import missing, normalise
from bootstrap.inventory.model import Inventory
from bootstrap.checks import k3s_versions

IMAGES_DIR = f"{K3S_DATA_DIR}/agent/images"
ARCHES = ("amd64", "arm64")  # the arches whose archives the probe asks after


def archive_path(archive: Path) -> str:
    return f"{IMAGES_DIR}/{archive.name}"


# What a GPU node was last asked to pull (the tool's record, outside agent/images, which k3s
# would read): the same list again is not asked again, so a second `up` while the first
# one's pulls still run changes nothing (it says what is still downloading).
PULLS_REQUESTED = f"{STATE_DIR}/image-pulls.txt"


def paths(inventory: Inventory) -> set[str]:
    """Every archive a host of this inventory may hold (none without an air-gap folder), and
    the record of the pulls asked for."""
    if not inventory.k3s.airgap:
        return {PULLS_REQUESTED}
    folder = airgap_folder(inventory)
    return {archive_path(p) for arch in ARCHES for p in image_archives(folder, arch)} | {PULLS_REQUESTED}


def pulls_record(images: list[str]) -> list[FileSpec]:
    """The record of what this node is to hold (none for a node that is to pull nothing)."""
    return [text_file(PULLS_REQUESTED, "".join(f"{i}\n" for i in images))] if images else []


def files(artifacts: K3sArtifacts) -> list[FileSpec]:
    return [FileSpec(archive_path(a.path), 0o644, a.sha256, local=a.path, image_archive=True, size=a.size)
            for a in artifacts.images]


# k3s imports what lands in agent/images while it runs (watcher.go) from the January 2025
# releases on (docs.k3s.io/import-images: v1.32.0+k3s1, v1.31.5+k3s1, v1.30.9+k3s1,
# v1.29.13+k3s1); before, only when it starts. What it imports it pins, so kubelet's image
# garbage collection keeps it on an air-gapped node (an extra `ctr images import` did not).
IMPORTS_WHILE_RUNNING = {(1, 32): "v1.32.0+k3s1", (1, 31): "v1.31.5+k3s1", (1, 30): "v1.30.9+k3s1",
                         (1, 29): "v1.29.13+k3s1"}
SERVICE_START_S = 300  # k3s's own start, without images
IMPORT_S_PER_GIB = 60  # decompress and unpack; a 20 GiB CUDA archive takes minutes


def imports_while_running(version: str | None) -> bool:
    running = k3s_versions.parse(version)
    if running is None:
        return False
    first = IMPORTS_WHILE_RUNNING.get((running.major, running.minor))
    if first is not None:
        return running >= k3s_versions.parse(first)
    return (running.major, running.minor) > max(IMPORTS_WHILE_RUNNING)


def import_seconds(archive_bytes: int) -> int:
    return math.ceil(archive_bytes / (1 << 30) * IMPORT_S_PER_GIB)


def start_timeout(archives: list[FileSpec]) -> int:
    """k3s imports every archive in agent/images before it reports started: the wait for
    a (re)start grows with what the node holds."""
    return SERVICE_START_S + import_seconds(sum(a.size for a in archives))


def await_import_line(unit: str, paths: list[str], timeout: int) -> str:
    """Wait until k3s logs each new archive imported (watcher.go: "Imported images from
    PATH in ..."; "Failed to import PATH: ..." fails at once), counting only log lines
    from after the file was installed."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (f"for a in {quoted}; do s=$(stat -c %Y \"$a\"); i=0; while :; do "
            f"log=$(journalctl -u {unit} --since \"@$s\" -o cat --no-pager 2>/dev/null); "
            "if printf '%s\\n' \"$log\" | grep -qF \"Imported images from $a in\"; then break; fi; "
            "if printf '%s\\n' \"$log\" | grep -qF \"Failed to import $a\"; then "
            "echo \"k3s could not import $a: $(printf '%s\\n' \"$log\" | grep -F \"Failed to import $a\" | tail -n 1)\" >&2; "
            "exit 1; fi; "
            f"i=$((i+1)); if [ $i -ge {timeout} ]; then echo \"k3s did not import $a within {timeout} s\" >&2; exit 1; fi; "
            "sleep 1; done; done")


def plan_import(draft: Draft, running_version: str | None, archives: list[FileSpec]) -> None:
    """New archives on a node whose k3s keeps running: k3s imports them itself (and pins
    them), so wait for that; a k3s too old to import while running is restarted, as it
    imports at start. `archives`: all the node holds (the start's wait grows with them)."""
    plan = draft.plan
    plan.start_timeout = start_timeout(archives)
    new = [u for u in plan.uploads if u.image_archive]
    if not new or plan.service is not None:
        return  # nothing new, or k3s (re)starts now and imports at start
    names = ", ".join(a.path.rsplit("/", 1)[-1] for a in new)
    if imports_while_running(running_version):
        draft.add(Action.AWAIT_IMAGE_IMPORT,
                  [await_import_line(plan.unit, [a.path for a in new], import_seconds(sum(a.size for a in new)) + 60)],
                  f"k3s imports images from {names}")
    else:
        plan.service = "restart"
        plan.changes.append(f"restart {plan.unit}: k3s {running_version or '(unknown version)'} imports "
                            f"{names} only when it starts")


# The tool's image lists: a new name each time (k3s's watcher imports a file again only when
# its size changed and it is newer, watcher.go processImageEvent, so the same list rewritten
# would not be pulled again); written as .part (a name the watcher ignores: isFileSupported)
# and renamed, so k3s never reads half a list.
IMAGE_LIST_GLOB = f"{IMAGES_DIR}/bootstrap-pull-*.txt"

# A list left in agent/images holds every later start of k3s, the ones the tool does not make
# too (a reboot, a crash, containerd dying mid-pull): k3s pulls each list it finds before it
# goes on to the kubelet (k3s-io/k3s pkg/agent/containerd/containerd.go, PreloadImages ->
# importAndWatchImages, which "block[s] until the workqueue is empty"; k3s-io/docs
# blog/2025-11-11-strategies-for-large-images.md: "K3s won't successfully start until all
# images have been pulled"). So no list outlives its pulls (pin_when_pulled removes it), and
# the unit removes the tool's lists before every start (ExecStartPre): a start never waits on
# one. A start that found one removes the record of what was asked too, so the next `up` asks
# again for what is still missing. Only the tool's lists: a .txt of the air-gap folder is the
# user's, pulled at every start as k3s documents.
BEFORE_START = (f"/bin/sh -c 'if ls {IMAGE_LIST_GLOB} >/dev/null 2>&1; then "
                f"rm -f {IMAGE_LIST_GLOB} {PULLS_REQUESTED}; fi'",)

# What was pulled stays: kubelet's image garbage collection never removes an image the CRI
# reports pinned (kubernetes pkg/kubelet/images/image_gc_manager.go), which containerd's CRI
# takes from the label io.cri-containerd.pinned=pinned (internal/cri/store/image) and sees
# change through the image's update event (internal/cri/server/events.go). k3s pins what it
# pulls from a list as well, but beside its own label io.cattle.k3s.pinned, and at every start
# clears both from each image that carries its own (containerd.go, clearLabels, then labels
# again what agent/images holds): with the list gone, its pin would end at the next start. So
# the tool's pin is the CRI label alone, k3s's own taken off.
PIN_LABELS = ("io.cri-containerd.pinned=pinned", "io.cattle.k3s.pinned=")  # `ctr images label`: "k=" clears k
PULLS_DEADLINE_S = 3 * 3600  # a node's pulls: multi-GB CUDA images; past it the list goes and `up` asks again
PULLS_POLL_S = 10
# One ctr/crictl call of the detached helper: a containerd that stopped answering must not
# hold it past its deadline (neither sets a time-out of its own on its socket calls).
CTR_TIMEOUT_S = 60


def pin_lines(names: str) -> str:
    """Shell text: pin each of `names` (containerd names, quoted) that the node holds."""
    labels = " ".join(PIN_LABELS)
    return (f"for i in {names}; do timeout {CTR_TIMEOUT_S} k3s ctr -n k8s.io images label \"$i\" {labels} "
            ">/dev/null 2>&1; done")


def pin_when_pulled(names: str) -> str:
    """The detached line that waits (every PULLS_POLL_S, at most PULLS_DEADLINE_S) until the node
    holds every image of the list "$l" or the list is gone (a start removed it, a newer list
    replaced it), then pins what it holds and removes the list. Past the deadline the record
    of what was asked goes with the list, so the next `up` asks again. Once all are there it
    waits one poll more: k3s labels a list's images right after its last pull returns
    (labelImages), and the tool's label must come after, or k3s's would stay beside it."""
    waiting = (f"end=$(($(date +%s) + {PULLS_DEADLINE_S})); while [ -e \"$l\" ]; do n=0; "
               f"for i in \"$@\"; do timeout {CTR_TIMEOUT_S} k3s crictl inspecti \"$i\" >/dev/null 2>&1 "
               "|| n=$((n + 1)); done; "
               f"if [ $n = 0 ]; then sleep {PULLS_POLL_S}; break; fi; "
               f"if [ $(date +%s) -ge $end ]; then rm -f {PULLS_REQUESTED}; break; fi; "
               f"sleep {PULLS_POLL_S}; done; ")
    body = waiting + pin_lines('\"$@\"') + '; rm -f \"$l\"'
    return f"setsid sh -c {shlex.quote('l=$1; shift; ' + body)} pin \"$l\" {names} </dev/null >/dev/null 2>&1 &"


def pull_in_background_lines(images: list[str], watches_folder: bool | None) -> list[str]:
    """Shell lines (root) that start pulling `images` and return at once, and pin them once
    pulled. `watches_folder` None (an air-gap binary of unknown version): the host's k3s
    --version decides."""
    refs = " ".join(shlex.quote(i) for i in images)
    names = " ".join(shlex.quote(normalise(i)) for i in images)  # as containerd's CRI stores them
    listed = [f"mkdir -p {IMAGES_DIR}",
              f"rm -f {IMAGE_LIST_GLOB}",
              f"l={IMAGES_DIR}/bootstrap-pull-$(date +%s%N).txt",
              f"printf '%s\\n' {refs} > \"$l.part\" && mv -f \"$l.part\" \"$l\"",
              pin_when_pulled(names)]
    # Detached from the session (setsid, no terminal, no open output): the command returns
    # while the pulls go on; one failing does not stop the others. They end by the list's
    # deadline (PULLS_DEADLINE_S): a registry that stalls a pull (crictl sets none) would
    # otherwise keep the helper on the host for good.
    pull_and_pin = (f'end=$(($(date +%s) + {PULLS_DEADLINE_S})); for i in "$@"; do left=$((end - $(date +%s))); '
                    '[ $left -gt 0 ] || break; timeout $left k3s crictl pull "$i" >/dev/null 2>&1; done; '
                    + pin_lines('"$@"'))
    pulled = [f"setsid sh -c {shlex.quote(pull_and_pin)} pull {names} </dev/null >/dev/null 2>&1 &"]
    if watches_folder is None:
        return [f"if k3s --version 2>/dev/null | {WATCHES_FOLDER_AWK}; then", *listed, "else", *pulled, "fi"]
    return listed if watches_folder else pulled


# `k3s --version`'s first line ("k3s version v1.33.5+k3s1 (...)") against IMPORTS_WHILE_RUNNING:
# exit 0 when that k3s watches agent/images.
WATCHES_FOLDER_AWK = (
    "awk 'NR == 1 { split(substr($3, 2), v, /[.+-]/); k = (v[1] + 0) \".\" (v[2] + 0); "
    + "; ".join(f"first[\"{ma}.{mi}\"] = {k3s_versions.parse(v).patch}" for (ma, mi), v in sorted(IMPORTS_WHILE_RUNNING.items()))
    + f"; ok = (k in first) ? (v[3] + 0 >= first[k]) : (v[1] + 0 > 1 || v[2] + 0 > {max(IMPORTS_WHILE_RUNNING)[1]}) }} "
    "END { exit !ok }'")


def plan_prepull(draft: Draft, wanted: list[str], facts: HostFacts, version_after: str | None = None) -> None:
    """`wanted`: what this node should hold (empty but on GPU nodes); `version_after`: the k3s
    version that runs here once the plan is carried out (it decides list or crictl). Pulls
    start after a (re)start, or when the list asked for changed (PULLS_REQUESTED): the same
    list while k3s runs is being pulled already."""
    plan = draft.plan
    if wanted and plan.service is not None:
        # A list of an earlier run whose pulls are unfinished would hold this (re)start (k3s
        # pulls the lists it finds at start first): removed now, written again after it. (The
        # unit's BEFORE_START would remove it too, and with it the record this run writes.)
        plan.prepare.append(f"rm -f {IMAGE_LIST_GLOB}")
    asked_before = not any(u.path == PULLS_REQUESTED for u in plan.uploads)
    plan.prepull = missing(wanted, facts.images)
    if not plan.prepull or (plan.service is None and asked_before):
        plan.prepull = []
        return
    plan.actions.add(Action.PULL_IMAGES)
    watches = None if version_after is None else imports_while_running(version_after)
    lines = pull_in_background_lines(plan.prepull, watches)
    if plan.service is None:
        plan.prepare += lines  # k3s runs: with the host's other changes, in the same command
    else:
        plan.pull_after_start = lines  # once k3s runs (bootstrap.host.plan.steps)
    plan.changes.append(f"pull images in the background: {', '.join(plan.prepull)}")
