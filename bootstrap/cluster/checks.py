"""`bootstrap validate`: prove the cluster does GPU work. Each check ends PASS, FAIL or SKIP
with a reason; everything it creates lives in a namespace of its own (checks_namespace),
deleted at the end. A pod a node's kubelet never lets go of is that node's (a WARN row here,
a failure at the gate), and leaves only its own namespace Terminating: the next run has
another name, so it never waits on it (issue 32 item 13)."""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from bootstrap.cluster.client import Cluster, ClusterError, WaitTimeout, get, object_path, pod_log, request, wait_for
from bootstrap.cluster import nccl_ssh
from bootstrap.cluster.components import gpu_sharing, trust
from bootstrap.console_text import printable
from bootstrap.cluster.components.rdma import resource_key
from bootstrap.host.facts.host_facts import HostFacts
from bootstrap.host.images import BUSYBOX, NCCL_IMAGE
from bootstrap.host.images import GPU_TEST_IMAGE as DEFAULT_IMAGE
from bootstrap.inventory.kube import derived_name
from bootstrap.inventory.model import Inventory, Node
from bootstrap.checks import mig, nccl_ports
from bootstrap.checks.node_addresses import DEFAULT_CIDRS, choose, on_host
from bootstrap.checks.providers import PROVIDER_LABEL, provider_groups

NAMESPACE = "bootstrap-validate"  # before issue 32 the one namespace; now each use's name starts so
PART_OF = {"app.kubernetes.io/part-of": "bootstrap-validate"}  # on every checks namespace and pod
CLEANUP_S = 120  # for a namespace's pods to be gone (their kubelets confirm each deletion)
TOLERATE_ALL = [{"operator": "Exists"}]


@dataclass
class CheckResult:
    check: str
    status: str  # PASS | FAIL | SKIP
    reason: str
    node: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def expected_gpu_resources(inventory: Inventory, node, facts: HostFacts) -> dict[str, int]:
    """What the device plugin should advertise on this node, from the sharing setup and
    the GPUs the host really has."""
    gpus = len(facts.gpus) or 1
    sharing = inventory.sharing_for(node)
    if sharing.mig:
        per_gpu = mig.check_layout(sharing.mig, facts.mig_profiles) if facts.mig_profiles else Counter()
        if gpu_sharing.mig_strategy(inventory) == "mixed":
            return {f"nvidia.com/mig-{name}": count * gpus for name, count in per_gpu.items()}
        return {"nvidia.com/gpu": sum(per_gpu.values()) * gpus}
    if sharing.time_slicing:
        name = "nvidia.com/gpu.shared" if sharing.time_slicing.rename_by_default else "nvidia.com/gpu"
        return {name: gpus * sharing.time_slicing.replicas}
    if sharing.mps:
        return {"nvidia.com/gpu": gpus * sharing.mps.replicas}
    return {"nvidia.com/gpu": gpus}


def gpu_request(inventory: Inventory, node, facts: HostFacts) -> str:
    """The one GPU resource a check's pod asks for on this node. Under MIG mixed with the
    node's MIG profiles unread, nothing names a MIG resource: the whole GPU's name, so the
    pod's check fails for that node (never ran) rather than the run on an empty list."""
    return min(expected_gpu_resources(inventory, node, facts), default="nvidia.com/gpu")


def _pod(name: str, node: str | None, image: str, resources: dict | None = None,
         command: list[str] | None = None, volumes=None, mounts=None) -> dict:
    container: dict = {"name": "main", "image": image}
    if command:
        container["command"] = command
    if resources:
        container["resources"] = {"limits": {k: str(v) for k, v in resources.items()}}
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict = {"restartPolicy": "Never", "tolerations": TOLERATE_ALL, "containers": [container]}
    if node:
        spec["affinity"] = on_nodes([node])
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE,
                                                           "labels": {"app.kubernetes.io/part-of": "bootstrap-validate"}},
            "spec": spec}


