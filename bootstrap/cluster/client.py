"""The Kubernetes API through the SSH tunnel, with the official Python client (no kubectl).

Every wait here has a deadline and, when it passes, says what it was waiting for.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bootstrap.cluster import kubeconfig_file
from bootstrap.remote.tunnel import Tunnel
from bootstrap.errors import BootstrapError
from bootstrap.inventory.model import Inventory
from bootstrap.remote_data import RemoteDataError, loads
from bootstrap.state.folder import StateDir


class ClusterError(BootstrapError):
    pass


class WaitTimeout(ClusterError):
    pass


@dataclass
class Cluster:
    """An API client plus a kubeconfig file (for Helm) that both go through the tunnel."""

    api_client: object
    kubeconfig: Path
    open_connections: int = 1  # kept-alive connections known to be open (warm_connections)
    # Objects read ahead on those connections (warm_connections' `paths`): {path: object or None}
    prefetched: dict | None = None

    @property
    def core(self):
        # imported here: startup time (kubernetes takes ~0.3 s to import: only on reaching the API)
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def custom(self):
        # imported here: startup time (kubernetes takes ~0.3 s to import: only on reaching the API)
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)


@contextlib.contextmanager
def connect(inventory: Inventory, state: StateDir, ssh=None):
    """Open the tunnel to the first reachable server and yield a Cluster. `ssh(name)`: an
    open SSH connection to that node, or None (a hosts' session's; the tunnel reuses it)."""
    # imported here: startup time (kubernetes takes ~0.3 s to import: only on reaching the API)
    from kubernetes import client, config

    saved = state.path / "kubeconfig"
    if not saved.exists():
        kubeconfig_file.fetch_over_ssh(inventory, state)
    errors = []
    for server in inventory.servers:
        try:
            tunnel = Tunnel(inventory, server, state, client=ssh(server.name) if ssh else None)
            port = tunnel.__enter__()
        except BootstrapError as exc:
            errors.append(exc.message)
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="bootstrap-kube-") as tmp:
                local = Path(tmp) / "kubeconfig"
                local.touch(mode=0o600)
                local.write_text(kubeconfig_file.with_server(saved, f"127.0.0.1:{port}"))
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


def reusing_ssh(connect_fn, session):
    """`connect_fn` given the session's SSH connections (bootstrap.remote.interface.Hosts.ssh_client)
    when it can reuse one: a connect function that can declares an `ssh` parameter, as `connect` does."""
    if "ssh" not in inspect.signature(connect_fn).parameters:
        return connect_fn
    return functools.partial(connect_fn, ssh=session.ssh_client)


def wait_for(what: str, check, timeout_s: float, interval_s: float = 2.0, first_interval_s: float | None = None):
    """Poll `check()` until it returns something truthy; time out naming `what`.
    `first_interval_s`: start polling at this interval, doubling up to `interval_s` (for
    what is usually a moment away: each poll is one request)."""
    deadline = time.monotonic() + timeout_s
    last = None
    pause = first_interval_s or interval_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}"
                              + (f" (last seen: {last})" if last else ""))
        last = getattr(check, "last", None)
        time.sleep(pause)
        pause = min(pause * 2, interval_s)


# --- raw REST: one code path for every kind (no discovery, dicts in and out) ------------------

CORE_KINDS = {"Namespace": "namespaces", "ConfigMap": "configmaps", "Secret": "secrets", "Pod": "pods",
              "PersistentVolumeClaim": "persistentvolumeclaims", "Node": "nodes", "Service": "services"}
CLUSTER_SCOPED = {"Namespace", "Node", "StorageClass", "Queue", "ClusterRole", "ClusterRoleBinding"}
PLURALS = {"DaemonSet": "daemonsets", "Deployment": "deployments", "StorageClass": "storageclasses",
           "NetworkAttachmentDefinition": "network-attachment-definitions", "Queue": "queues",
           "Job": "jobs", "PodGroup": "podgroups", "ServiceAccount": "serviceaccounts",
           "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}


def object_path(api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
    plural = CORE_KINDS.get(kind) if api_version == "v1" else PLURALS.get(kind)
    if plural is None:
        raise ClusterError(f"the tool does not know the API path of {api_version} {kind}")
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{namespace or 'default'}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


# urllib3's connection repr before the reason: "<...HTTPSConnection object at 0x...>: " (1.x)
# or "HTTPSConnection(host='127.0.0.1', port=41234): " (2.x).
_URLLIB3_PREFIX = re.compile(r"^(<[^>]* object at 0x[0-9a-f]+>|\w*Connection(Pool)?\(host=[^)]*\)): ")


def connection_trouble(exc: Exception) -> str:
    """What went wrong, in words: urllib3 says "HTTPSConnectionPool(host='127.0.0.1', port=...):
    Max retries exceeded with url: ... (Caused by NewConnectionError('<... object at 0x...>:
    Failed to establish a new connection: [Errno 111] Connection refused'))"; the last part
    is the news (the local port is the tunnel's, not the server's)."""
    reason = getattr(exc, "reason", None) or exc
    text = _URLLIB3_PREFIX.sub("", str(reason))
    return f"the connection through the SSH tunnel failed ({text or type(reason).__name__})"


def request(cluster: Cluster, method: str, path: str, body=None, *, query: list | None = None,
            content_type: str = "application/json", raw: bool = False, max_bytes: int | None = None,
            read_s: float | None = None):
    """(status, parsed body or text). 404 and other API errors come back as statuses. At most
    `max_bytes` of the answer are read (MAX_BODY_BYTES unless given), as it arrives: a JSON
    body over it is a message, a text one (`raw`) is cut with a note; `read_s`: how long the
    whole answer may take to arrive (else each read waits up to 30 s)."""
    # imported here: startup time (kubernetes takes ~0.3 s to import: only on reaching the API)
    from kubernetes.client.exceptions import ApiException

    limit = MAX_BODY_BYTES if max_bytes is None else max_bytes
    try:
        response = cluster.api_client.call_api(
            path, method, query_params=query or [], header_params={"Content-Type": content_type,
                                                                   "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"], _preload_content=False, _request_timeout=30)
        answer, status = response[:2] if isinstance(response, tuple) else (response, response.status)
        data, cut = read_capped(answer, limit, read_s)
    # An error status's body the client reads whole: the API server's own, or a kubelet's
    # error for a log, which the API server reads at most 50000 bytes of (kubernetes
    # staging/src/k8s.io/apiserver/pkg/registry/generic/rest/response_checker.go).
    except ApiException as exc:
        return exc.status, _parse(exc.body)
    except Exception as exc:  # connection trouble through the tunnel
        raise ClusterError(f"API request {method} {path} failed: {connection_trouble(exc)}",
                           "the API is reached through an SSH tunnel to a server: when that connection was cut "
                           "or the server is gone, run the command again (a lost server: `bootstrap rebuild`)") from None
    # What the API serves was written by nodes too (a kubelet's status, a pod's log): bytes
    # that are not UTF-8 are replaced, never fatal.
    text = data.decode("utf-8", "replace")
    if cut:
        return status, text + f"\n[bootstrap cut this answer here: {cut}]" if raw else {
            "message": f"the API's answer was not read whole: {cut}"}
    return status, text if raw else _parse(text)


# An API list of every pod of a large cluster is tens of MiB; objects nest a few dozen deep.
MAX_BODY_BYTES = 256 * 1024 * 1024
MAX_BODY_DEPTH = 128
READ_CHUNK = 64 * 1024


def read_capped(response, max_bytes: int, read_s: float | None = None) -> tuple[bytearray, str]:
    """At most `max_bytes` of a streamed (urllib3) answer, read a chunk at a time as it
    arrives, and why it stopped short ('' when it is whole): more than `max_bytes` came, or
    it was still coming after `read_s` seconds. The rest is never read: the connection that
    holds it is closed (the client's pool opens another)."""
    # read1: what has arrived, up to a chunk (read() waits for the whole chunk: a trickle
    # of a byte each 29 s would never end).
    read = getattr(response, "read1", None) or response.read
    deadline = None if read_s is None else time.monotonic() + read_s
    body = bytearray()
    why = ""
    while not why:
        chunk = read(min(READ_CHUNK, max_bytes + 1 - len(body)))
        if not chunk:
            return body, ""
        body += chunk
        if len(body) > max_bytes:
            why = f"more than {max_bytes} bytes came"
        elif deadline is not None and time.monotonic() > deadline:
            why = f"it was still coming after {read_s:.0f} s"
    del body[max_bytes:]
    response.close()
    response.release_conn()
    return body, why


# A pod's log is what its node's kubelet sends, and the API server passes it on as it comes,
# however long (kubernetes staging/src/k8s.io/apiserver/pkg/registry/generic/rest/streamer.go,
# LocationStreamer). So limitBytes and tailLines are asked for (the checks read a log's end),
# and the cap is kept while reading too: a kubelet that ignores them sent 768 MiB, which
# read whole took the tool from 89 to 1626 MiB (issue 32).
LOG_MAX_BYTES = 1024 * 1024
LOG_TAIL_LINES = 2000
# limitBytes "may return slightly more or slightly less than the specified limit" (kubernetes
# staging/src/k8s.io/api/core/v1/types.go, PodLogOptions): an honest node's answer is not cut.
LOG_SLACK_BYTES = 64 * 1024
LOG_READ_S = 60.0  # a megabyte through the tunnel takes seconds; a node that trickles is cut off


def pod_log(cluster: Cluster, pod_path: str, *, container: str | None = None, max_bytes: int = LOG_MAX_BYTES,
            tail_lines: int = LOG_TAIL_LINES, read_s: float = LOG_READ_S) -> tuple[int, str]:
    """(status, text) of the log of the pod at `pod_path` (object_path of the Pod): its last
    `tail_lines` lines, at most `max_bytes` of them. A node that sends more, or takes
    longer than `read_s` seconds, is cut off there and the text ends with a note saying so."""
    query = ([("container", container)] if container else []) + [
        ("tailLines", str(tail_lines)), ("limitBytes", str(max_bytes))]
    return request(cluster, "GET", pod_path + "/log", query=query, raw=True,
                   max_bytes=max_bytes + LOG_SLACK_BYTES, read_s=read_s)


def _parse(text):
    """An API body as a JSON object; anything else (too deep, too large) is a message."""
    if not text:
        return {}
    try:
        body = loads(text, what="the API's answer", max_chars=MAX_BODY_BYTES, max_depth=MAX_BODY_DEPTH)
    except RemoteDataError as exc:
        return {"message": str(exc) if str(text).lstrip()[:1] in ("[", "{") else str(text)[:300]}
    # Every Kubernetes API body is an object (an item, a list, a Status): callers .get() it.
    return body if isinstance(body, dict) else {"message": "the API's answer is not a JSON object"}


def get(cluster: Cluster, path: str) -> dict | None:
    status, body = request(cluster, "GET", path)
    if status == 404:
        return None
    if status >= 300:
        raise ClusterError(f"GET {path}: {status} {body.get('message', '')}")
    return body


def path_of(obj: dict) -> str:
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


# Each extra connection through the tunnel costs its channel and TLS handshake (~3 round
# trips) before its first request: for a few objects one warm connection is quicker.
SEQUENTIAL_UP_TO = 4


# How many connections a connection made ahead of time opens (beside the work that hides
# their channels and TLS handshakes): the reads that follow go out at once, one round trip.
WARM_CONNECTIONS = 4


def warm_connections(cluster: Cluster, paths: list[str] = ()) -> None:
    """WARM_CONNECTIONS requests at once: the client's pool opens (and keeps) as many
    connections, so the parallel reads after them pay no channel or handshake. The first
    requests read `paths` (cluster.prefetched: what a converged cluster side will compare,
    read while the hosts are probed); /version fills the rest."""
    wanted = list(dict.fromkeys(paths))
    tasks = wanted + ["/version"] * max(0, WARM_CONNECTIONS - len(wanted))
    with ThreadPoolExecutor(max_workers=WARM_CONNECTIONS) as pool:
        answers = list(pool.map(lambda path: request(cluster, "GET", path), tasks))
    cluster.open_connections = min(WARM_CONNECTIONS, sum(1 for status, _ in answers if status < 500)) or 1
    if wanted:  # as get() has them; an answer get() would raise on is read again when needed
        cluster.prefetched = {path: (body if status < 300 else None) for path, (status, body)
                              in zip(wanted, answers) if status < 300 or status == 404}


def get_all(cluster: Cluster, paths: list[str]) -> dict[str, dict | None]:
    """GET every path, many at once: through the tunnel each request costs a round trip,
    and requests one after the other add up; {path: object or None}."""
    unique = list(dict.fromkeys(paths))
    if not unique:
        return {}
    warm = cluster.open_connections > 1  # (warm_connections): parallel costs nothing more
    if len(unique) == 1 or not warm and len(unique) <= SEQUENTIAL_UP_TO:
        return {path: get(cluster, path) for path in unique}
    with ThreadPoolExecutor(max_workers=min(cluster.open_connections if warm else 8, len(unique))) as pool:
        return dict(zip(unique, pool.map(lambda path: get(cluster, path), unique)))


UNREAD = object()


def apply_object(cluster: Cluster, obj: dict, current=UNREAD) -> str:
    """Create, or replace when what we manage differs: 'created' | 'updated' | 'unchanged'.
    `current`: the object as just read (get_all), when the caller has it."""
    meta = obj["metadata"]
    path = path_of(obj)
    if current is UNREAD:
        current = get(cluster, path)
    if current is None:
        status, body = request(cluster, "POST", object_path(obj["apiVersion"], obj["kind"], None,
                                                            meta.get("namespace")), obj)
        if status >= 300:
            raise ClusterError(f"cannot create {obj['kind']} {meta['name']}: {body.get('message', status)}")
        return "created"
    if _same(obj, current):
        return "unchanged"
    merged = dict(obj, metadata={**meta, "resourceVersion": current.get("metadata", {}).get("resourceVersion")})
    status, body = request(cluster, "PUT", path, merged)
    if status >= 300:
        raise ClusterError(f"cannot update {obj['kind']} {meta['name']}: {body.get('message', status)}")
    return "updated"


def _same(wanted: dict, current: dict) -> bool:
    """Only the fields we set count: the server adds status, defaults and bookkeeping."""
    def covered(want, have) -> bool:
        if isinstance(want, dict):
            return isinstance(have, dict) and all(covered(v, have.get(k)) for k, v in want.items())
        return want == have
    return covered({k: v for k, v in wanted.items() if k != "metadata"}, current) and covered(
        {k: wanted["metadata"].get(k) for k in ("labels", "annotations") if k in wanted["metadata"]},
        current.get("metadata", {}))


def merge_patch(cluster: Cluster, path: str, patch: dict) -> None:
    status, body = request(cluster, "PATCH", path, patch, content_type="application/merge-patch+json")
    if status >= 300:
        raise ClusterError(f"PATCH {path}: {status} {body.get('message', '')}")
