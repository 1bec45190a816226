"""The cluster's kubeconfig: fetched from the first server, kept 0600, merged on request."""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from bootstrap.remote.tunnel import connect_ssh
from bootstrap.errors import BootstrapError
from bootstrap.host.parts.k3s_service import KUBECONFIG
from bootstrap.inventory.model import Inventory
from bootstrap.state.folder import StateDir, write_atomically


def context_name(inventory: Inventory) -> str:
    return f"bootstrap-{inventory.cluster}"


# The cluster's id rides in the kubeconfig as a named extension (client-go's
# clientcmd/api/v1 NamedExtension, as minikube's `cluster_info`), so a merge can tell
# another cluster that happens to have the same name from this one.
EXTENSION = "bootstrap"


# What the tool takes from a server's k3s.yaml: the CA and the client certificate and key,
# nothing else. A rented server's operator controls that file, and the kubernetes client,
# Helm and kubectl act on much more of it: `exec` and `auth-provider` run a program on the
# operator's machine, `proxy-url` and `insecure-skip-tls-verify` hand the API traffic (the
# client key) to someone else, file paths read the operator's own files. Those refuse the
# file (they say the host is hostile); anything else (tls-server-name, extensions, other
# entries) is left behind. What is kept: the fields of PEM_LABELS, below.
REFUSED_CLUSTER_FIELDS = ("proxy-url", "insecure-skip-tls-verify", "certificate-authority")
REFUSED_USER_FIELDS = ("exec", "auth-provider", "token", "tokenFile", "username", "password",
                       "client-certificate", "client-key")
# k3s's file is ~3 KiB, each PEM well under 4 KiB: room for long chains, never a memory bomb.
MAX_KUBECONFIG_BYTES = 256 * 1024
MAX_PEM_FIELD_CHARS = 64 * 1024
# The PEM labels each field may carry (k3s: the CA; the client certificate and its
# intermediate; an EC key from certutil.NewPrivateKey, RSA/PKCS#8 when provided by the user).
PEM_LABELS = {
    "certificate-authority-data": ("CERTIFICATE",),
    "client-certificate-data": ("CERTIFICATE",),
    "client-key-data": ("EC PRIVATE KEY", "RSA PRIVATE KEY", "PRIVATE KEY"),
}
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z ]+)-----\r?\n([A-Za-z0-9+/=\r\n]+?)-----END \1-----\r?\n?", re.ASCII)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", re.ASCII)
_CLUSTER_ID = re.compile(r"[0-9a-f]{1,64}", re.ASCII)


@dataclass(frozen=True)
class Credentials:
    """The allow-listed fields of a kubeconfig, each checked base64 of PEM of its kind."""

    certificate_authority: str
    client_certificate: str
    client_key: str


def rewrite(text: str, inventory: Inventory, cluster_id: str, server: str | None = None,
            address: str | None = None) -> str:
    """The kubeconfig the tool writes, built from scratch: the CA and client certificate and
    key of k3s's file (read from the server at `address`, default the first; anything
    dangerous in it is refused), pointed at that server's port 6443 or at `server`
    (host:port), cluster, user and context named bootstrap-<cluster>."""
    address = address or inventory.servers[0].address
    origin = next((s.name for s in inventory.servers if s.address == address), address)
    credentials = credentials_from(_parse(text, f"{KUBECONFIG} on {origin}"), f"{KUBECONFIG} on {origin}")
    host = f"[{address}]" if ":" in address else address
    return render(context_name(inventory), server or f"{host}:6443", cluster_id, credentials)


def render(name: str, server: str, cluster_id: str | None, credentials: Credentials) -> str:
    """A kubeconfig of one cluster, user and context, every field one the tool chose."""
    cluster: dict = {"server": f"https://{server}",
                     "certificate-authority-data": credentials.certificate_authority}
    if cluster_id:
        cluster["extensions"] = [{"name": EXTENSION, "extension": {"cluster-id": cluster_id}}]
    config = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"client-certificate-data": credentials.client_certificate,
                                           "client-key-data": credentials.client_key}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, default_flow_style=False)


def _parse(text: str, source: str) -> dict:
    if not isinstance(text, str) or len(text) > MAX_KUBECONFIG_BYTES:
        raise BootstrapError(f"{source} is larger than {MAX_KUBECONFIG_BYTES // 1024} KiB; it was not used")
    try:
        config = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BootstrapError(f"{source} is not valid YAML ({reason[:200]}); it was not used") from None
    if not isinstance(config, dict):
        raise BootstrapError(f"{source} is not a kubeconfig (a mapping); it was not used")
    return config