def on_nodes(names: list[str]) -> dict:
    """The affinity that keeps a pod to these Nodes, by the Node's name (matchFields
    metadata.name), never by a label: a kubelet may write its own Node's labels, its
    kubernetes.io/hostname and bootstrap.k3s/provider among them (NodeRestriction forbids only
    node-restriction.kubernetes.io/ and unknown kubernetes.io labels: kubernetes
    plugin/pkg/admission/noderestriction/admission.go, getForbiddenLabels). A node that claimed
    another's hostname drew that node's check pod and answered for it."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}]}}}


def _create(cluster: Cluster, obj: dict, namespace: str | None = None) -> None:
    """`obj` created, in `namespace` when given (else its own)."""
    if namespace:
        obj = dict(obj, metadata=dict(obj["metadata"], namespace=namespace))
    meta = obj["metadata"]
    status, body = request(cluster, "POST", object_path(obj["apiVersion"], obj["kind"], None, meta.get("namespace")),
                           obj)
    if status >= 300:
        raise ClusterError(f"cannot create {obj['kind']} {meta['name']}: {body.get('message', status)}")


# The kubelet's waiting reasons for an image it cannot get (kubernetes pkg/kubelet/images/types.go,
# v1.33). It retries the first two with a back-off (a registry's rate limit passes), never the others.
PULL_RETRIED = ("ErrImagePull", "ImagePullBackOff")
PULL_NEVER = ("ErrImageNeverPull", "InvalidImageName")
# Waiting reasons that say only that the kubelet is at work (pulling the image, among others).
STARTING = ("ContainerCreating", "PodInitializing")
MAX_WHY = 300  # a node's kubelet writes these messages: a line, not a page


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _waiting(status: dict) -> tuple[str, str]:
    """The first container's waiting (reason, message), init containers first; ('', '')."""
    for container in _dicts(status.get("initContainerStatuses")) + _dicts(status.get("containerStatuses")):
        state = container.get("state")
        waiting = state.get("waiting") if isinstance(state, dict) else None
        reason = waiting.get("reason") if isinstance(waiting, dict) else None
        if isinstance(reason, str) and reason:
            message = waiting.get("message")
            return reason, message if isinstance(message, str) else ""
    return "", ""


def _pod_outcome(cluster: Cluster, name: str, timeout_s: float,
                 namespace: str = NAMESPACE, until: float | None = None) -> tuple[str, str, str]:
    """(phase, log, why) once the pod ends, or ('Pending'/'Running', '', why) at the time-out,
    or at once when the kubelet will never get its image. A container the kubelet cannot start
    says why (ImagePullBackOff and its message) before the pod's conditions do. `until`: the
    time-out's end (time.monotonic()) when it began before this call (pods started together)."""
    path = object_path("v1", "Pod", name, namespace)
    deadline = time.monotonic() + timeout_s if until is None else until
    container_why = condition_why = ""
    while True:
        pod = get(cluster, path) or {}
        status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
        phase = status.get("phase") if isinstance(status.get("phase"), str) else "Pending"
        if phase in ("Succeeded", "Failed"):
            try:
                code, log = pod_log(cluster, path)  # its end, capped (a node may send more than asked)
            except ClusterError as exc:  # its kubelet hung up on the log: this pod's outcome, not the batch's
                return phase, "", f"its log could not be read: {exc.message}"[:MAX_WHY]
            return phase, log if code < 300 and isinstance(log, str) else "", str(status.get("message", ""))
        reason, message = _waiting(status)
        if reason and reason not in STARTING:  # kept while the kubelet retries (ContainerCreating again)
            container_why = f"{reason}: {message}" if message else reason
            if reason in PULL_RETRIED:
                container_why += " (the kubelet retries with a back-off)"
            if reason in PULL_NEVER:
                return phase, "", container_why[:MAX_WHY]
        for condition in _dicts(status.get("conditions")):
            if condition.get("status") == "False" and condition.get("message"):
                condition_why = f"{condition.get('reason', '')}: {condition['message']}"
        if time.monotonic() > deadline:
            starting = f"still {reason} after {timeout_s:.0f}s (a large image may still be downloading)" \
                if reason in STARTING else ""
            why = container_why or starting or condition_why or f"still {phase} after {timeout_s:.0f}s"
            return phase, "", why[:MAX_WHY]
        time.sleep(1)


def check_gpu_pods(cluster, inventory, gpu_nodes, facts, timeout_s, namespace=NAMESPACE) -> list[CheckResult]:
    if not inventory.validate.gpu_pod:
        return [CheckResult("gpu-pod", "SKIP", "validate.gpu_pod is false")]
    if not gpu_nodes:
        return [CheckResult("gpu-pod", "SKIP", "no GPU nodes")]
    image = inventory.validate.image or DEFAULT_IMAGE
    started = {}
    for node in gpu_nodes:
        resource = gpu_request(inventory, node, facts[node.name])
        name = derived_name("gpu-test-", node.name)  # a long node name is cut safely, with a hash
        _create(cluster, _pod(name, node.name, image, {resource: 1}), namespace)
        started[node.name] = name
    results = []
    # One deadline for all: the pods started together, so each node that never runs its pod
    # no longer adds a whole time-out of its own to everyone's wait.
    until = time.monotonic() + timeout_s
    for node in gpu_nodes:
        phase, log, why = _pod_outcome(cluster, started[node.name], timeout_s, namespace, until=until)
        if phase == "Succeeded" and "Test PASSED" in log:
            results.append(CheckResult("gpu-pod", "PASS", "CUDA vectorAdd: Test PASSED", node.name))
        elif phase == "Succeeded":
            results.append(CheckResult("gpu-pod", "FAIL", f"pod ended without 'Test PASSED': {_last(log)}", node.name))
        elif phase == "Failed":
            results.append(CheckResult("gpu-pod", "FAIL", f"pod failed: {_last(log) or why}", node.name))
        else:
            results.append(CheckResult("gpu-pod", "FAIL", f"pod never ran: {why}", node.name))
    return results


