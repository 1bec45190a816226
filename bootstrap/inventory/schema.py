"""The inventory's shape: every key a user may write, its type, default and dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap.inventory import go_duration, model as m
from bootstrap.inventory.addresses import DNS_LABEL, SSH_USER, endpoint_error, host_error, ip_error, jump_error, url_error
from bootstrap.inventory.cron import schedule_error
from bootstrap.inventory.kube import label_value_error, node_label_key_error, taint_error
from bootstrap.inventory.source import Path
from bootstrap.inventory.spec import (INVALID, Bool, Checker, Enum, Field, Int, ListOf, MapOf, Number, Record, Spec, Str, cidr_error, describe_type)
from bootstrap.checks.k3s_flags import EVICTION_ARGS, NODE_MONITOR_GRACE_MIN_S, arg_name, component_args, flag_problem
from bootstrap.checks.k3s_versions import VERSION_PATTERN

DRIVER_MODES = ("preinstalled", "host", "operator")
ROLES = tuple(role.value for role in m.Role)
STORAGE_CLASSES = ("local-path", "nfs", "longhorn")
NETWORK_MODES = tuple(mode.value for mode in m.NetworkMode)
K3S_DISABLE = ("coredns", "servicelb", "traefik", "local-storage", "metrics-server", "runtimes")
# Whereabouts ships inside the multus chart: pin charts.multus to move it.
CHART_COMPONENTS = tuple(component.value for component in m.Component)


def _archive_or_repo(values: dict, path: Path, ck: Checker) -> None:
    if values.get("archive") and values.get("repo"):
        ck.problem(path, "a chart comes from an archive or a repository, not both",
                   "keep archive: (a .tgz next to the inventory) or repo: (an https or oci:// mirror)")


CHART_PIN = Record(
    fields={
        "version": Field(Str(pattern=r"v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?", expected="a chart version",
                             example="v25.10.1"), required=True),
        # `helm package` writes NAME-VERSION.tgz; the version is checked against its Chart.yaml.
        "archive": Field(Str(pattern=r"[^\x00]*\.tgz", expected="a chart archive (.tgz) path",
                             example="charts/gpu-operator-v26.7.0.tgz", unicode=True)),
        "repo": Field(Str(pattern=r"(https|oci)://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~/-]*)?",
                          expected="an https:// chart repository or an oci:// registry",
                          example="oci://registry.lab:5000/charts")),
    },
    build=m.ChartPin,
    shorthand=lambda v: {"version": v} if isinstance(v, str) else None,
    checks=[_archive_or_repo],
)

# Patterns spell digits [0-9]: Python's backslash-d also matches '٣' and '３'.
K3S_VERSION = VERSION_PATTERN
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MIG_PROFILE = r"[0-9]+g\.[0-9]+gb(\+me)?"
# A Linux network interface: up to 15 characters, never '-' first (it would read as an option).
INTERFACE = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}"
# An image reference as containerd parses it: [registry[:port]/]path[:tag][@sha256:digest].
_IMAGE_PART = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_REGISTRY = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:[0-9]{1,5})?/"
IMAGE_REF = rf"({_REGISTRY})?{_IMAGE_PART}(/{_IMAGE_PART})*(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(@sha256:[0-9a-f]{{64}})?"
# deb [option=value ...] URI SUITE [COMPONENT...], in characters apt and a shell read alike.
_APT_OPTION = r"[A-Za-z0-9_-]+=[A-Za-z0-9._/:,+-]+"
_APT_WORD = r"[A-Za-z0-9._/~+-]+"
APT_SOURCE = rf"deb (\[{_APT_OPTION}( {_APT_OPTION})*\] )?[a-z][a-z0-9+]*:/[A-Za-z0-9._~:/@+-]* {_APT_WORD}( {_APT_WORD})*"
REGISTRY_HOST = r"[A-Za-z0-9.*:-]+"


class OffIsFalse(Enum):
    """An enum with an `off` choice: YAML 1.1 reads a bare `off` as false, so false is `off`."""

    def check(self, value, path, ck):
        return super().check("off" if value is False else value, path, ck)


def _secret_fields(name: str) -> dict[str, Field]:
    return {
        f"{name}_env": Field(Str(pattern=ENV_NAME, expected="an environment variable name",
                                 example="REGISTRY_PASSWORD")),
        f"{name}_file": Field(Str(expected="a file path", example="/run/secrets/registry", unicode=True)),
    }


def _secret_ref(values: dict, name: str) -> m.SecretRef | None:
    env, file = values.pop(f"{name}_env", None), values.pop(f"{name}_file", None)
    return m.SecretRef(env=env, file=file) if env or file else None


def _one_secret_source(name: str):
    def check(values: dict, path: Path, ck: Checker) -> None:
        if values.get(f"{name}_env") and values.get(f"{name}_file"):
            ck.problem(path + (f"{name}_file",), f"both {name}_env and {name}_file are set", "keep one of them",
                       key=True)
    return check


def _build_with_secrets(cls, *names):
    def build(**values):
        for name in names:
            values[name] = _secret_ref(values, name)
        return cls(**values)
    return build


SSH_FIELDS = {
    "user": Field(Str(pattern=SSH_USER, expected="a user name", example="ubuntu")),
    "key": Field(Str(expected="a private key file", example="~/.ssh/id_ed25519", unicode=True)),
    "port": Field(Int(min=1, max=65535, example="22")),
    "sudo": Field(Bool()),
    "jump": Field(Str(validator=jump_error, expected="a bastion as user@host[:port]", example="ubuntu@203.0.113.5")),
    "connect_timeout": Field(Int(min=1, max=600)),
}

SSH = Record(
    fields={**SSH_FIELDS, **_secret_fields("password"), **_secret_fields("key_passphrase")},
    build=_build_with_secrets(m.SshSettings, "password", "key_passphrase"),
    checks=[_one_secret_source("password"), _one_secret_source("key_passphrase")],
)



def _node_ssh(**values) -> dict:
    """A node's ssh: overrides of the top-level settings; its own password only when named."""
    password = _secret_ref(values, "password")
    return {**values, "password": password} if password else values


