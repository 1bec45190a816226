"""The NCCL test's SSH keys: the launcher may log in to the workers, no worker to another.

Volcano's `ssh` job plugin mounts one Secret into every pod of a job, launcher and workers
alike: the private key (RSA, 1024 bits), its public half as authorized_keys, and an ssh config
(volcano-sh/volcano pkg/controllers/job/plugins/ssh/ssh.go, mountRsaKey, generateRsaKey). Root
on any node that runs a worker reads that key from the kubelet's copy of the Secret, and the
workers' sshd (in the host's network, on port 12022) takes it: one node could log in, as root,
to every other node's worker for as long as the test runs. So the tool draws the pair itself,
once per run (the run's namespace is new, and deleted afterwards): the private key goes to the
launcher's Secret only, the workers' Secret holds only the public key. Root on the launcher's
node can still reach the workers (that is what mpirun does); root on a worker's node, nothing.
The files, their paths under /root/.ssh and the config are the plugin's, so the image sees
what it saw before.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

LAUNCHER_SECRET = "nccl-launcher-ssh"
WORKER_SECRET = "nccl-worker-ssh"
SSH_DIR = "/root/.ssh"  # the plugin's SSHAbsolutePath
VOLUME = "ssh"


def new_key_pair() -> tuple[str, str]:
    """(private key in OpenSSH's format, public key as an authorized_keys line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode() + " nccl-launcher\n"


def ssh_config(job: str, tasks: dict[str, int]) -> str:
    """As the plugin writes it (generateSSHConfig): fresh host keys each run, so none is pinned;
    each pod's short name resolves to its name under the job's subdomain."""
    lines = ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
    for task, replicas in tasks.items():
        for i in range(replicas):
            name = f"{job}-{task}-{i}"
            lines += [f"Host {name}", f"  HostName {name}.{job}"]
    return "\n".join(lines) + "\n"


def secrets_for(job: str, tasks: dict[str, int], namespace: str, pair: tuple[str, str] | None = None) -> list[dict]:
    """The launcher's Secret (private key, public key, config) and the workers' (public key only)."""
    private, public = pair or new_key_pair()
    launcher = {"id_ed25519": private, "id_ed25519.pub": public, "config": ssh_config(job, tasks)}
    return [_secret(LAUNCHER_SECRET, namespace, launcher), _secret(WORKER_SECRET, namespace, {"authorized_keys": public})]


def _secret(name: str, namespace: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque", "stringData": data}


def mount(pod_spec: dict, secret: str, files: tuple[str, ...]) -> None:
    """`secret`'s files in /root/.ssh of the pod's container, mode 0600, by the plugin's own
    layout (a `.ssh` folder inside the volume, mounted by subPath), which sshd's StrictModes takes."""
    pod_spec.setdefault("volumes", []).append({"name": VOLUME, "secret": {
        "secretName": secret, "defaultMode": 0o600, "items": [{"key": f, "path": f".ssh/{f}"} for f in files]}})
    for container in pod_spec["containers"]:
        container.setdefault("volumeMounts", []).append({"name": VOLUME, "mountPath": SSH_DIR, "subPath": ".ssh"})


LAUNCHER_FILES = ("id_ed25519", "id_ed25519.pub", "config")
WORKER_FILES = ("authorized_keys",)