def credentials_from(config: dict, source: str) -> Credentials:
    """The allow-listed fields of the entry the current context names. A field that would run
    a program, send credentials elsewhere or skip TLS verification, in any entry, refuses
    the whole file (it says the host is hostile); anything else is left behind."""
    clusters, users = _entries(config, "clusters", source), _entries(config, "users", source)
    for label, entries, refused in (("cluster", clusters, REFUSED_CLUSTER_FIELDS),
                                    ("user", users, REFUSED_USER_FIELDS)):
        for entry_name, body in entries.items():
            present = [field for field in refused if field in body]
            if present:
                raise BootstrapError(
                    f"{source} carries {label} field {present[0]!r} (in {label} {entry_name!r}): the tool never "
                    f"uses a kubeconfig that can run a program, send the credentials elsewhere or skip TLS "
                    f"verification; it was not used",
                    "the host's k3s.yaml was not written by k3s: treat the host as compromised")
    cluster_name, user_name = _chosen(config, clusters, users, source)
    cluster, user = clusters[cluster_name], users[user_name]
    return Credentials(_pem_field(cluster, "certificate-authority-data", f"{source}, cluster {cluster_name!r}"),
                       _pem_field(user, "client-certificate-data", f"{source}, user {user_name!r}"),
                       _pem_field(user, "client-key-data", f"{source}, user {user_name!r}"))


def _entries(config: dict, section: str, source: str) -> dict[str, dict]:
    """{name: cluster or user body} of a section; wrong types refused with where they are."""
    key = section[:-1]  # clusters -> cluster
    entries = config.get(section)
    if not isinstance(entries, list):
        raise BootstrapError(f"{source}: {section} is not a list; it was not used")
    found: dict[str, dict] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) \
                or not isinstance(entry.get(key), dict):
            raise BootstrapError(f"{source}: {section}[{index}] is not a named {key}; it was not used")
        found[entry["name"]] = entry[key]
    return found


def _chosen(config: dict, clusters: dict, users: dict, source: str) -> tuple[str, str]:
    """The cluster and user of the current context (k3s writes one of each, `default`)."""
    contexts = config.get("contexts") or []
    if not isinstance(contexts, list):
        raise BootstrapError(f"{source}: contexts is not a list; it was not used")
    named = {c.get("name"): c.get("context") for c in contexts if isinstance(c, dict)}
    context = named.get(config.get("current-context")) if len(named) != 1 else next(iter(named.values()))
    if isinstance(context, dict) and context.get("cluster") in clusters and context.get("user") in users:
        return context["cluster"], context["user"]
    if len(clusters) == 1 and len(users) == 1 and not named:
        return next(iter(clusters)), next(iter(users))
    raise BootstrapError(f"{source} names no context whose cluster and user it has; it was not used")