# A node may name its own password: a password shared by several nodes is refused
# (loader.check_own_passwords), since every one of them is offered it.
NODE_SSH = Record(fields={**SSH_FIELDS, **_secret_fields("password")}, build=_node_ssh,
                  checks=[_one_secret_source("password")])

S3 = Record(
    fields={
        "bucket": Field(Str(pattern=r"[a-z0-9][a-z0-9.-]{1,62}", expected="an S3 bucket name", example="k3s-snapshots"),
                        required=True),
        "endpoint": Field(Str(validator=lambda v: endpoint_error(v, user_ok=False), expected="an S3 host[:port]",
                              example="s3.example.com")),
        "region": Field(Str(pattern=r"[a-z0-9-]+", expected="a region", example="us-east-1")),
        "folder": Field(Str(pattern=r"[A-Za-z0-9._/-]+", expected="a folder in the bucket", example="train-a")),
        "insecure": Field(Bool()),
        **_secret_fields("access_key"), **_secret_fields("secret_key"),
    },
    build=_build_with_secrets(m.SnapshotS3, "access_key", "secret_key"),
    checks=[_one_secret_source("access_key"), _one_secret_source("secret_key")],
)

SNAPSHOTS = Record(
    fields={
        "s3": Field(S3),
        "schedule": Field(Str(validator=schedule_error, expected="a five-field cron schedule",
                              example='"0 */6 * * *"')),
        "retention": Field(Int(min=1, max=1000)),
    },
    build=m.EtcdSnapshots,
)


FLAG_NAME = Str(pattern=r"[a-z0-9][a-z0-9-]*", expected="a k3s flag name", example="kube-apiserver-arg")
FLAG_TEXT = Str(expected="a k3s flag value")


@dataclass
class K3sFlag(Spec):
    """A config.yaml key for one role: a real k3s flag of that role that the tool does not set itself."""

    role: str
    expected = "a k3s flag name"

    def check(self, value, path, ck):
        if FLAG_NAME.check(value, path, ck) is INVALID:
            return INVALID
        problem = flag_problem(self.role, value)
        if problem:
            ck.problem(path, problem[0], problem[1], key=True)
            return INVALID
        return value


