"""How every host file is written: never in place.

A root script that writes into the target itself (`install -D`, `curl -o`, `>`) leaves a
truncated k3s binary, unit or config.yaml behind when the disk fills or the host, the
script or its SSH connection dies mid-write, until some later run happens to rewrite it.
So each file goes to a temp name in the TARGET's folder (one filesystem: the rename is
atomic), gets its owner and mode, is synced (`sync FILE`, coreutils >= 8.24: Debian 12
and Ubuntu 22.04 have 9.x and 8.32; a full disk often shows only at the fsync), and is
renamed over the target; the folder is synced so the rename survives a crash too.

The temp name is `.<name>.bootstrap-tmp.<random>`: hidden, and ending in random letters,
never in an extension k3s's image watcher imports (k3s-io/k3s pkg/agent/containerd/
watcher.go, isFileSupported: by suffix), so a half-written image archive is never
imported. The script's EXIT trap removes the one in progress; one left by a death the trap
could not see (SIGKILL, a host crash) is removed by the next run that writes that file,
and by `down` (`leftovers`).
"""

from __future__ import annotations

import shlex

TEMP_MARK = ".bootstrap-tmp."

# `place SOURCE MODE TARGET`. `placing` names the temp while it exists, for the trap.
# mktemp makes it 0600 and root's, so a secret is never readable while it is written.
# `mv -T`: a directory planted at the target fails the script instead of swallowing the file.
PLACE_FUNCTION = (
    "place() {",
    '  d=${3%/*}; n=${3##*/}',
    '  mkdir -p -- "$d"',
    f'  rm -f -- "$d/.$n{TEMP_MARK}"*',
    f'  placing=$(mktemp -- "$d/.$n{TEMP_MARK}XXXXXXXXXX")',
    '  cat -- "$1" > "$placing"',
    '  chown root:root -- "$placing"; chmod "$2" -- "$placing"',
    '  sync -- "$placing"',
    '  mv -fT -- "$placing" "$3"',
    '  placing=',
    '  sync -- "$d"',
    "}",
)


def script_head() -> list[str]:
    """The first lines of every root script that writes host files: `set -e`, the trap that
    removes the staging dir, the scratch dir and the temp in progress on every exit, and
    `place`. dash (Debian's sh) runs an EXIT trap on `exit` but not when a signal ends it,
    so SIGHUP (the SSH connection gone), SIGINT and SIGTERM become exits."""
    return [
        "set -e",
        "stage= scratch= placing=",
        "trap 'rm -rf ${stage:+\"$stage\"} ${scratch:+\"$scratch\"}; [ -z \"$placing\" ] || rm -f \"$placing\"' EXIT",
        "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM",
        *PLACE_FUNCTION,
    ]


def place(source: str, mode: int, target: str) -> str:
    """The line that places `source` (already shell text: `"$stage"/0`) at `target`."""
    return f"place {source} {mode:04o} {shlex.quote(target)}"


# A private scratch folder for what is fetched on the host before it is placed, removed by
# the trap. One per script, whichever line asks first.
SCRATCH = 'scratch=${scratch:-$(mktemp -d)}'


def leftovers(paths: list[str]) -> str:
    """`down`'s line: the temps an interrupted run may have left next to these files."""
    return "rm -f " + " ".join(_temp_glob(p) for p in sorted(set(paths)))


def _temp_glob(path: str) -> str:
    folder, _, name = path.rpartition("/")
    return shlex.quote(f"{folder}/.{name}{TEMP_MARK}") + "*"


def write_text(quoted_text: str, mode: int, target: str) -> str:
    """One self-contained line (for scripts without `place`, as `down`'s) that writes shell
    text `quoted_text` and a newline to `target` the same way: temp, sync, rename."""
    folder, _, name = target.rpartition("/")
    temp = shlex.quote(f"{folder}/.{name}{TEMP_MARK}") + "XXXXXXXXXX"
    return (f"t=$(mktemp {temp}) && printf '%s\\n' {quoted_text} > \"$t\" && chmod {mode:04o} \"$t\" && "
            f"sync \"$t\" && mv -fT \"$t\" {shlex.quote(target)} && sync {shlex.quote(folder)}")
