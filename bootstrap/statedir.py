"""The per-cluster state folder: pinned host keys, secrets, kubeconfig, logs.

Kept outside the repository by default (`$XDG_STATE_HOME/bootstrap/<cluster>`), so a
clone of the inventory repo never carries a join token.
"""

from __future__ import annotations

import os
from pathlib import Path

from bootstrap.inventory.model import Inventory


def state_root() -> Path:
    explicit = os.environ.get("BOOTSTRAP_STATE_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(xdg) / "bootstrap"


class StateDir:
    def __init__(self, inventory: Inventory):
        if inventory.state_dir:
            base = Path(inventory.source).parent if inventory.source else Path.cwd()
            self.path = (base / Path(inventory.state_dir).expanduser()).resolve()
        else:
            self.path = state_root() / inventory.cluster

    def ensure(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.path, 0o700)
        return self.path

    @property
    def known_hosts(self) -> Path:
        return self.path / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.path / "ssh_config"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def write_secret(self, name: str, data: str | bytes) -> Path:
        """Write a file only the owner can read; created 0600 so it is never briefly world-readable."""
        self.ensure()
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = os.open(tmp, flags, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
        return target