class FlagValue(Spec):
    """A plain value or a list of them (config.yaml is written with a YAML dumper, so a value
    cannot escape its line)."""

    def check(self, value, path, ck):
        if isinstance(value, list):  # a list stays a list: repeatable flags add to the tool's own
            items = [self.scalar(item, path + (i,), ck) for i, item in enumerate(value)]
            return INVALID if INVALID in items else items
        return self.scalar(value, path, ck)

    def scalar(self, value, path, ck):
        if isinstance(value, str):
            return FLAG_TEXT.check(value, path, ck)
        if isinstance(value, (bool, int, float)):  # NaN and infinities never get this far
            return value
        ck.problem(path, f"expected text, a number, true/false or a list of those, got {describe_type(value)}")
        return INVALID


def k3s_flags(role: str) -> MapOf:
    return MapOf(K3sFlag(role), FlagValue())


def _version_xor_channel(values: dict, path: Path, ck: Checker) -> None:
    if values.get("version") and values.get("channel"):
        ck.problem(path + ("channel",), "both version and channel are set",
                   "keep version (a pinned release) or channel (the newest release on it), not both", key=True)


def _eviction_once(values: dict, path: Path, ck: Checker) -> None:
    """k3s.lost_node_eviction_s writes the eviction arguments itself: the same ones under
    server_config as well would leave two answers to one question."""
    if values.get("lost_node_eviction_s") is None:
        return
    server_config = values.get("server_config") if isinstance(values.get("server_config"), dict) else {}
    for flag, name in EVICTION_ARGS:
        if flag in server_config and any(arg_name(a) == name for a in component_args(server_config[flag])):
            ck.problem(path + ("server_config", flag), f"{name} is set here and by k3s.lost_node_eviction_s",
                       f"keep k3s.lost_node_eviction_s (it sets {', '.join(n for _, n in EVICTION_ARGS)}), or "
                       f"remove it and set each argument here")


_GRACE_ARG = "node-monitor-grace-period"
GRACE_FLOOR_REASON = (f"a node is marked lost {NODE_MONITOR_GRACE_MIN_S} s after its last status at the earliest: "
                      "a healthy kubelet may take 45 s to drop a stalled connection to the API server "
                      "(kubernetes/kubernetes#121793; 50 s is kube-controller-manager's default since "
                      "v1.32, kubernetes/kubernetes#126287), and an earlier eviction would evict every "
                      "pod of that healthy node")


def _grace_period_floor(values: dict, path: Path, ck: Checker) -> None:
    """The floor k3s.lost_node_eviction_s keeps holds for the raw argument too: a
    node-monitor-grace-period under server_config below NODE_MONITOR_GRACE_MIN_S, in any form
    Go's ParseDuration reads (20s, 1m, 500ms, 1m30s), is refused with the reason."""
    server_config = values.get("server_config") if isinstance(values.get("server_config"), dict) else {}
    flag = "kube-controller-manager-arg"
    if flag not in server_config or values.get("lost_node_eviction_s") is not None:
        return  # with the key set, _eviction_once refuses the argument already
    listed = isinstance(server_config[flag], list)
    for i, arg in enumerate(component_args(server_config[flag])):
        _, eq, text = str(arg).partition("=")
        if arg_name(arg) != _GRACE_ARG or not eq:
            continue
        where = path + ("server_config", flag) + ((i,) if listed else ())
        value = go_duration.seconds(text)
        if value is None:
            ck.problem(where, f"{_GRACE_ARG}={text} is not a duration kube-controller-manager reads",
                       f"write a Go duration of at least {NODE_MONITOR_GRACE_MIN_S}s, e.g. {_GRACE_ARG}=60s")
        elif value < NODE_MONITOR_GRACE_MIN_S:
            ck.problem(where, f"{_GRACE_ARG}={text} is below the minimum of {NODE_MONITOR_GRACE_MIN_S}s: "
                       f"{GRACE_FLOOR_REASON}", f"write {_GRACE_ARG}={NODE_MONITOR_GRACE_MIN_S}s or more")


