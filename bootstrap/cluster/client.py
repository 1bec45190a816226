"""The Kubernetes API through the SSH tunnel, with the official Python client (no kubectl).

Every wait here has a deadline and, when it passes, says what it was waiting for.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bootstrap.errors import BootstrapError
from bootstrap.inventory.model import Inventory
from bootstrap.statedir import StateDir


class ClusterError(BootstrapError):
    pass


class WaitTimeout(ClusterError):
    pass


@dataclass
class Cluster:
    """An API client plus a kubeconfig file (for Helm) that both go through the tunnel."""

    api_client: object
    kubeconfig: Path

    @property
    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)


@contextlib.contextmanager
def connect(inventory: Inventory, state: StateDir):
    """Open the tunnel to the first reachable server and yield a Cluster."""
    from kubernetes import client, config

    from bootstrap.cluster import kubeconfig as kc
    from bootstrap.cluster.tunnel import Tunnel

    saved = state.path / "kubeconfig"
    if not saved.exists():
        kc.fetch_over_ssh(inventory, state)
    errors = []
    for server in inventory.servers:
        try:
            tunnel = Tunnel(inventory, server, state)
            port = tunnel.__enter__()
        except BootstrapError as exc:
            errors.append(exc.message)
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="bootstrap-kube-") as tmp:
                local = Path(tmp) / "kubeconfig"
                local.touch(mode=0o600)
                local.write_text(kc.with_server(saved, f"127.0.0.1:{port}"))
                configuration = client.Configuration()
                config.load_kube_config(config_file=str(local), client_configuration=configuration)
                api_client = client.ApiClient(configuration)
                try:
                    yield Cluster(api_client, local)
                finally:
                    api_client.close()
            return
        finally:
            tunnel.__exit__(None, None, None)
    raise ClusterError("no server answers over SSH: " + "; ".join(errors))


def wait_for(what: str, check, timeout_s: float, interval_s: float = 2.0):
    """Poll `check()` until it returns something truthy; time out naming `what`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}"
                              + (f" (last seen: {last})" if last else ""))
        last = getattr(check, "last", None)
        time.sleep(interval_s)