def _last(log: str) -> str:
    lines = [line for line in (log or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def check_capacity(cluster, inventory, gpu_nodes, facts) -> list[CheckResult]:
    if not gpu_nodes:
        return [CheckResult("gpu-capacity", "SKIP", "no GPU nodes")]
    results = []
    for node in gpu_nodes:
        wanted = expected_gpu_resources(inventory, node, facts[node.name])
        allocatable = (get(cluster, f"/api/v1/nodes/{node.name}") or {}).get("status", {}).get("allocatable", {})
        wrong = {k: (v, allocatable.get(k, "0")) for k, v in wanted.items() if str(allocatable.get(k, "0")) != str(v)}
        if wrong:
            text = ", ".join(f"{k}={have} (expected {want})" for k, (want, have) in wrong.items())
            results.append(CheckResult("gpu-capacity", "FAIL", text, node.name))
        else:
            results.append(CheckResult("gpu-capacity", "PASS", ", ".join(f"{k}={v}" for k, v in wanted.items()),
                                       node.name))
    return results


def check_rdma(cluster, inventory, gpu_nodes) -> list[CheckResult]:
    if not inventory.network.rdma:
        return [CheckResult("rdma", "SKIP", "no network.rdma in the inventory")]
    key = resource_key(inventory)
    results = []
    for node in gpu_nodes:
        allocatable = (get(cluster, f"/api/v1/nodes/{node.name}") or {}).get("status", {}).get("allocatable", {})
        # Written by the node's kubelet: a count, or any quantity ("1k"); not a count is none.
        value = str(allocatable.get(key, "0"))
        count = int(value) if re.fullmatch(r"[0-9]{1,9}", value) else 0
        results.append(CheckResult("rdma", "PASS" if count > 0 else "FAIL",
                                   f"{key}={count}" if count else f"{key} is not allocatable", node.name))
    return results


def pvc_writer(inventory: Inventory) -> dict:
    """The pod that writes to the claim; on a trusted node where Longhorn is kept to them
    (components.trust): an untrusted node attaches no Longhorn volume."""
    writer = _pod("pvc-writer", None, BUSYBOX, command=["sh", "-c", "echo bootstrap-ok > /data/probe && cat /data/probe"],
                  volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "validate-pvc"}}],
                  mounts=[{"name": "data", "mountPath": "/data"}])
    trusted = trust.trusted_selector(inventory)
    if trusted and inventory.storage.default == "longhorn":
        writer["spec"]["nodeSelector"] = trusted
    return writer


def check_pvc(cluster, inventory, timeout_s, namespace=NAMESPACE) -> CheckResult:
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "validate-pvc", "namespace": NAMESPACE},
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    _create(cluster, claim, namespace)
    _create(cluster, pvc_writer(inventory), namespace)
    phase, log, why = _pod_outcome(cluster, "pvc-writer", timeout_s, namespace)
    pvc = get(cluster, object_path("v1", "PersistentVolumeClaim", "validate-pvc", namespace)) or {}
    bound = pvc.get("status", {}).get("phase") == "Bound"
    if bound and phase == "Succeeded" and "bootstrap-ok" in log:
        cls = pvc.get("spec", {}).get("storageClassName", "the default class")
        return CheckResult("pvc", "PASS", f"bound on {cls}; a pod wrote and read it")
    if not bound:
        return CheckResult("pvc", "FAIL", f"claim not Bound ({pvc.get('status', {}).get('phase', 'missing')}); "
                                          "is there a default StorageClass?")
    return CheckResult("pvc", "FAIL", f"writer pod {phase}: {_last(log) or why}")