# k3s enables NodeRestriction itself (k3s-io/k3s pkg/daemons/control/server.go, apiServer:
# argsMap["enable-admission-plugins"] = "NodeRestriction"), and a kube-apiserver-arg of the
# same name replaces k3s's value (pkg/daemons/config GetArgs): without NodeRestriction a
# kubelet may write any Node, its own node-restriction.kubernetes.io/ labels included, which
# is what keeps untrusted agents off the trusted nodes' work (nodes[].trusted, the RDMA label).
_ADMISSION_ARGS = ("enable-admission-plugins", "admission-control")


def _node_restriction_kept(values: dict, path: Path, ck: Checker) -> None:
    server_config = values.get("server_config") if isinstance(values.get("server_config"), dict) else {}
    flag = "kube-apiserver-arg"
    if flag not in server_config:
        return
    listed = isinstance(server_config[flag], list)
    for i, arg in enumerate(component_args(server_config[flag])):
        name, eq, text = str(arg).partition("=")
        plugins = [p.strip() for p in text.split(",")] if eq else []
        where = path + ("server_config", flag) + ((i,) if listed else ())
        adds = name.endswith(("+", "-"))  # k3s's append / prepend forms keep its own value
        if arg_name(arg) in _ADMISSION_ARGS and not adds and "NodeRestriction" not in plugins:
            ck.problem(where, f"{arg_name(arg)}={text} replaces k3s's NodeRestriction: without it a kubelet may "
                       "change any Node, and the labels that keep untrusted agents apart",
                       f"add NodeRestriction to the list: "
                       f"{arg_name(arg)}={','.join([*filter(None, plugins), 'NodeRestriction'])}")
        elif arg_name(arg) == "disable-admission-plugins" and "NodeRestriction" in plugins:
            ck.problem(where, "disable-admission-plugins turns NodeRestriction off: a kubelet could then change "
                       "any Node, and the labels that keep untrusted agents apart",
                       "remove NodeRestriction from disable-admission-plugins")


K3S = Record(
    fields={
        "version": Field(Str(pattern=K3S_VERSION, expected="a k3s release", example="v1.33.5+k3s1")),
        "channel": Field(Str(pattern=r"stable|latest|testing|v[0-9]+\.[0-9]+", expected="a k3s channel",
                             example="stable, latest, testing or v1.33")),
        "airgap": Field(Str(expected="a folder path", example="./artifacts", unicode=True)),
        "tls_san": Field(ListOf(Str(validator=host_error, expected="an IP address or DNS name",
                                    example="203.0.113.10"), scalar_ok=True)),
        "disable": Field(ListOf(Enum(K3S_DISABLE, what="k3s component to disable"), scalar_ok=True)),
        "flannel_iface": Field(Str(pattern=INTERFACE, expected="a network interface name",
                                   example="eth1")),
        "flannel_backend": Field(Enum(("vxlan", "host-gw", "wireguard-native", "none"), what="flannel backend")),
        "cluster_cidr": Field(Str(validator=cidr_error, example="10.42.0.0/16")),
        "service_cidr": Field(Str(validator=cidr_error, example="10.43.0.0/16")),
        "snapshots": Field(SNAPSHOTS),
        # Grace period plus toleration: the grace period alone is never below
        # NODE_MONITOR_GRACE_MIN_S (a kubelet's stalled connection), so neither is the total.
        "lost_node_eviction_s": Field(Int(
            min=NODE_MONITOR_GRACE_MIN_S, max=3600, expected="seconds", example="60",
            min_reason=GRACE_FLOOR_REASON)),
        "server_config": Field(k3s_flags("server")),
        "agent_config": Field(k3s_flags("agent")),
    },
    build=m.K3sSettings,
    checks=[_version_xor_channel, _eviction_once, _grace_period_floor, _node_restriction_kept],
)


def _sharing_exclusive(values: dict, path: Path, ck: Checker) -> None:
    chosen = [k for k in ("time_slicing", "mig", "mps") if values.get(k)]
    if len(chosen) > 1:
        ck.problem(path, f"{' and '.join(chosen)} are set together on one node",
                   "a node shares its GPUs one way: keep one of time_slicing, mig or mps "
                   "(give other nodes their own gpu.sharing)")


