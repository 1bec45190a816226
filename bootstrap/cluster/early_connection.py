"""The API connection made while the host side works, for an `up` that changes no host.

A cluster's API is reached through the first server's SSH connection: a channel for the
tunnel, then TLS, then the requests (bootstrap.cluster.client). On an existing cluster the
kubeconfig is in the state folder from the start, so the channel and the TLS handshake
(the round trips before the first request) can be paid while the facts are probed and the
plans made. The cluster side takes this connection only when no host changed: a host
change may restart the first server's k3s under it, and then the cluster side connects
as it always did. Whatever goes wrong here is silent: the cluster side's own connect, with
its own errors and hints, is the fallback.
"""

from __future__ import annotations

import contextlib
import logging

import gevent

logger = logging.getLogger("pyinfra.bootstrap")  # the run log
CLOSE_WAIT_S = 30


class EarlyConnection:
    """`connect(inventory, state)` (a context manager yielding a Cluster, as
    bootstrap.cluster.client.connect), entered in the background at once, with one request
    (`warm(cluster)`) sent over it; `close()` ends it."""

    def __init__(self, connect, inventory, state, warm):
        self._stack = contextlib.ExitStack()
        self._job = gevent.spawn(self._open, connect, inventory, state, warm)

    def _open(self, connect, inventory, state, warm):
        try:
            cluster = self._stack.enter_context(connect(inventory, state))
            warm(cluster)
            return cluster
        except Exception as exc:  # noqa: BLE001 (the cluster side's own connect reports it)
            logger.info("early API connection not made: %s", exc)
            return None

    def connect_or(self, fallback):
        """A connect function for the cluster side: this connection when it was made (it
        stays open until `close`), else `fallback`'s."""

        @contextlib.contextmanager
        def connect(inventory, state):
            cluster = self._job.get()
            if cluster is None:
                with fallback(inventory, state) as fresh:
                    yield fresh
            else:
                yield cluster

        return connect

    def close(self) -> None:
        # Let a connect in progress end (its own time-outs) rather than kill it half-way,
        # where a tunnel it opened would be left behind.
        if not self._job.join(timeout=CLOSE_WAIT_S):
            self._job.kill()
        self._stack.close()