def gang_job(inventory: Inventory, gpu_nodes, facts) -> dict:
    """One member pinned to each GPU node, each wanting a GPU; minAvailable = all of them,
    so the job runs only if every GPU node can take a member at once."""
    tasks = []
    for index, node in enumerate(gpu_nodes):
        resource = gpu_request(inventory, node, facts[node.name])
        template = _pod("x", node.name, BUSYBOX, {resource: 1}, command=["sh", "-c", "echo member-ok"])
        tasks.append({"name": f"member-{index}", "replicas": 1, "template": {"spec": template["spec"]}})
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "gang", "namespace": NAMESPACE},
            "spec": {"minAvailable": len(gpu_nodes), "schedulerName": "volcano",
                     "queue": inventory.volcano.queues[0].name if inventory.volcano.queues else "default",
                     "tasks": tasks}}


def check_gang(cluster, inventory, gpu_nodes, facts, timeout_s, namespace=NAMESPACE) -> CheckResult:
    if not inventory.volcano.enabled:
        return CheckResult("volcano-gang", "SKIP", "volcano is disabled")
    if not gpu_nodes:
        return CheckResult("volcano-gang", "SKIP", "no GPU nodes")
    size = len(gpu_nodes)
    _create(cluster, gang_job(inventory, gpu_nodes, facts), namespace)
    path = object_path("batch.volcano.sh/v1alpha1", "Job", "gang", namespace)
    deadline = time.monotonic() + timeout_s
    while True:
        state = (get(cluster, path) or {}).get("status", {}).get("state", {})
        phase = state.get("phase", "Pending")
        if phase == "Completed":
            return CheckResult("volcano-gang", "PASS", f"all {size} members ran (minAvailable={size})")
        if phase in ("Failed", "Aborted", "Terminated"):
            return CheckResult("volcano-gang", "FAIL", f"job {phase}: {state.get('message', '')}")
        if time.monotonic() > deadline:
            pods = (get(cluster, f"/api/v1/namespaces/{namespace}/pods") or {}).get("items", [])
            # Volcano creates every member pod at once; only bound ones have started.
            running = [p for p in pods if p["metadata"]["name"].startswith("gang-")
                       and (p.get("spec", {}).get("nodeName")
                            or p.get("status", {}).get("phase") in ("Running", "Succeeded"))]
            partial = f"; {len(running)} of {size} members started: gang scheduling broken" if running else ""
            return CheckResult("volcano-gang", "FAIL",
                               f"job still {phase} after {timeout_s:.0f}s ({state.get('message', 'not schedulable')})"
                               + partial)
        time.sleep(1)


# A pod's log is what its node serves: the number is matched strictly so float() cannot fail.
NCCL_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)")


def parse_busbw(log: str) -> float | None:
    match = NCCL_BUSBW.search(log or "")
    return float(match.group(1)) if match else None




def nccl_group(gpu_nodes) -> tuple[list, str]:
    """The GPU nodes NCCL measures, and how they were chosen. A bandwidth floor means the
    fabric inside one provider (RDMA and NVLink do not cross the internet): with GPU nodes
    at several providers, the largest provider's."""
    groups = provider_groups(gpu_nodes)
    if len(groups) < 2:
        return list(gpu_nodes), ""
    provider, nodes = max(groups.items(), key=lambda item: len(item[1]))
    return nodes, (f" within provider {provider} ({', '.join(n.name for n in nodes)}); NCCL across providers is "
                   "not measured (RDMA does not cross the internet)")


# NCCL picks its socket interface itself: on a host with docker0, cni0 or several NICs it can
# measure the wrong path (NVIDIA/nccl#1580, #1581). The workers run in the host's network and
# are told each node's node-ip interface (NCCL_SOCKET_IFNAME) and, with RDMA, the HCAs behind
# the inventory's RDMA interfaces (NCCL_IB_HCA). NCCL's list syntax (its env.html): names
# separated by ',', a leading '=' makes every name an exact match, "name:port" for an HCA.
# On the host network, the workers' sshd cannot take port 22 (the host's own sshd has it); it
# and Open MPI's ports are pinned to the block bootstrap.checks.nccl_ports names, which the
# reachability check probes between the GPU nodes before any host changes.
NCCL_SSH_PORT = nccl_ports.SSH_PORT
# The kernel's dev_valid_name (net/core/dev.c): 1-15 bytes (IFNAMSIZ 16 with the NUL), not "."
# or "..", no '/', ':' or white space. Kernel IB device names: at most 63 characters
# (IB_DEVICE_NAME_MAX 64); mlx5_0, irdma0, bnxt_re0, efa_0, rxe0.
_HCA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def interface_name_error(name: object) -> str | None:
    """Why `name` (read from a host) is not a network interface name to put in a pod spec."""
    if not isinstance(name, str) or not name:
        return "no interface name"
    if len(name.encode()) > 15:
        return "longer than 15 bytes, the kernel's limit"
    if name in (".", ".."):
        return f"{name!r} is not a name the kernel allows"
    if any(ch in "/:" or ch.isspace() for ch in name):
        return "has '/', ':' or white space, which the kernel refuses"
    if not name.isascii() or not name.isprintable():
        return "has characters other than printable ASCII"
    if "," in name or name[0] in "^=":
        return "has ',' or starts with '^' or '=', which NCCL's list syntax reads as operators"
    return None