def _mig_layout_or_profiles(values: dict, path: Path, ck: Checker) -> None:
    has_layout, has_profiles = bool(values.get("layout")), bool(values.get("profiles"))
    if has_layout == has_profiles:
        ck.problem(path, "MIG needs exactly one of layout or profiles",
                   "write layout: all-1g.18gb, or profiles: {3g.71gb: 2}")


def _single_strategy_needs_one_profile(values: dict, path: Path, ck: Checker) -> None:
    """With strategy single every MIG device of a node must be the same profile: the device
    plugin advertises nothing for a mix."""
    if values.get("strategy", "single") != "single":
        return
    mixed = values.get("layout") == "all-balanced" or len(values.get("profiles") or {}) > 1
    if mixed:
        ck.problem(path + ("strategy",), "strategy single needs one MIG profile per node; this layout mixes several",
                   "set strategy: mixed (resources become nvidia.com/mig-<profile>), or use one profile")


def _layout_in_mig_parted_spelling(values: dict, path: Path, ck: Checker) -> None:
    """The layout becomes the nvidia.com/mig.config label, which cannot hold '+'; mig-parted
    names a profile's layout with '+' spelled '.' (NVIDIA/mig-parted
    deployments/systemd/config-default.yaml, v0.15.0: `all-1g.5gb.me` holds "1g.5gb+me")."""
    layout = values.get("layout")
    if isinstance(layout, str) and "+" in layout:
        ck.problem(path + ("layout",), f"MIG layout {layout} is not a name mig-parted knows (nor a valid label value)",
                   f"write layout: {layout.replace('+', '.')} (mig-parted's name for it)")


MIG = Record(
    fields={
        "layout": Field(Str(pattern=r"[a-z0-9][a-z0-9.+-]*", expected="a MIG layout name",
                            example="all-1g.18gb")),
        "profiles": Field(MapOf(Str(pattern=MIG_PROFILE, expected="a MIG profile name", example="3g.71gb"),
                                Int(min=1, max=7))),
        "strategy": Field(Enum(("single", "mixed"), what="MIG strategy")),
    },
    build=m.Mig,
    checks=[_mig_layout_or_profiles, _single_strategy_needs_one_profile, _layout_in_mig_parted_spelling],
)

SHARING = Record(
    fields={
        # NVIDIA/k8s-device-plugin api/config/v1/replicas.go (ReplicatedResource.UnmarshalJSON, v0.20.0):
        # "number of replicas must be >= 2", and the node advertises no GPUs. No sharing is no block.
        "time_slicing": Field(Record(fields={"replicas": Field(Int(min=2, max=128, example="4"), required=True),
                                             "rename_by_default": Field(Bool())},
                                     build=m.TimeSlicing)),
        "mig": Field(MIG),
        "mps": Field(Record(fields={"replicas": Field(Int(min=2, max=48, example="4"), required=True)},
                            build=m.Mps)),
    },
    build=m.Sharing,
    shorthand=lambda v: {} if v in (None, "none") else None,
    checks=[_sharing_exclusive],
)

# The GPUs a node should have (gpu.count, nodes[].gpu.count): an HGX board holds 8, the largest 16.
GPU_COUNT = Int(min=1, max=64, expected="a number of GPUs", example="8")

GATE = Record(
    fields={
        "enabled": Field(Bool()),
        "checks": Field(ListOf(Enum(m.GATE_CHECKS, what="gate check"), scalar_ok=True)),
        "burn_in_s": Field(Int(min=10, max=3600, example="120")),
        "burn_in_min_gflops": Field(Number(min=0)),
    },
    build=m.GateSettings,
    shorthand=lambda v: {"enabled": v} if isinstance(v, bool) else None,  # `gate: false`
)

