"""k3s's upgrade rules, as k3s itself enforces them: no downgrade, no skipped minor.

Pure. Versions look like v1.33.5+k3s1 (optionally -rcN before the +).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The one spelling of a k3s release (the inventory's k3s.version is checked against it too).
# Digits are spelled [0-9]: a backslash-d would also match '٣' and '３'.
VERSION_PATTERN = r"v([0-9]+)\.([0-9]+)\.([0-9]+)(?:-rc([0-9]+))?\+k3s([0-9]+)"
VERSION = re.compile(f"^{VERSION_PATTERN}$")


@dataclass(frozen=True, order=True)
class K3sVersion:
    major: int
    minor: int
    patch: int
    final: int  # 0 for a release candidate, 1 for the release: rc < release
    rc: int
    k3s: int
    text: str = ""

    @property
    def line(self) -> str:
        """The minor release line, as k3s's channels name it: v1.33."""
        return f"v{self.major}.{self.minor}"


def parse(text: str | None) -> K3sVersion | None:
    match = VERSION.match((text or "").strip())
    if not match:
        return None
    major, minor, patch, rc, k3s = match.groups()
    return K3sVersion(int(major), int(minor), int(patch), 0 if rc else 1, int(rc or 0), int(k3s), text.strip())


def upgrade_problem(installed: str, target: str) -> tuple[str, str] | None:
    """(what is wrong, what to do) when k3s would refuse going from `installed` to `target`;
    None when the step is allowed (including no change)."""
    have, want = parse(installed), parse(target)
    if have is None or want is None or have == want:
        return None
    if (want.major, want.minor, want.patch, want.final, want.rc, want.k3s) < (
            have.major, have.minor, have.patch, have.final, have.rc, have.k3s):
        return (f"k3s cannot be downgraded: {installed} is installed, k3s.version asks for {target}",
                f"keep k3s.version at {installed} or newer; to go back, restore a snapshot taken before the "
                "upgrade onto hosts reinstalled with the older release")
    if want.major != have.major or want.minor > have.minor + 1:
        steps = intermediate_lines(have, want)
        return (f"k3s cannot skip minor versions: {installed} is installed, k3s.version asks for {target}",
                "upgrade one minor at a time: set k3s.version to the newest "
                + ", then the newest ".join(f"{line}.x release" for line in steps)
                + f", running `bootstrap up` after each, then {target}")
    return None


def intermediate_lines(have: K3sVersion, want: K3sVersion) -> list[str]:
    """The minor lines to pass through between two versions of the same major."""
    if want.major != have.major:
        return [f"v{want.major}.0"]
    return [f"v{have.major}.{m}" for m in range(have.minor + 1, want.minor)]