@dataclass
class NcclPath:
    """Each node's node-ip interface and, with RDMA, its HCAs ("mlx5_0:1"), as NCCL takes them."""

    interfaces: dict[str, str] = field(default_factory=dict)
    hcas: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # a host's answer that cannot be used: FAIL
    unknown: list[str] = field(default_factory=list)  # nodes whose addresses `ip` could not tell

    def socket_ifname(self) -> str | None:
        """None unless every node's interface is known: a node whose interface the list
        lacks would find none for NCCL, and the whole run would fail."""
        names = sorted(set(self.interfaces.values()))
        return "=" + ",".join(names) if names and not self.unknown else None

    def ib_hca(self) -> str | None:
        names = list(dict.fromkeys(h for per_node in self.hcas.values() for h in per_node))
        return "=" + ",".join(names) if names else None

    def env(self) -> dict[str, str]:
        values = {"NCCL_SOCKET_IFNAME": self.socket_ifname(), "NCCL_IB_HCA": self.ib_hca()}
        return {k: v for k, v in values.items() if v}

    def describe(self) -> str:
        """The chosen values, printed with the result (each printable: checked names only)."""
        parts = []
        if self.unknown:
            parts.append(f"NCCL_SOCKET_IFNAME not set: the addresses of {', '.join(self.unknown)} are unknown")
        elif self.interfaces:
            per_node = ", ".join(f"{n}: {i}" for n, i in self.interfaces.items())
            parts.append(f"NCCL_SOCKET_IFNAME={self.socket_ifname()} ({per_node})")
        if self.hcas:
            per_node = ", ".join(f"{n}: {' '.join(h)}" for n, h in self.hcas.items())
            parts.append(f"NCCL_IB_HCA={self.ib_hca()} ({per_node})")
        return "; ".join(parts)


def _node_hcas(inventory: Inventory, node, host: HostFacts) -> list[str]:
    rdma = inventory.network.rdma
    wanted = set(node.rdma_interfaces if node.rdma_interfaces is not None else rdma.interfaces)
    return [f"{device.name}:{device.port}" for device in host.rdma
            if device.active and _HCA_NAME.fullmatch(device.name) and (not wanted or wanted & set(device.netdevs))]


def nccl_paths(inventory: Inventory, gpu_nodes, facts: dict[str, HostFacts]) -> NcclPath:
    """The interface that holds each node's node-ip (rules.node_addresses, as `up` chose it)
    and, with network.rdma, the active HCAs behind the node's RDMA interfaces."""
    path = NcclPath()
    for node in gpu_nodes:
        host = facts[node.name]
        internal = choose(inventory, node, facts).internal
        held = on_host(host, internal) if internal else None
        if host.addresses is None:
            path.unknown.append(node.name)
        elif held is None:
            path.problems.append(f"{node.name}: no interface of the host holds its node-ip {internal or '(unknown)'}")
        elif why := interface_name_error(held.interface):
            path.problems.append(f"{node.name}: its node-ip interface {held.interface!r}: {why}")
        else:
            path.interfaces[node.name] = held.interface
        if inventory.network.rdma:
            hcas = _node_hcas(inventory, node, host)
            if hcas:
                path.hcas[node.name] = hcas
            else:
                path.problems.append(f"{node.name}: no active RDMA device behind its RDMA interfaces")
    return path