GPU = Record(
    fields={
        "driver": Field(Enum(DRIVER_MODES, what="driver mode")),
        "cuda": Field(Str(pattern=r"[0-9]{1,2}\.[0-9]{1,2}", expected="a CUDA version", example='"12.4" (in quotes)')),
        "driver_branch": Field(Str(pattern=r"[0-9]{3}", expected="an NVIDIA driver branch", example='"570"')),
        "health": Field(OffIsFalse(("warn", "strict", "off"), what="GPU health mode")),
        "gate": Field(GATE),
        "sharing": Field(SHARING),
        "count": Field(GPU_COUNT),
        "container_toolkit": Field(Record(fields={
            "apt_source": Field(Str(pattern=APT_SOURCE, expected="an apt source line",
                                    example='"deb [trusted=yes] http://mirror.internal/nvidia ./"')),
            "version": Field(Str(pattern=r"[0-9][A-Za-z0-9.+~-]*", expected="a package version",
                                 example='"1.17.8-1"')),
        }, build=m.ContainerToolkit)),
    },
    build=lambda **values: m.GpuSettings(**values, written=True),  # built only where `gpu:` is written
)

def _server_is_trusted(values: dict, path: Path, ck: Checker) -> None:
    if values.get("trusted") is False and values.get("role") == m.Role.SERVER:
        ck.problem(path + ("trusted",), "a server cannot be untrusted: servers hold the cluster (the server token, "
                   "the CA keys, etcd)", "rent servers only where you would keep your admin credentials, or make "
                   "this node an agent")


NODE_GPU = Record(
    fields={"enabled": Field(Bool()), "sharing": Field(SHARING), "count": Field(GPU_COUNT)},
    build=m.NodeGpu,
)

NODE = Record(
    fields={
        "name": Field(Str(pattern=DNS_LABEL, expected="a node name (lower-case letters, digits and '-')",
                          example="gpu-1"), required=True),
        "address": Field(Str(validator=host_error, expected="an IP address or host name",
                             example="203.0.113.11"), required=True),
        "role": Field(Enum(ROLES, what="role")),
        "node_ip": Field(Str(validator=ip_error, example="10.0.0.11")),
        "labels": Field(MapOf(Str(validator=node_label_key_error, expected="a Kubernetes label key", example="pool"),
                              Str(validator=label_value_error, expected="a Kubernetes label value",
                                  example="h100"))),
        "taints": Field(ListOf(Str(validator=taint_error, expected="a taint key[=value]:Effect",
                                   example="nvidia.com/gpu=true:NoSchedule"), scalar_ok=True)),
        "ssh": Field(NODE_SSH),
        "gpu": Field(NODE_GPU),
        "rdma_interfaces": Field(ListOf(Str(pattern=INTERFACE, expected="an interface name",
                                            example="ibp26s0"), scalar_ok=True)),
        # Both become label values on the Node (bootstrap.checks.providers).
        "provider": Field(Str(validator=label_value_error, expected="a provider name (a Kubernetes label value)",
                              example="lambda")),
        "region": Field(Str(validator=label_value_error, expected="a region name (a Kubernetes label value)",
                            example="us-east-1")),
        "trusted": Field(Bool()),
    },
    build=m.Node,
    checks=[_server_is_trusted],
)

LINK_LAYERS = ("infiniband", "ethernet")  # network.rdma.link_layer's values

RDMA = Record(
    fields={
        "mode": Field(Enum(("shared",), what="RDMA mode")),
        "interfaces": Field(ListOf(Str(pattern=INTERFACE, expected="an interface name",
                                       example="ibp26s0"), min_items=1, scalar_ok=True), required=True),
        "subnet": Field(Str(validator=cidr_error, example="192.168.100.0/24")),
        "resource_name": Field(Str(pattern=r"[a-z0-9.-]+/[a-z0-9_]+", expected="a resource name",
                                   example="rdma/rdma_shared_device_a")),
        "link_layer": Field(MapOf(Str(pattern=INTERFACE, expected="an interface name", example="ibp26s0"),
                                  Enum(LINK_LAYERS, what="link layer"))),
    },
    build=m.Rdma,
)

