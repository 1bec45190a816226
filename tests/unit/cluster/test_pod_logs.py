"""A pod's log is what its node's kubelet sends, passed on by the API server as it comes: every
reader of a log asks for its end (tailLines, limitBytes) and keeps a byte cap while it reads,
since a hostile kubelet ignores both (issue 32, item 16: a 768 MiB log read whole took the
tool from 89 to 1626 MiB). Against an API on 127.0.0.1 whose logs never end (the real
client, urllib3 and sockets; only the far end is the test's)."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as kube  # noqa: E402

from bootstrap.cluster import burn_in, checks  # noqa: E402
from bootstrap.cluster.client import LOG_MAX_BYTES, LOG_SLACK_BYTES, Cluster, pod_log, request  # noqa: E402
from bootstrap.flows import diagnose  # noqa: E402

LOG_BYTES = 128 * 1024 * 1024  # what the hostile kubelet sends for every log (it would send more)
LINE = b"x" * 1023 + b"\n"


class HostileApi(BaseHTTPRequestHandler):
    """Pods that have Succeeded; each log an endless stream of lines (`LOG_BYTES`, whatever
    limitBytes or tailLines asked), or a trickle of a byte each 0.2 s under `trickle`, or no
    answer at all (the connection closed) under `hangup`."""

    protocol_version = "HTTP/1.1"
    asked: list = []

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path.endswith("/log"):
            type(self).asked.append(dict(parse_qsl(url.query)))
            if "hangup" in url.path:
                self.close_connection = True
                return
            return self._stream(trickle="trickle" in url.path)
        body = json.dumps({"kind": "Pod", "metadata": {"name": url.path.rsplit("/", 1)[-1]},
                           "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Succeeded"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.send_response(409)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def _stream(self, trickle: bool):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(LOG_BYTES))
        self.end_headers()
        block = LINE * 64
        try:
            for sent in range(0, LOG_BYTES, len(block)):
                if trickle:
                    self.wfile.write(b"y")
                    self.wfile.flush()
                    time.sleep(0.2)
                else:
                    self.wfile.write(block)
        except OSError:
            return  # the reader hung up: what it should do

    def log_message(self, *args):
        pass


@pytest.fixture
def api(tmp_path):
    HostileApi.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostileApi)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = kube.Configuration(host=f"http://127.0.0.1:{server.server_port}")
    api_client = kube.ApiClient(configuration)
    yield Cluster(api_client, Path(tmp_path / "kubeconfig"))
    api_client.close()
    server.shutdown()
    server.server_close()


def gpu_pod_log(cluster):
    return checks._pod_outcome(cluster, "gpu-pod", 5)[1]


def burn_in_log(cluster):
    return burn_in._container_logs(cluster, "gpu-1", 1, "bootstrap-validate-0a1b2c3d")[0][0]


def diagnose_log(cluster):
    pod = {"metadata": {"namespace": "gpu-operator", "name": "plugin-x"}, "spec": {"containers": [{"name": "c"}]}}
    return diagnose.describe_pod(cluster, pod, [])


READERS = {"validate's pods": gpu_pod_log, "burn-in": burn_in_log, "diagnose": diagnose_log}


@pytest.mark.parametrize("reader", READERS.values(), ids=READERS.keys())
def test_every_log_reader_asks_for_the_end_and_stops_at_its_cap_whatever_the_node_sends(api, reader):
    tracemalloc.start()
    try:
        started = time.monotonic()
        log = reader(api)
        seconds = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert HostileApi.asked and all(q.get("tailLines") and q.get("limitBytes") for q in HostileApi.asked)
    assert int(HostileApi.asked[0]["limitBytes"]) <= LOG_MAX_BYTES
    # Before: the whole 128 MiB was read and decoded (a peak over 256 MiB here).
    assert peak < 16 * 1024 * 1024, f"peak {peak >> 20} MiB while reading a log"
    assert len(log) <= LOG_MAX_BYTES + LOG_SLACK_BYTES + 8192
    assert "bootstrap cut this answer here: more than" in log
    assert seconds < 30


def test_a_log_that_trickles_is_cut_at_its_deadline(api):
    started = time.monotonic()
    status, log = pod_log(api, "/api/v1/namespaces/x/pods/trickle", read_s=1.0)
    assert time.monotonic() - started < 5
    assert status == 200 and log.startswith("yyy") and log.endswith("[bootstrap cut this answer here: "
                                                                    "it was still coming after 1 s]")


def test_a_nodes_burn_in_logs_are_read_within_one_deadline_and_the_rest_fail_with_the_reason(api, monkeypatch):
    """A node may advertise MAX_SLOTS GPU slots and trickle each slot's log: read one after
    another, each up to its own LOG_READ_S, that held the burn-in some 96 minutes for one node."""
    monkeypatch.setattr(burn_in, "NODE_LOGS_S", 2.0)
    started = time.monotonic()
    logs, unread = burn_in._container_logs(api, "trickle", burn_in.MAX_SLOTS, "bootstrap-validate-0a1b2c3d")
    assert time.monotonic() - started < 6  # before: 60 s for each of the 64 slots
    assert list(logs) == [0] and logs[0].startswith("yyy")  # the read under way is cut at the deadline
    assert unread == ("GPU slot 1-63 not read: a node's burn-in logs are read within 2 s, and this node's took "
                      "all of it")
    # A kubelet that gives no answer fails its own slots' reads, with the reason, and raises nothing
    logs, unread = burn_in._container_logs(api, "hangup", 2, "bootstrap-validate-0a1b2c3d")
    assert logs == {} and unread.startswith("GPU slot 0-1 not read: API request GET ") and "failed" in unread


def test_the_connection_a_cut_answer_held_is_not_reused(api):
    """The rest of a cut answer is still on its connection: the next request gets a new one
    (a reused one would read the old log's bytes as its answer)."""
    pod_log(api, "/api/v1/namespaces/x/pods/p", max_bytes=4096)
    status, pod = request(api, "GET", "/api/v1/namespaces/x/pods/p")
    assert status == 200 and pod["status"]["phase"] == "Succeeded"


def test_a_json_answer_over_its_cap_is_a_message_not_a_partial_object(api):
    status, body = request(api, "GET", "/api/v1/namespaces/x/pods/p/log", max_bytes=1024)
    assert status == 200 and body == {"message": "the API's answer was not read whole: more than 1024 bytes came"}


def test_diagnose_reads_the_logs_of_a_pods_first_containers_only_and_within_its_time(api, monkeypatch):
    """A node's kubelet writes the spec of each mirror pod it runs: one of 5000 containers, each
    log served at its cap, was read container by container (gigabytes for 50 such pods, hours
    with the cluster's lock held)."""
    pod = {"metadata": {"namespace": "kube-system", "name": "static-x"},
           "spec": {"containers": [{"name": f"c{i}"} for i in range(5000)]}}
    text = diagnose.describe_pod(api, pod, [])
    assert len(HostileApi.asked) == diagnose.d.MAX_CONTAINERS_LOGGED
    assert f"{5000 - diagnose.d.MAX_CONTAINERS_LOGGED} more containers: their logs not read" in text
    HostileApi.asked = []
    monkeypatch.setattr(diagnose.d, "LOGS_S", 0)
    text = diagnose.describe_pod(api, pod, [], logs_until=time.monotonic())
    assert not HostileApi.asked and "(not read: diagnose's 0 s for pod logs were spent)" in text


def test_a_kubelet_that_hangs_up_on_a_log_fails_its_own_pod_not_the_batch(api):
    """validate's and the gate's pods: the log of a pod that ended is read through its node's
    kubelet; one that closes the connection had raised ClusterError out of the checks, and the
    gate then failed every node of the batch ("its checks could not run")."""
    phase, log, why = checks._pod_outcome(api, "hangup", 5)
    assert phase == "Succeeded" and log == ""
    assert why.startswith("its log could not be read: API request GET ") and "failed" in why


def test_a_diagnose_log_read_begun_just_before_its_budget_ends_with_it(api):
    """The budget was checked only before each read: a trickling kubelet's log begun a moment
    before its end held the cluster's lock a whole read (60 s) past it."""
    pod = {"metadata": {"namespace": "kube-system", "name": "trickle"}, "spec": {"containers": [{"name": "c"}]}}
    started = time.monotonic()
    text = diagnose.describe_pod(api, pod, [], logs_until=started + 1.5)
    assert time.monotonic() - started < 10  # before: 60 s, the read's own deadline
    assert "it was still coming after" in text