def nccl_job(inventory: Inventory, gpu_nodes, facts, path: NcclPath | None = None) -> dict:
    """all_reduce_perf across the GPU nodes with Volcano's MPI plugin: one launcher, one
    worker per node (the svc/ssh plugins give the hostfile and keys). With the nodes'
    interfaces known (`path`), the workers use the host's network and NCCL is told the path."""
    nccl = inventory.validate.nccl
    path = path if path is not None else nccl_paths(inventory, gpu_nodes, facts)
    host_network = path.socket_ifname() is not None
    per_node = nccl.gpus_per_node or min(len(facts[n.name].gpus) or 1 for n in gpu_nodes)
    workers, ranks = len(gpu_nodes), len(gpu_nodes) * per_node
    image = nccl.image or NCCL_IMAGE
    exports = " ".join(f"-x {shlex.quote(f'{name}={value}')}" for name, value in path.env().items())
    mca = "".join(f"--mca {k} {shlex.quote(v)} " for k, v in open_mpi_settings(inventory, path).items())
    # mpirun itself starts every worker's orted: with the private key in the launcher only
    # (nccl_ssh), an orted cannot start others (Open MPI's tree spawn, its default).
    mca = "--mca plm_rsh_no_tree_spawn 1 " + mca
    launcher = ("mpirun --allow-run-as-root --hostfile /etc/volcano/worker.host "
                f"-np {ranks} -npernode {per_node} {mca}-x NCCL_DEBUG=WARN {exports + ' ' if exports else ''}"
                "all_reduce_perf -b 512M -e 8G -f 2 -g 1")
    resources = {"nvidia.com/gpu": per_node}
    if inventory.network.rdma and path.hcas:
        resources[resource_key(inventory)] = 1  # the RDMA shared device plugin's /dev/infiniband
    worker_pod = _pod("w", None, image, resources,
                      command=["/bin/sh", "-c", f"mkdir -p /var/run/sshd && {_worker_sshd(host_network)}"])["spec"]
    if host_network:
        worker_pod["hostNetwork"] = True
        worker_pod["dnsPolicy"] = "ClusterFirstWithHostNet"  # cluster names still resolve
        worker_pod["containers"][0]["env"] = [
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    if inventory.network.rdma and path.hcas:
        # RDMA registers (pins) memory: RLIMIT_MEMLOCK is raised only with IPC_LOCK.
        worker_pod["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    # The measured nodes only, by name (on_nodes): a node labelled with their provider, which
    # any kubelet may write on its own Node, would otherwise draw a worker in a pair test it is
    # not in, and fail the pair for the node being judged.
    worker_pod["affinity"] = {**on_nodes([n.name for n in gpu_nodes]), "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"volcano.sh/task-spec": "worker"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    providers = {n.provider for n in gpu_nodes}
    if len(providers) == 1 and None not in providers:  # the chosen provider's nodes, not another's
        worker_pod["nodeSelector"] = {PROVIDER_LABEL: next(iter(providers))}
    launcher_pod = _pod("l", None, image, command=["/bin/sh", "-c", launcher])["spec"]
    nccl_ssh.mount(launcher_pod, nccl_ssh.LAUNCHER_SECRET, nccl_ssh.LAUNCHER_FILES)
    nccl_ssh.mount(worker_pod, nccl_ssh.WORKER_SECRET, nccl_ssh.WORKER_FILES)
    if host_network:
        # Beside the workers: its ssh to their sshd leaves from one of the measured nodes
        # (pod traffic to a node's address is masqueraded to its node's own), never from
        # another provider's or a CPU node, whose path the reachability check did not probe.
        # By the Node's name (on_nodes): any node could have claimed a measured node's
        # hostname and drawn the launcher, and with it the private key that logs in to every
        # worker (nccl_ssh).
        launcher_pod["affinity"] = on_nodes([n.name for n in gpu_nodes])
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "nccl", "namespace": NAMESPACE},
            "spec": {"minAvailable": workers + 1, "schedulerName": "volcano",
                     "plugins": {"svc": []},  # no `ssh`: its one key in every pod (nccl_ssh)
                     "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                     "tasks": [{"name": "launcher", "replicas": 1, "template": {"spec": launcher_pod}},
                               {"name": "worker", "replicas": workers, "template": {"spec": worker_pod}}]}}


def _worker_sshd(host_network: bool) -> str:
    """The workers' sshd. On the host network it listens on port 12022 of the node's own
    address only (the pod's status.hostIP, by the downward API), not on every address the
    host holds, public ones included. hostIP rather than the inventory's node-ip: it is the
    address the launcher dials, by construction, on a host of many addresses too. The
    launcher reaches a worker by its name under the svc plugin's headless Service, whose
    endpoint is the pod's IP, and a host-network pod's IP is its hostIP (kubernetes
    pkg/kubelet/kubelet_pods.go, generateAPIPodStatus, v1.33): the Node's first InternalIP,
    which k3s registers from the node-ip the tool wrote (--node-ip). And one template serves
    every worker: a per-node address would be looked up by node name in the shell. The value
    is that node's kubelet's word and sets only that node's sshd; it is quoted, never
    evaluated, and anything but an address's characters stops the worker. A ListenAddress
    without a port takes -p's (sshd(8), -p)."""
    if not host_network:
        return "/usr/sbin/sshd -D"
    return ("case \"$HOST_IP\" in ''|*[!0-9A-Fa-f.:]*) echo 'sshd: status.hostIP is not an IP address' >&2; "
            f"exit 1;; esac && /usr/sbin/sshd -D -p {NCCL_SSH_PORT} -o ListenAddress=\"$HOST_IP\"")