STORAGE = Record(
    fields={
        "default": Field(Enum(STORAGE_CLASSES, what="storage class")),
        "nfs": Field(Record(fields={
            "server": Field(Str(validator=host_error, example="10.0.0.5"), required=True),
            "share": Field(Str(pattern=r"/[A-Za-z0-9._/@+~-]*", expected="an exported path", example="/srv/nfs"),
                           required=True),
            "mount_options": Field(ListOf(Str(pattern=r"[A-Za-z0-9_.=,:/+-]+", expected="a mount option",
                                              example="nfsvers=4.1"), scalar_ok=True)),
        }, build=m.Nfs)),
        "longhorn_replicas": Field(Int(min=1, max=10)),
    },
    build=m.StorageSettings,
)

QUEUE = Record(
    fields={
        "name": Field(Str(pattern=DNS_LABEL, expected="a queue name", example="research"), required=True),
        "weight": Field(Int(min=1, max=65535)),
        "reclaimable": Field(Bool()),
    },
    build=m.Queue,
)

REGISTRY_AUTH = Record(
    # '$' for NGC's literal user name $oauthtoken; it lands in registries.yaml, written by a YAML dumper.
    fields={"username": Field(Str(pattern=r"[A-Za-z0-9._@+$-]+", expected="a registry user name",
                                  example="$oauthtoken")),
            **_secret_fields("password"), **_secret_fields("token")},
    build=_build_with_secrets(m.RegistryAuth, "password", "token"),
    checks=[_one_secret_source("password"), _one_secret_source("token")],
)

REGISTRIES = Record(
    fields={
        "mirrors": Field(MapOf(Str(pattern=REGISTRY_HOST, expected="a registry host", example="docker.io"),
                               ListOf(Str(validator=url_error, expected="an endpoint URL",
                                          example="https://mirror.example.com"), min_items=1, scalar_ok=True))),
        "auth": Field(MapOf(Str(pattern=r"[A-Za-z0-9.:-]+", expected="a registry host"), REGISTRY_AUTH)),
    },
    build=m.RegistrySettings,
)

IMAGES = Record(
    fields={
        "embedded_mirror": Field(Bool()),
        "mirror_registries": Field(ListOf(Str(pattern=REGISTRY_HOST, expected="a registry host",
                                              example="nvcr.io"), scalar_ok=True)),
        "prepull": Field(ListOf(Str(pattern=IMAGE_REF, expected="an image reference",
                                    example="nvcr.io/nvidia/pytorch:25.01-py3"), scalar_ok=True)),
    },
    build=m.ImageSettings,
)

VALIDATE = Record(
    fields={
        "gpu_pod": Field(Bool()),
        "image": Field(Str(pattern=IMAGE_REF, expected="an image reference")),
        "nccl": Field(Record(fields={"enabled": Field(Bool()), "min_busbw_gbps": Field(Number(min=0)),
                                     "image": Field(Str(pattern=IMAGE_REF, expected="an image reference")),
                                     "gpus_per_node": Field(Int(min=1, max=64))},
                             build=m.Nccl, shorthand=lambda v: {"enabled": v} if isinstance(v, bool) else None)),
        "timeout_s": Field(Int(min=10, max=7200)),
    },
    build=m.ValidateSettings,
)

INVENTORY = Record(
    fields={
        "cluster": Field(Str(pattern=DNS_LABEL, expected="a DNS label (lower-case letters, digits and '-')",
                             example="train-a"), required=True),
        "ssh": Field(SSH),
        "k3s": Field(K3S),
        "nodes": Field(ListOf(NODE, min_items=1), required=True),
        "gpu": Field(GPU),
        "network": Field(Record(fields={"rdma": Field(RDMA),
                                        "mode": Field(Enum(NETWORK_MODES, what="network mode"))},
                                build=m.NetworkSettings)),
        "storage": Field(STORAGE),
        "volcano": Field(Record(fields={"enabled": Field(Bool()), "queues": Field(ListOf(QUEUE))},
                                build=m.VolcanoSettings)),
        "registries": Field(REGISTRIES),
        "images": Field(IMAGES),
        "validate": Field(VALIDATE),
        "charts": Field(MapOf(Str(pattern="|".join(CHART_COMPONENTS), expected="a component name",
                                  example=", ".join(CHART_COMPONENTS)), CHART_PIN)),
        "state_dir": Field(Str(expected="a folder path", example="~/.local/state/bootstrap/train-a", unicode=True)),
    },
    build=m.Inventory,
)