def _pem_field(body: dict, field: str, source: str) -> str:
    """`field`: base64 of one or more PEM blocks of the kind it must hold, or refused."""
    value = body.get(field)
    if not isinstance(value, str) or not value.strip():
        raise BootstrapError(f"{source}: {field} is missing; it was not used")
    if len(value) > MAX_PEM_FIELD_CHARS:
        raise BootstrapError(f"{source}: {field} is longer than {MAX_PEM_FIELD_CHARS // 1024} KiB; it was not used")
    compact = "".join(value.split())
    try:
        pem = base64.b64decode(compact, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise BootstrapError(f"{source}: {field} is not base64 of PEM text; it was not used") from None
    if not _is_pem_of(pem, PEM_LABELS[field]):
        raise BootstrapError(f"{source}: {field} is not PEM of {' or '.join(PEM_LABELS[field])}; it was not used")
    return compact


def _is_pem_of(pem: str, labels: tuple[str, ...]) -> bool:
    """Nothing but PEM blocks of `labels`, each a base64 DER SEQUENCE (one key at most)."""
    blocks, at = [], 0
    text = pem.strip() + "\n"
    for match in _PEM_BLOCK.finditer(text):
        if text[at:match.start()].strip():
            return False
        blocks.append(match)
        at = match.end()
    if not blocks or text[at:].strip():
        return False
    if any(m.group(1) not in labels for m in blocks) or ("CERTIFICATE" not in labels and len(blocks) > 1):
        return False
    try:
        return all(base64.b64decode("".join(m.group(2).split()), validate=True)[:1] == b"\x30" for m in blocks)
    except ValueError:
        return False


@dataclass(frozen=True)
class Saved:
    """A kubeconfig the tool wrote, as read back and checked again."""

    name: str
    server: str  # host:port
    cluster_id: str | None
    credentials: Credentials

    def render(self, server: str | None = None) -> str:
        return render(self.name, server or self.server, self.cluster_id, self.credentials)


_SERVER = re.compile(r"https://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}", re.ASCII)


def saved(text: str, source: str) -> Saved:
    """A kubeconfig the tool wrote, checked again: one saved before the allow-list existed
    may carry whatever the server sent, and only its allow-listed fields are used."""
    config = _parse(text, source)
    credentials = credentials_from(config, source)
    clusters = _entries(config, "clusters", source)
    name, _ = _chosen(config, clusters, _entries(config, "users", source), source)
    if not _NAME.fullmatch(name) or len(name) > 253:
        raise BootstrapError(f"{source}: cluster name {name!r} is not one the tool writes; it was not used")
    server = clusters[name].get("server")
    if not isinstance(server, str) or not _SERVER.fullmatch(server):
        raise BootstrapError(f"{source}: server {server!r} is not an https://host:port the tool writes; "
                             "it was not used", "`bootstrap kubeconfig INVENTORY` fetches it again")
    cluster_id = cluster_id_of({"cluster": clusters[name]})
    if cluster_id is not None and not (isinstance(cluster_id, str) and _CLUSTER_ID.fullmatch(cluster_id)):
        raise BootstrapError(f"{source}: the cluster id is not hex digits; it was not used")
    return Saved(name, server[len("https://"):], cluster_id, credentials)


def fetch_over_ssh(inventory: Inventory, state: StateDir) -> Path:
    first = inventory.servers[0]
    client = connect_ssh(inventory, first, state)
    try:
        sudo = "sudo -n " if inventory.ssh_for(first).use_sudo else ""
        _, stdout, stderr = client.exec_command(f"{sudo}cat {KUBECONFIG}", timeout=30)
        text = stdout.read(MAX_KUBECONFIG_BYTES + 1).decode(errors="replace")
        if stdout.channel.recv_exit_status() != 0:
            raise BootstrapError(f"cannot read {KUBECONFIG} on {first.name}: {stderr.read(4096).decode(errors='replace').strip()[-300:]}",
                                 "has `bootstrap up` run on this cluster?")
    finally:
        client.close()
    return state.write_secret("kubeconfig", rewrite(text, inventory, state.cluster_id))


def with_server(path: Path, server: str) -> str:
    """The saved kubeconfig, checked again and built anew, pointed at another address (the
    local end of a tunnel)."""
    return saved(read_saved(path), str(path)).render(server)


def read_saved(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as exc:
        raise BootstrapError(f"cannot read the kubeconfig {path}: {exc.strerror}",
                             "`bootstrap kubeconfig INVENTORY` fetches it again") from None


def cluster_id_of(entry: dict) -> str | None:
    """The cluster id a cluster entry carries; None for an entry without one (or one of a
    shape the tool never writes: the user's ~/.kube/config is theirs, any shape)."""
    cluster = entry.get("cluster") if isinstance(entry, dict) else None
    extensions = cluster.get("extensions") if isinstance(cluster, dict) else None
    for extension in extensions if isinstance(extensions, list) else []:
        if isinstance(extension, dict) and extension.get("name") == EXTENSION:
            found = extension.get("extension")
            return found.get("cluster-id") if isinstance(found, dict) else None
    return None


def foreign_entry(existing: dict, ours: dict) -> str | None:
    """The name of a cluster entry in `existing` that has our name but is another cluster's."""
    for mine in ours.get("clusters", []):
        for entry in _list(existing.get("clusters")):
            if not isinstance(entry, dict) or entry.get("name") != mine["name"]:
                continue
            theirs = cluster_id_of(entry)
            server = entry.get("cluster").get("server") if isinstance(entry.get("cluster"), dict) else None
            if theirs != cluster_id_of(mine) and (theirs is not None or server != mine["cluster"]["server"]):
                return mine["name"]
    return None


def merge_into(target: Path, ours: str | dict) -> None:
    """Replace our cluster/user/context entries in `target`, keep everything else. `ours`:
    the saved kubeconfig's text (or parsed), checked again and rebuilt from the allow-list,
    so only fields the tool chose reach the file kubectl reads. The rest of `target` is the
    user's own and is kept as it is. An entry of the same name that belongs to another
    cluster is not overwritten."""
    text = ours if isinstance(ours, str) else yaml.safe_dump(ours, default_flow_style=False)
    ours = yaml.safe_load(saved(text, "the kubeconfig to merge").render())
    existing = _read_local(target)
    clash = foreign_entry(existing, ours)
    if clash:
        raise BootstrapError(f"{target} already has a context {clash} for another cluster of the same name; "
                             "it was not changed",
                             f"give this cluster its own name (cluster: in the inventory), or remove the other "
                             f"entry first: kubectl config delete-context {clash}; kubectl config delete-cluster {clash}")
    for section in ("clusters", "users", "contexts"):
        names = {entry["name"] for entry in ours[section]}
        kept = [entry for entry in _list(existing.get(section))
                if not (isinstance(entry, dict) and entry.get("name") in names)]
        existing[section] = kept + ours[section]
    existing.setdefault("current-context", ours["current-context"])
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, yaml.safe_dump(existing, default_flow_style=False).encode(), 0o600)


def _read_local(target: Path) -> dict:
    """The user's kubeconfig as it is; one kubectl could not read either is refused, unchanged."""
    try:
        text = target.read_text() if target.exists() else ""
        existing = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise BootstrapError(f"cannot read {target} ({type(exc).__name__}); it was not changed",
                             "fix or move that file, then run this again") from None
    if existing is None:
        return {"apiVersion": "v1", "kind": "Config", "preferences": {}}
    bad = [s for s in ("clusters", "users", "contexts") if existing.get(s) is not None
           and not isinstance(existing.get(s), list)] if isinstance(existing, dict) else ["the file"]
    if bad:
        raise BootstrapError(f"{target} is not a kubeconfig ({bad[0]} is not a list); it was not changed",
                             "fix or move that file, then run this again")
    return existing


def _list(value) -> list:
    return value if isinstance(value, list) else []


def default_target() -> Path:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser()
    return Path.home() / ".kube" / "config"