def open_mpi_settings(inventory: Inventory, path: NcclPath) -> dict[str, str]:
    """mpirun's MCA settings on the host network: sshd's port, and Open MPI's own traffic on
    the nodes' node-ip interfaces and in the pinned port block (bootstrap.checks.nccl_ports),
    as NCCL's is on those interfaces. MPI here only hands out NCCL's id and barriers, so it
    takes plain TCP (ob1, no hcoll or UCX, whose ports are their own). {} off the host network."""
    if path.socket_ifname() is None:
        return {}
    names = ",".join(sorted(set(path.interfaces.values())))
    # mpirun runs in the launcher's pod (its eth0 in the pod network), its orteds in the
    # workers' host network: the out-of-band list names both (Open MPI takes names and CIDRs).
    pods = inventory.k3s.cluster_cidr or DEFAULT_CIDRS[4][0]
    return {"plm_rsh_args": f"-p {nccl_ports.SSH_PORT}",
            "pml": "ob1", "btl": "self,tcp", "coll": "^hcoll",
            "btl_tcp_if_include": names,
            "btl_tcp_port_min_v4": str(nccl_ports.BTL_PORT_MIN),
            "btl_tcp_port_range_v4": str(nccl_ports.BTL_PORT_RANGE),
            "oob_tcp_if_include": f"{names},{pods.replace(' ', '')}",
            "oob_tcp_dynamic_ipv4_ports": nccl_ports.span(nccl_ports.OOB_PORTS)}


def check_nccl(cluster, inventory, gpu_nodes, facts, timeout_s, namespace=NAMESPACE) -> CheckResult:
    nccl = inventory.validate.nccl
    if not nccl or not nccl.enabled:
        return CheckResult("nccl", "SKIP", "validate.nccl is not set")
    if len(gpu_nodes) < 2:
        return CheckResult("nccl", "SKIP", "needs two or more GPU nodes")
    gpu_nodes, within = nccl_group(gpu_nodes)
    if len(gpu_nodes) < 2:
        return CheckResult("nccl", "SKIP", "no provider has two or more GPU nodes; NCCL across providers is not "
                           "measured (RDMA does not cross the internet)")
    path = nccl_paths(inventory, gpu_nodes, facts)
    if path.problems:
        return CheckResult("nccl", "FAIL", "cannot tell NCCL which path to measure: " + "; ".join(path.problems))
    for secret in nccl_ssh.secrets_for("nccl", {"launcher": 1, "worker": len(gpu_nodes)}, namespace):
        _create(cluster, secret, namespace)
    _create(cluster, nccl_job(inventory, gpu_nodes, facts, path), namespace)
    launcher = "nccl-launcher-0"
    phase, log, why = _pod_outcome(cluster, launcher, timeout_s, namespace)
    busbw = parse_busbw(log)
    chosen = f" [{path.describe()}]" if path.describe() else ""
    if phase != "Succeeded" or busbw is None:
        return CheckResult("nccl", "FAIL", f"all_reduce_perf {phase.lower()}: {_last(log) or why}{chosen}")
    floor = nccl.min_busbw_gbps
    if floor is not None and busbw < floor:
        return CheckResult("nccl", "FAIL", f"bus bandwidth {busbw:.1f} GB/s is below the floor of {floor:g} GB/s"
                           + within + chosen)
    return CheckResult("nccl", "PASS", f"bus bandwidth {busbw:.1f} GB/s across {len(gpu_nodes)} nodes"
                       + (f" (floor {floor:g})" if floor is not None else "") + within + chosen)


@dataclass
class ChecksNamespace:
    """One use's namespace; `left_on`, once it is deleted: node -> the pods its kubelet had
    not let go of by the deadline ("" for pods on no node)."""

    name: str
    left_on: dict[str, list[str]] = field(default_factory=dict)

    def leftovers(self, status: str) -> list[CheckResult]:
        """Each node whose kubelet kept a pod: a `status` (WARN, or FAIL at the gate) of its own;
        what is on no node, a WARN."""
        later = f"namespace {self.name} stays Terminating; later runs use their own"
        return [CheckResult("cleanup", status, f"its kubelet did not confirm the deletion of {', '.join(pods)} within "
                            f"{CLEANUP_S}s ({later})", node) if node else
                CheckResult("cleanup", "WARN", f"{', '.join(pods)} not deleted within {CLEANUP_S}s ({later})")
                for node, pods in self.left_on.items()]


