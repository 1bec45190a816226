"""What `down` runs on a host: undo k3s and everything the tool recorded in its host manifest.

Pure: the script is built from the manifest the probe read back, so only what the tool
did is undone (packages it installed, packages it held, sysctls it changed, swap it turned
off). Each host part (bootstrap.host.parts) gives its own lines, in this order: stop k3s,
remove the files, put the kernel settings back, remove packages, then the manifest.
"""

from __future__ import annotations

import shlex

from bootstrap.host.parts import k3s_binary, k3s_service, kernel, manifest, packages, placing

# Removed whatever the manifest lists: an `up` that failed early may not have recorded them.
# The previous binary an upgrade kept lives in the manifest's folder, which stays when drivers
# are kept: named here so it goes either way.
ALWAYS_REMOVED = (k3s_binary.PATH, k3s_binary.PREVIOUS, *k3s_service.UNIT_PATHS)


def teardown_script(recorded: dict, *, purge_drivers: bool, toolkit_source: str | None = None) -> str:
    """`recorded`: the host's manifest as read back; one the tool would not have written
    raises RemoteDataError (that host's failure: the caller goes on with the others)."""
    recorded = manifest.read(recorded)
    lines = k3s_service.teardown_stop()
    files = [f for f in recorded.get("files", []) if f != manifest.MANIFEST] + list(ALWAYS_REMOVED)
    lines.append("rm -f " + " ".join(shlex.quote(f) for f in sorted(set(files))))
    lines.append(placing.leftovers([*files, manifest.MANIFEST]))  # what an interrupted `up` left next to them
    lines += k3s_service.teardown_after_files()
    lines += kernel.teardown(recorded)
    package_lines, kept = packages.teardown(recorded, purge_drivers, toolkit_source)
    lines += package_lines + manifest.teardown(kept)
    return "\n".join(lines) + "\nexit 0\n"