@contextmanager
def checks_namespace(cluster: Cluster, sweep: bool = True):
    """A namespace of its own (a new name, labelled PART_OF), deleted afterwards. Earlier
    runs' are deleted first (`sweep`; a run's later uses, such as the gate's NCCL pairs after
    its pod checks, skip it: only the first finds anything) and never waited for: one a
    kubelet holds Terminating blocks nothing."""
    if sweep:
        delete_earlier(cluster)
    space = ChecksNamespace(f"{NAMESPACE}-{secrets.token_hex(4)}")
    status, body = request(cluster, "POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": space.name, "labels": dict(PART_OF)}})
    if status >= 300:
        raise ClusterError(f"cannot create namespace {space.name}: {body.get('message', status)}")
    try:
        yield space
    finally:
        space.left_on = cleanup(cluster, space.name)


# The names checks_namespace gives (and the fixed one of older versions). The label alone does
# not make a namespace ours: anyone who may patch namespaces can put it on one (a chart's
# ServiceAccount, a mistaken kubectl label), and a namespace deleted here takes its volumes.
_OUR_NAMESPACE = re.compile(re.escape(NAMESPACE) + r"(?:-[0-9a-f]{8})?", re.ASCII)


def delete_earlier(cluster: Cluster) -> None:
    """Delete the checks' namespaces earlier runs left (the fixed one of older versions too):
    those labelled PART_OF whose name is one checks_namespace gives, never another."""
    selector = ",".join(f"{k}={v}" for k, v in PART_OF.items())
    status, listed = request(cluster, "GET", "/api/v1/namespaces", query=[("labelSelector", selector)])
    listed = listed if status < 300 and isinstance(listed, dict) else {}
    names = {(n.get("metadata") or {}).get("name") for n in _dicts(listed.get("items"))
             if (n.get("status") or {}).get("phase") != "Terminating"}
    for name in sorted(n for n in names | {NAMESPACE} if isinstance(n, str) and _OUR_NAMESPACE.fullmatch(n)):
        request(cluster, "DELETE", f"/api/v1/namespaces/{name}")


def cleanup(cluster: Cluster, namespace: str) -> dict[str, list[str]]:
    """Delete `namespace` and wait (up to CLEANUP_S) until it is gone; returns the pods still
    in it then, by node: a kubelet that never confirms a deletion is that node's to answer for."""
    path = f"/api/v1/namespaces/{namespace}"
    request(cluster, "DELETE", path)
    try:
        wait_for(f"namespace {namespace} to be deleted", lambda: get(cluster, path) is None, CLEANUP_S,
                 first_interval_s=0.25)
        return {}
    except WaitTimeout:
        pods = (get(cluster, path + "/pods") or {}).get("items")
    left: dict[str, list[str]] = {}
    for pod in _dicts(pods):
        node = (pod.get("spec") or {}).get("nodeName")
        left.setdefault(node if isinstance(node, str) else "", []).append(str((pod.get("metadata") or {}).get("name")))
    return left or {"": ["objects other than pods"]}


def run_checks(cluster: Cluster, inventory: Inventory, facts: dict[str, HostFacts], gpu: list[Node]) -> list[CheckResult]:
    """`gpu`: the run's GPU nodes (bootstrap.topology)."""
    timeout = inventory.validate.timeout_s
    # The checks read each node's GPUs from its facts: GPU nodes that answered.
    checked = [n for n in gpu if n.name in facts]
    results: list[CheckResult] = []
    with checks_namespace(cluster) as space:
        results += check_capacity(cluster, inventory, checked, facts)
        results += check_rdma(cluster, inventory, checked)
        results += check_gpu_pods(cluster, inventory, checked, facts, timeout, space.name)
        results.append(check_pvc(cluster, inventory, timeout, space.name))
        results.append(check_gang(cluster, inventory, checked, facts, timeout, space.name))
        results.append(check_nccl(cluster, inventory, checked, facts, timeout, space.name))
    return results + space.leftovers("WARN")


def render_table(results: list[CheckResult]) -> str:
    width = max(len(r.check) + (len(r.node) + 1 if r.node else 0) for r in results)
    lines = []
    for r in results:
        label = f"{r.check}:{r.node}" if r.node else r.check
        # A reason may quote a pod's log or the API: one printable line.
        lines.append(f"{r.status:<4}  {label:<{width}}  {printable(r.reason)}")
    return "\n".join(lines)
