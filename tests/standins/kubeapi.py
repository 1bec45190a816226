"""Stand-in Kubernetes API server and cluster simulator, served by the k3s stand-in.

The k3s stand-in (k3s_standin.py) serves this on its supervisor port (6443) next to its
own endpoints, over HTTPS (k3s_pki.py), so the tool, kubectl and Helm reach it through the
same SSH tunnel, kubeconfig and TLS verification as a real cluster. The
builder (airgap.py) embeds this file into the built stand-in; Debian 12's python3 (3.11)
standard library only, threads, no third-party packages (HTTP/2 framing is h2serve.py's).

Contract (what the official client needs; details in each section):
  Auth       a client certificate signed by the cluster's client CA (k3s.yaml's system:admin,
             O system:masters); none is 401 on every API path, /version and /healthz too
             (k3s runs kube-apiserver with anonymous-auth=false: k3s-io/k3s
             pkg/daemons/control/server.go); a user outside system:masters is 403.
  Discovery  /version, /api, /api/v1, /apis, /apis/G, /apis/G/V (legacy discovery, JSON),
             /openapi/v3 (the index) and /openapi/v3/api/v1, /openapi/v3/apis/G/V (paths, verbs and
             query parameters, no schemas); no /openapi/v2 (kubectl asks for it as protobuf
             only when v3 is missing).
  Tables     GET with Accept "application/json;as=Table;v=v1;g=meta.k8s.io" (kubectl get):
             meta.k8s.io/v1 Table, the real printers' columns for Node, Pod, Namespace,
             Deployment, DaemonSet, ConfigMap, Secret; Name and Age for other kinds.
  Objects    GET (get, list, watch=true), POST (create), PUT (replace), PATCH (JSON patch,
             merge patch, strategic merge patch for built-in kinds, server-side apply); bodies
             in JSON, YAML, or protobuf for the kinds client-go's typed clients send (Secret,
             ConfigMap, Namespace, DeleteOptions: Helm's release storage, kubectl create),
             DELETE (one, collection) on the built-in kinds in BUILTIN below and on custom
             resources of every CustomResourceDefinition (k3s's own, the PRESETS, and any
             created through the API). Subresources: status (GET/PUT/PATCH), pods/log,
             pods/eviction, pods/binding, namespaces/finalize.
  Lists      kind "<Kind>List", metadata.resourceVersion; labelSelector (=, ==, !=, in,
             notin, exists, !exists), fieldSelector (any dotted field, = == !=); limit is
             accepted, everything comes in one page (no continue token).
  Watch      watch=true streams chunked JSON lines {"type", "object"} from resourceVersion
             (ADDED for the current objects when none is given; with sendInitialEvents=true
             those, then the initial-events-end BOOKMARK), until timeoutSeconds
             (default 60, at most 300); a resourceVersion older than the last 4096 changes
             gets one ERROR event with code 410 (the client then lists again).
  Errors     Status objects with the reasons and messages of the real API server
             (NotFound, AlreadyExists, Conflict, Invalid 422, BadRequest, Forbidden,
             MethodNotAllowed, UnsupportedMediaType).
  State      JSON in <data-dir>/server/standin-api.json (0600), written within ~0.5 s of a
             change and at exit; `k3s etcd-snapshot save` carries it, a restore puts it back.

The simulator (class Simulator, a thread ticking every 0.2 s) plays the controllers,
the scheduler and the kubelets of a small k3s cluster; its rules are in its docstring.
Exec, attach and port-forward (SPDY/websocket upgrades) are not served, nor protobuf
bodies of other kinds, nor protobuf replies (JSON goes back; client-go accepts it).

Knobs (environment of `k3s server`; defaults in brackets):
  K3S_STANDIN_API_PRESETS          CRDs present from the first start
                                   [volcano,multus,gpu-operator]; "none" for none
  K3S_STANDIN_DEVICE_PLUGIN        always | operator: see Simulator.gpu_operator_active
  K3S_STANDIN_NODE_GRACE [20]      seconds without heartbeats before a node is Unknown
  K3S_STANDIN_NODE_READY_SECONDS [1]  NotReady time after a node registers
  K3S_STANDIN_POD_START_SECONDS [0.3], K3S_STANDIN_POD_SECONDS [1]  pod start, run time
  K3S_STANDIN_MIG_SECONDS [1.5]    MIG manager: pending -> success/failed
(agents: K3S_STANDIN_HEARTBEAT [3] seconds between heartbeats, in k3s_standin.py)
"""

import base64
import collections
import copy
import datetime
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

K8S_VERSION_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)")


def env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def now_iso(t=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def parse_iso(text):
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def rand_suffix(n=5):
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def deep(obj, *path, default=None):
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return default
        obj = obj[key]
    return obj


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# =============================================================================
# YAML subset, for config files the tool writes into ConfigMaps (device plugin configs,
# mig-parted configs; PyYAML safe_dump output) and for server-side apply bodies sent as
# YAML. Block mappings and sequences (indented or not), flow [..] / {..} of scalars,
# plain and quoted scalars, literal/folded block scalars, comments, "---".
# =============================================================================

class YamlError(ValueError):
    pass


def _yaml_scalar(text):
    text = text.strip()
    if not text:
        return None
    if text[0] == '"':
        try:
            return json.loads(text)
        except ValueError:
            raise YamlError("bad double-quoted scalar: %s" % text)
    if text[0] == "'":
        if not text.endswith("'") or len(text) < 2:
            raise YamlError("bad single-quoted scalar: %s" % text)
        return text[1:-1].replace("''", "'")
    if text[0] in "[{":
        return _yaml_flow(text)
    if text in ("~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", text):
        return float(text)
    return text


def _split_flow(body):
    parts, depth, quote, current = [], 0, None, ""
    for ch in body:
        if quote:
            current += ch
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += ch
    if current.strip():
        parts.append(current)
    return parts


def _yaml_flow(text):
    text = text.strip()
    if text[0] == "[" and text.endswith("]"):
        return [_yaml_scalar(p) for p in _split_flow(text[1:-1])]
    if text[0] == "{" and text.endswith("}"):
        out = {}
        for part in _split_flow(text[1:-1]):
            key, sep, value = part.partition(":")
            if not sep:
                raise YamlError("bad flow mapping entry: %s" % part)
            out[_yaml_scalar(key)] = _yaml_scalar(value)
        return out
    raise YamlError("bad flow collection: %s" % text)


def _strip_yaml_comment(line):
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or line[i - 1] in " \t:-[{,"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


_KEY_RE = re.compile(r"""^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s'"#\[\]{},][^#]*?)\s*:(\s+|$)""")


def load_yaml(text):
    """One document of the subset above -> Python data."""
    raw = text.replace("\t", "    ").split("\n")
    lines = []
    for number, line in enumerate(raw):
        if line.strip() in ("---", "...") and not lines:
            continue
        lines.append(line)
    pos = [0]

    def content(i):
        while i < len(lines) and not _strip_yaml_comment(lines[i]).strip():
            i += 1
        return i

    def indent_of(line):
        return len(line) - len(line.lstrip(" "))

    def block_scalar(indicator, parent_indent):
        out, i = [], pos[0]
        block_indent = None
        while i < len(lines):
            line = lines[i]
            if line.strip() and indent_of(line) <= parent_indent:
                break
            if line.strip() and block_indent is None:
                block_indent = indent_of(line)
            out.append(line[block_indent:] if block_indent is not None and line.strip() else "")
            i += 1
        pos[0] = i
        while out and not out[-1]:
            out.pop()
        if indicator.startswith(">"):
            result = " ".join(out)
        else:
            result = "\n".join(out)
        return result + ("" if indicator.endswith("-") else "\n")

    def value_after(rest, indent):
        rest = _strip_yaml_comment(rest).strip()
        if rest in ("|", "|-", "|+", ">", ">-", ">+"):
            return block_scalar(rest, indent)
        if rest:
            return _yaml_scalar(rest)
        i = content(pos[0])
        if i >= len(lines):
            return None
        child = indent_of(lines[i])
        if child > indent or (child == indent and lines[i].lstrip().startswith("- ")) or \
                (child == indent and lines[i].strip() == "-"):
            pos[0] = i
            return node(child)
        return None

    def mapping(indent, first=None):
        out = {}
        while True:
            i = content(pos[0])
            if i >= len(lines) or indent_of(lines[i]) != indent or lines[i].lstrip().startswith("- "):
                break
            line = _strip_yaml_comment(lines[i])[indent:]
            m = _KEY_RE.match(line)
            if not m:
                raise YamlError("line %d: expected 'key: value'" % (i + 1))
            key = _yaml_scalar(m.group(1))
            pos[0] = i + 1
            out[key] = value_after(line[m.end():], indent)
        return out

    def sequence(indent):
        out = []
        while True:
            i = content(pos[0])
            if i >= len(lines) or indent_of(lines[i]) != indent:
                break
            stripped = lines[i].strip()
            if not (stripped.startswith("- ") or stripped == "-"):
                break
            rest = _strip_yaml_comment(lines[i])[indent + 1:]
            inner = rest.lstrip(" ")
            item_indent = indent + 1 + (len(rest) - len(inner))
            if not inner:
                pos[0] = i + 1
                out.append(value_after("", indent))
            elif _KEY_RE.match(inner) and inner[0] not in "[{":
                lines[i] = " " * item_indent + inner
                pos[0] = i
                out.append(mapping(item_indent))
            elif inner.startswith("- "):
                lines[i] = " " * item_indent + inner
                pos[0] = i
                out.append(sequence(item_indent))
            else:
                pos[0] = i + 1
                out.append(value_after(inner, indent))
        return out

    def node(indent):
        i = content(pos[0])
        pos[0] = i
        stripped = lines[i].strip()
        if stripped.startswith("- ") or stripped == "-":
            return sequence(indent)
        if _KEY_RE.match(_strip_yaml_comment(lines[i])[indent:]):
            return mapping(indent)
        pos[0] = i + 1
        return _yaml_scalar(_strip_yaml_comment(lines[i]))

    i = content(0)
    if i >= len(lines):
        return None
    pos[0] = i
    result = node(indent_of(lines[i]))
    if content(pos[0]) < len(lines):
        raise YamlError("line %d: unexpected content" % (content(pos[0]) + 1))
    return result


def load_json_or_yaml(text):
    try:
        return json.loads(text)
    except ValueError:
        return load_yaml(text)


# =============================================================================
# Quantities (cpu "500m", memory "1Gi", counts) and resource lists.
# =============================================================================

_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
           "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(value):
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY_RE.match(str(value).strip())
    if not m:
        raise ValueError("quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def pod_requests(spec):
    """Effective requests: max(sum of containers, each init container); extended resources
    (anything with a '/' or not cpu/memory) default their request to the limit."""
    def one(container):
        res = container.get("resources") or {}
        req = dict(res.get("requests") or {})
        for name, value in (res.get("limits") or {}).items():
            req.setdefault(name, value)
        out = {}
        for name, value in req.items():
            try:
                out[name] = parse_quantity(value)
            except ValueError:
                pass
        return out
    total = collections.Counter()
    for c in spec.get("containers") or []:
        total.update(one(c))
    for c in spec.get("initContainers") or []:
        for name, value in one(c).items():
            if value > total.get(name, 0):
                total[name] = value
    return {k: v for k, v in total.items() if v}


# =============================================================================
# Label and field selectors
# =============================================================================

def parse_label_selector(text):
    reqs = []
    if not text:
        return reqs
    for part in re.findall(r"(?:[^,(]|\([^)]*\))+", text):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if m:
            reqs.append((m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}))
            continue
        m = re.fullmatch(r"([^\s!=]+)\s*(==|!=|=)\s*(\S*)", part)
        if m:
            reqs.append((m.group(1), "!=" if m.group(2) == "!=" else "=", {m.group(3)}))
            continue
        m = re.fullmatch(r"(!?)([^\s!=]+)", part)
        if m:
            reqs.append((m.group(2), "!" if m.group(1) else "exists", set()))
            continue
        raise ApiError(400, "BadRequest", "unable to parse requirement: %s" % part)
    return reqs


def labels_match(reqs, labels):
    labels = labels or {}
    for key, op, values in reqs:
        have = key in labels
        value = labels.get(key)
        if op in ("=", "in") and (not have or value not in values):
            return False
        if op in ("!=", "notin") and have and value in values:
            return False
        if op == "exists" and not have:
            return False
        if op == "!" and have:
            return False
    return True


def selector_reqs(selector):
    """metav1.LabelSelector (matchLabels / matchExpressions) -> requirements; None: nothing."""
    if selector is None:
        return None
    reqs = [(k, "=", {v}) for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(expr.get("operator"))
        if op:
            reqs.append((expr.get("key"), op, set(expr.get("values") or [])))
    return reqs


def parse_field_selector(text):
    reqs = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(==|!=|=)\s*(.*)", part)
        if not m:
            raise ApiError(400, "BadRequest", "invalid selector: '%s'; can't understand '%s'" % (text, part))
        reqs.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return reqs


def field_value(obj, path):
    value = obj
    for key in path.split("."):
        if not isinstance(value, dict):
            return ""
        value = value.get(key)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fields_match(reqs, obj):
    return all((field_value(obj, path) == value) == equal for path, equal, value in reqs)


# =============================================================================
# Patches: RFC 6902 JSON patch, RFC 7386 merge patch, strategic merge patch (the list
# merge keys the tool's objects use; other lists are replaced), server-side apply.
# =============================================================================

MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
              "env": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "ports": "containerPort",
              "conditions": "type", "imagePullSecrets": "name", "hostAliases": "ip", "addresses": "type",
              "ownerReferences": "uid", "topologySpreadConstraints": "topologyKey"}
MERGE_SCALAR_LISTS = {"finalizers"}


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if key.startswith("$setElementOrder/"):
            continue
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(out.get(key), list):
            out[key] = _merge_list(out[key], value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in MERGE_SCALAR_LISTS and isinstance(out.get(key), list):
            out[key] = list(out[key]) + [v for v in value if v not in out[key]]
        else:
            merged = strategic_merge(out.get(key), value)
            if merged is None and isinstance(value, dict) and value.get("$patch") == "delete":
                out.pop(key, None)
            else:
                out[key] = merged
    if retain is not None:
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(current, patch, key):
    out = [copy.deepcopy(i) for i in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            if item not in out:
                out.append(copy.deepcopy(item))
            continue
        index = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is None:
            out.append({k: v for k, v in copy.deepcopy(item).items() if k != "$patch"})
        else:
            out[index] = strategic_merge(out[index], item)
    return out


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", "invalid JSON pointer %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc, ops):
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")

    def parent(parts):
        node = doc
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node[p]
        return node

    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                node = doc
                for p in parts:
                    node = node[int(p)] if isinstance(node, list) else node[p]
                if node != op.get("value"):
                    raise ApiError(422, "Invalid", "the server rejected our request due to an error in our "
                                   "request (testing value %s failed)" % op.get("path"))
                continue
            if kind in ("move", "copy"):
                src = _pointer(op.get("from", ""))
                node = doc
                for p in src:
                    node = node[int(p)] if isinstance(node, list) else node[p]
                value = copy.deepcopy(node)
                if kind == "move":
                    sp = parent(src)
                    if isinstance(sp, list):
                        sp.pop(int(src[-1]))
                    else:
                        del sp[src[-1]]
                kind, op = "add", {"value": value}
            target = parent(parts)
            last = parts[-1]
            if kind == "add":
                if isinstance(target, list):
                    target.insert(len(target) if last == "-" else int(last), copy.deepcopy(op.get("value")))
                else:
                    target[last] = copy.deepcopy(op.get("value"))
            elif kind == "replace":
                if isinstance(target, list):
                    target[int(last)] = copy.deepcopy(op.get("value"))
                else:
                    if last not in target:
                        raise KeyError(last)
                    target[last] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                if isinstance(target, list):
                    target.pop(int(last))
                else:
                    del target[last]
            else:
                raise ApiError(422, "Invalid", "Unexpected kind: %s" % kind)
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request: "
                           "jsonpatch %s operation does not apply: doc is missing path: \"%s\""
                           % (kind, op.get("path")))
    return doc


# =============================================================================
# Resources: the built-in kinds, k3s's own CRDs and the PRESETS (CRDs of add-ons the
# tool installs, present from the first start so their objects can be created; delete
# the CustomResourceDefinition to make a kind disappear).
# =============================================================================

class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(res, name):
    return ApiError(404, "NotFound", '%s "%s" not found' % (res.qualified, name),
                    {"name": name, "group": res.group, "kind": res.plural})


def invalid(res, name, causes):
    message = "%s \"%s\" is invalid: %s" % (res.kind, name, ", ".join(causes) if len(causes) == 1
                                            else "[" + ", ".join(causes) + "]")
    return ApiError(422, "Invalid", message, {"name": name, "group": res.group, "kind": res.kind,
                                              "causes": [{"message": c} for c in causes]})


class Res:
    def __init__(self, group, version, plural, kind, namespaced, status=False, short=(), crd=False, versions=None,
                 singular=None):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced, self.status, self.short, self.crd = namespaced, status, tuple(short), crd
        self.versions = list(versions or [version])
        self.singular = singular or kind.lower()

    @property
    def qualified(self):
        return "%s.%s" % (self.plural, self.group) if self.group else self.plural

    @property
    def key(self):
        return (self.group, self.plural)

    def api_version(self, version=None):
        version = version or self.version
        return "%s/%s" % (self.group, version) if self.group else version


def _r(gv, plural, kind, namespaced, status=False, short=()):
    group, _, version = gv.rpartition("/")
    return Res(group, version, plural, kind, namespaced, status, short)


BUILTIN = [
    _r("v1", "namespaces", "Namespace", False, True, ["ns"]),
    _r("v1", "nodes", "Node", False, True, ["no"]),
    _r("v1", "pods", "Pod", True, True, ["po"]),
    _r("v1", "configmaps", "ConfigMap", True, False, ["cm"]),
    _r("v1", "secrets", "Secret", True),
    _r("v1", "services", "Service", True, True, ["svc"]),
    _r("v1", "endpoints", "Endpoints", True, False, ["ep"]),
    _r("v1", "serviceaccounts", "ServiceAccount", True, False, ["sa"]),
    _r("v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, True, ["pvc"]),
    _r("v1", "persistentvolumes", "PersistentVolume", False, True, ["pv"]),
    _r("v1", "events", "Event", True, False, ["ev"]),
    _r("v1", "resourcequotas", "ResourceQuota", True, True, ["quota"]),
    _r("v1", "limitranges", "LimitRange", True, False, ["limits"]),
    _r("v1", "replicationcontrollers", "ReplicationController", True, True, ["rc"]),
    _r("v1", "podtemplates", "PodTemplate", True),
    _r("apps/v1", "deployments", "Deployment", True, True, ["deploy"]),
    _r("apps/v1", "daemonsets", "DaemonSet", True, True, ["ds"]),
    _r("apps/v1", "statefulsets", "StatefulSet", True, True, ["sts"]),
    _r("apps/v1", "replicasets", "ReplicaSet", True, True, ["rs"]),
    _r("apps/v1", "controllerrevisions", "ControllerRevision", True),
    _r("batch/v1", "jobs", "Job", True, True),
    _r("batch/v1", "cronjobs", "CronJob", True, True, ["cj"]),
    _r("storage.k8s.io/v1", "storageclasses", "StorageClass", False, False, ["sc"]),
    _r("storage.k8s.io/v1", "csidrivers", "CSIDriver", False),
    _r("storage.k8s.io/v1", "csinodes", "CSINode", False),
    _r("storage.k8s.io/v1", "volumeattachments", "VolumeAttachment", False, True),
    _r("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    _r("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    _r("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    _r("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _r("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False, True, ["crd", "crds"]),
    _r("events.k8s.io/v1", "events", "Event", True, False, ["ev"]),
    _r("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True, ["pdb"]),
    _r("coordination.k8s.io/v1", "leases", "Lease", True),
    _r("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, False, ["pc"]),
    _r("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    _r("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, False, ["netpol"]),
    _r("networking.k8s.io/v1", "ingresses", "Ingress", True, True, ["ing"]),
    _r("networking.k8s.io/v1", "ingressclasses", "IngressClass", False),
    _r("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False),
    _r("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    _r("apiregistration.k8s.io/v1", "apiservices", "APIService", False, True),
]

# (group, versions (first is the storage version), plural, kind, namespaced, status, short names)
K3S_CRDS = [
    ("helm.cattle.io", ["v1"], "helmcharts", "HelmChart", True, True, []),
    ("helm.cattle.io", ["v1"], "helmchartconfigs", "HelmChartConfig", True, False, []),
    ("k3s.cattle.io", ["v1"], "addons", "Addon", True, False, []),
    ("k3s.cattle.io", ["v1"], "etcdsnapshotfiles", "ETCDSnapshotFile", False, True, []),
]
PRESETS = {
    "volcano": [
        ("batch.volcano.sh", ["v1alpha1"], "jobs", "Job", True, True, ["vcjob", "vj"]),
        ("bus.volcano.sh", ["v1alpha1"], "commands", "Command", True, False, []),
        ("scheduling.volcano.sh", ["v1beta1"], "queues", "Queue", False, True, ["q", "queue-v1beta1"]),
        ("scheduling.volcano.sh", ["v1beta1"], "podgroups", "PodGroup", True, True, ["pg", "podgroup-v1beta1"]),
    ],
    "multus": [
        ("k8s.cni.cncf.io", ["v1"], "network-attachment-definitions", "NetworkAttachmentDefinition", True, False,
         ["net-attach-def"]),
    ],
    "gpu-operator": [
        ("nvidia.com", ["v1"], "clusterpolicies", "ClusterPolicy", False, True, []),
        ("nvidia.com", ["v1alpha1"], "nvidiadrivers", "NVIDIADriver", False, True, ["nvd", "nvdriver"]),
    ],
}
DEFAULT_PRESETS = "volcano,multus,gpu-operator"


def crd_object(group, versions, plural, kind, namespaced, status, short):
    names = {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": kind + "List"}
    if short:
        names["shortNames"] = list(short)
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "%s.%s" % (plural, group)},
        "spec": {"group": group, "names": names, "scope": "Namespaced" if namespaced else "Cluster",
                 "versions": [{"name": v, "served": True, "storage": i == 0,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}},
                               **({"subresources": {"status": {}}} if status else {})}
                              for i, v in enumerate(versions)]},
    }


def res_from_crd(crd):
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not (spec.get("group") and names.get("plural") and names.get("kind") and versions):
        return None
    storage = next((v["name"] for v in versions if v.get("storage")), versions[0]["name"])
    status = any("status" in (v.get("subresources") or {}) for v in versions)
    res = Res(spec["group"], storage, names["plural"], names["kind"], spec.get("scope") != "Cluster", status,
              names.get("shortNames") or (), crd=True, versions=[v["name"] for v in versions],
              singular=names.get("singular"))
    return res


# =============================================================================
# Object store: one lock, a resourceVersion counter, a ring of recent changes (watch).
# =============================================================================

class Store:
    def __init__(self):
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects = {}  # (group, plural) -> {(namespace, name): object}
        self.rv = 1
        self.events = collections.deque(maxlen=4096)  # (rv, type, (group, plural), object)
        self.dirty = False
        self.logs = {}  # "ns/pod/container" -> text
        self.volumes = {}  # volume id -> {path: text}
        self.sim = {}  # simulator memory that must survive restarts

    def table(self, res):
        return self.objects.setdefault(res.key, {})

    def get(self, res, ns, name):
        return self.objects.get(res.key, {}).get((ns or "", name))

    def items(self, res, ns=None):
        table = self.objects.get(res.key, {})
        return [o for (n, _), o in sorted(table.items()) if ns is None or n == (ns or "")]

    def put(self, res, obj, etype="MODIFIED"):
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            self.table(res)[key] = obj
            if res.key == ("", "nodes"):
                self.count_cordoned()
            self.events.append((self.rv, etype, res.key, copy.deepcopy(obj)))
            self.dirty = True
            self.changed.notify_all()
            return obj

    def count_cordoned(self):
        """For tests of rolling upgrades: the most nodes ever cordoned at once (sim
        "max_cordoned", in the saved state) and the order nodes were cordoned in."""
        cordoned = sorted(n for (_, n), o in self.objects.get(("", "nodes"), {}).items()
                          if (o.get("spec") or {}).get("unschedulable"))
        self.sim["max_cordoned"] = max(self.sim.get("max_cordoned", 0), len(cordoned))
        order = self.sim.setdefault("cordon_order", [])
        for name in cordoned:
            if name not in self.sim.setdefault("cordoned_now", []):
                order.append(name)
        self.sim["cordoned_now"] = cordoned

    def remove(self, res, ns, name):
        with self.lock:
            obj = self.table(res).pop((ns or "", name), None)
            if obj is None:
                return None
            self.rv += 1
            gone = copy.deepcopy(obj)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            self.events.append((self.rv, "DELETED", res.key, gone))
            self.dirty = True
            self.changed.notify_all()
            return gone

    def dump(self):
        with self.lock:
            return {"format": 1, "rv": self.rv,
                    "objects": {"%s/%s" % k: list(t.values()) for k, t in self.objects.items() if t},
                    "logs": dict(self.logs), "volumes": copy.deepcopy(self.volumes), "sim": copy.deepcopy(self.sim)}

    def load(self, data):
        with self.lock:
            self.rv = int(data.get("rv", 1))
            self.objects = {}
            for key, items in (data.get("objects") or {}).items():
                group, _, plural = key.rpartition("/")
                table = self.objects.setdefault((group, plural), {})
                for obj in items:
                    table[(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
            self.logs = dict(data.get("logs") or {})
            self.volumes = dict(data.get("volumes") or {})
            self.sim = dict(data.get("sim") or {})


# =============================================================================
# Validation (the checks of the real API server that catch a client's mistakes) and
# defaulting (what admission and the registry add on create).
# =============================================================================

SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
CONFIG_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
DNS_LABEL_KINDS = {"Namespace", "Service"}
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                 "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
                 "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
             "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
             "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
QNAME_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
             "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
             "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def qualified_name_errors(field, key):
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and (len(prefix) > 253 or not SUBDOMAIN_RE.match(prefix)):
        errors.append('%s: Invalid value: "%s": prefix part %s' % (field, key, SUBDOMAIN_MSG))
    if not name or len(name) > 63 or not QUALIFIED_NAME_RE.match(name):
        errors.append('%s: Invalid value: "%s": %s' % (field, key, QNAME_MSG))
    return errors


def validate_object(res, obj, old=None):
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    errors = []
    if res.kind == "CustomResourceDefinition":
        spec = obj.get("spec") or {}
        want = "%s.%s" % (deep(spec, "names", "plural", default=""), spec.get("group", ""))
        if name != want:
            errors.append('metadata.name: Invalid value: "%s": must be spec.names.plural+"."+spec.group' % name)
    elif res.kind in DNS_LABEL_KINDS:
        if len(name) > 63 or not DNS_LABEL_RE.match(name):
            errors.append('metadata.name: Invalid value: "%s": %s' % (name, LABEL_MSG))
    else:
        if len(name) > 253 or not SUBDOMAIN_RE.match(name):
            errors.append('metadata.name: Invalid value: "%s": %s' % (name, SUBDOMAIN_MSG))
    for key, value in (meta.get("labels") or {}).items():
        errors += qualified_name_errors("metadata.labels", key)
        if not isinstance(value, str):
            raise ApiError(400, "BadRequest", "json: cannot unmarshal %s into Go struct field ObjectMeta.metadata."
                           "labels of type string" % type(value).__name__)
        if len(value) > 63 or not LABEL_VALUE_RE.match(value):
            errors.append('metadata.labels: Invalid value: "%s": %s' % (value, VALUE_MSG))
    for key, value in (meta.get("annotations") or {}).items():
        errors += qualified_name_errors("metadata.annotations", key)
        if not isinstance(value, str):
            raise ApiError(400, "BadRequest", "json: cannot unmarshal %s into Go struct field ObjectMeta.metadata."
                           "annotations of type string" % type(value).__name__)
    kind = res.kind if not res.crd else None
    if kind == "ConfigMap" or kind == "Secret":
        for field in ("data", "stringData", "binaryData"):
            for key, value in (obj.get(field) or {}).items():
                if not CONFIG_KEY_RE.match(key):
                    errors.append('%s[%s]: Invalid value: "%s": a valid config key must consist of alphanumeric '
                                  "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or "
                                  "'key-name', regex used for validation is '[-._a-zA-Z0-9]+')" % (field, key, key))
                if not isinstance(value, str):
                    raise ApiError(400, "BadRequest", "json: cannot unmarshal %s into Go struct field %s.%s of "
                                   "type string" % (type(value).__name__, res.kind, field))
        if kind == "Secret":
            for key, value in (obj.get("data") or {}).items():
                try:
                    base64.b64decode(value, validate=True)
                except ValueError:
                    raise ApiError(400, "BadRequest", "illegal base64 data at input byte 0 (Secret data[%s])" % key)
    elif kind == "Pod":
        spec = obj.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            errors.append("spec.containers: Required value")
        seen = set()
        for i, c in enumerate(containers + (spec.get("initContainers") or [])):
            where = "spec.containers[%d]" % i
            if not c.get("name"):
                errors.append("%s.name: Required value" % where)
            elif c["name"] in seen:
                errors.append('%s.name: Duplicate value: "%s"' % (where, c["name"]))
            seen.add(c.get("name"))
            if not c.get("image"):
                errors.append("%s.image: Required value" % where)
            for rname, value in list(((c.get("resources") or {}).get("requests") or {}).items()) + \
                    list(((c.get("resources") or {}).get("limits") or {}).items()):
                try:
                    parse_quantity(value)
                except ValueError as exc:
                    errors.append('%s.resources[%s]: Invalid value: "%s": %s' % (where, rname, value, exc))
        if spec.get("restartPolicy") not in (None, "Always", "OnFailure", "Never"):
            errors.append('spec.restartPolicy: Unsupported value: "%s": supported values: "Always", "OnFailure", '
                          '"Never"' % spec.get("restartPolicy"))
        if old is not None:
            for field in ("containers", "nodeName", "volumes", "restartPolicy"):
                mutable = field == "nodeName" and not deep(old, "spec", "nodeName")
                if not mutable and canonical(deep(old, "spec", field)) != canonical(spec.get(field)) and \
                        field != "containers":
                    errors.append("spec: Forbidden: pod updates may not change fields other than "
                                  "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                                  "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                                  "tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 "
                                  "if it was previously negative)")
                    break
    elif kind == "Node":
        for i, taint in enumerate(deep(obj, "spec", "taints", default=[]) or []):
            if not taint.get("key"):
                errors.append("spec.taints[%d].key: Required value" % i)
            else:
                errors += qualified_name_errors("spec.taints[%d].key" % i, taint["key"])
            if taint.get("effect") not in TAINT_EFFECTS:
                errors.append('spec.taints[%d].effect: Unsupported value: "%s": supported values: "NoSchedule", '
                              '"PreferNoSchedule", "NoExecute"' % (i, taint.get("effect")))
    elif kind == "StorageClass":
        if not obj.get("provisioner"):
            errors.append("provisioner: Required value")
        if old is not None:
            for field in ("provisioner", "parameters", "reclaimPolicy", "volumeBindingMode"):
                if canonical(old.get(field)) != canonical(obj.get(field)):
                    errors.append("%s: Forbidden: updates to %s are forbidden." % (field, field))
    elif kind == "PersistentVolumeClaim":
        spec = obj.get("spec") or {}
        if not spec.get("accessModes"):
            errors.append("spec.accessModes: Required value: at least 1 access mode is required")
        if not deep(spec, "resources", "requests", "storage"):
            errors.append("spec.resources[storage]: Required value")
        if old is not None:
            a = {k: v for k, v in (old.get("spec") or {}).items() if k not in ("resources", "volumeName")}
            b = {k: v for k, v in spec.items() if k not in ("resources", "volumeName")}
            if canonical(a) != canonical(b):
                errors.append("spec: Forbidden: spec is immutable after creation except resources.requests and "
                              "volumeAttributesClassName for bound claims")
    elif kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        spec = obj.get("spec") or {}
        if not deep(spec, "template", "spec", "containers"):
            errors.append("spec.template.spec.containers: Required value")
        if kind != "Job" and spec.get("selector") is None:
            errors.append("spec.selector: Required value")
        if kind == "Job" and deep(spec, "template", "spec", "restartPolicy") not in ("Never", "OnFailure"):
            errors.append('spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"')
        reqs = selector_reqs(spec.get("selector"))
        if reqs and not labels_match(reqs, deep(spec, "template", "metadata", "labels", default={})):
            errors.append("spec.template.metadata.labels: Invalid value: %s: `selector` does not match template "
                          "`labels`" % json.dumps(deep(spec, "template", "metadata", "labels", default={})))
    if errors:
        raise invalid(res, name, errors)


def qos_class(spec):
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    any_set, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and parse_quantity(req[r]) != parse_quantity(lim[r])):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_pod(pod):
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        image = c.get("image", "")
        tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
        c.setdefault("imagePullPolicy", "IfNotPresent" if tagged and not image.endswith(":latest") else "Always")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
        res = c["resources"]
        if res.get("limits") and not res.get("requests"):
            res["requests"] = dict(res["limits"])
        elif res.get("limits"):
            for k, v in res["limits"].items():
                res["requests"].setdefault(k, v)
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300})
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


class Disconnect(Exception):
    """The client went away while we were streaming."""


# =============================================================================
# The API: requests from the k3s stand-in's HTTP handler (same port as the supervisor
# endpoints), verbs on the store, discovery, watch and pod logs.
# =============================================================================

HEALTH_PATHS = ("/healthz", "/livez", "/readyz")
# Aggregated discovery (KEP-3352; beta, on by default, from Kubernetes 1.27, GA in 1.30): a
# client that asks for it in its Accept header (client-go sends AcceptV2 first:
# kubernetes v1.33.0 staging/src/k8s.io/client-go/discovery/discovery_client.go,
# acceptDiscoveryFormats) gets every group, version and resource from /api and /apis in one
# answer each, instead of one request per group-version; the client knows the answer by its
# Content-Type's g, v and as parameters (same file, isGVK; aggregated_discovery.go turns the
# items back into APIResourceLists). Server side: kubernetes v1.33.0
# staging/src/k8s.io/apiserver/pkg/endpoints/discovery/aggregated/handler.go. Helm and kubectl
# pay two requests for discovery on a real cluster; the stand-in must not charge them more.
AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_FROM_MINOR = 27


def wants_aggregated_discovery(accept):
    """Whether an Accept header lists the v2 APIGroupDiscoveryList media type (any order of
    its parameters, others such as profile=nopeer allowed)."""
    for media_range in (accept or "").split(","):
        kind, _, rest = media_range.strip().partition(";")
        params = dict(p.strip().partition("=")[::2] for p in rest.split(";") if "=" in p)
        if kind.strip() == "application/json" and params.get("g") == "apidiscovery.k8s.io" and \
                params.get("v") == "v2" and params.get("as") == "APIGroupDiscoveryList":
            return True
    return False
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")  # strconv.ParseBool, as the API server reads ?watch=
STATE_FILE = "standin-api.json"


def read_state(server_dir):
    """The persisted API state (for `k3s etcd-snapshot save`), or None."""
    try:
        with open(os.path.join(server_dir, STATE_FILE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_json_file(path, data, mode=0o600):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, separators=(",", ":"))
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_state(server_dir, data):
    write_json_file(os.path.join(server_dir, STATE_FILE), data)


def client_identity(handler):
    """(user, groups) of the verified client certificate on the request's TLS connection,
    or None: the x509 authenticator takes the CN as the user, the O values as groups."""
    getpeercert = getattr(handler.connection, "getpeercert", None)
    cert = getpeercert() if getpeercert else None
    if not cert:
        return None
    fields = [item for rdn in cert.get("subject", ()) for item in rdn]
    user = next((v for k, v in fields if k == "commonName"), None)
    return (user, [v for k, v in fields if k == "organizationName"]) if user else None


class KubeAPI:
    def __init__(self, server_dir, version, node_name=None, cluster=None, options=None):
        self.server_dir = server_dir
        self.version = version
        self.node_name = node_name
        self.cluster = cluster  # adapter: records() -> {name: join record}; etcd_removed(name)
        self.options = dict(options or {})
        self.store = Store()
        self._res_cache = (None, None)
        self.started = time.time()
        self.stopping = threading.Event()
        self.save_lock = threading.Lock()
        self.sim = Simulator(self)

    # -- lifecycle -------------------------------------------------------------
    def start(self):
        data = read_state(self.server_dir)
        if data:
            self.store.load(data)
        self.sim.bootstrap(first=not data)
        self.save()
        threading.Thread(target=self._saver, name="kubeapi-saver", daemon=True).start()
        self.sim.start()
        return self

    def stop(self):
        self.stopping.set()
        self.save()

    def save(self):
        with self.save_lock:  # one writer at a time, so an older dump never lands after a newer one
            with self.store.lock:
                data = self.store.dump()
                self.store.dirty = False
            write_state(self.server_dir, data)

    def _saver(self):
        while not self.stopping.wait(0.5):
            if self.store.dirty:
                try:
                    self.save()
                except OSError:
                    pass

    # -- registry --------------------------------------------------------------
    CRD = next(r for r in BUILTIN if r.kind == "CustomResourceDefinition")

    def resources(self):
        crds = self.store.objects.get(self.CRD.key, {})
        marker = canonical([(k, o["metadata"].get("resourceVersion")) for k, o in sorted(crds.items())])
        if self._res_cache[0] != marker:
            out = list(BUILTIN)
            for crd in crds.values():
                if deep(crd, "metadata", "deletionTimestamp"):
                    continue
                res = res_from_crd(crd)
                if res:
                    out.append(res)
            self._res_cache = (marker, out)
        return self._res_cache[1]

    def find(self, group, version, plural):
        for res in self.resources():
            if res.group == group and res.plural == plural and version in res.versions:
                return res
        return None

    def by_kind(self, kind, group=""):
        for res in self.resources():
            if res.kind == kind and res.group == group:
                return res
        raise KeyError(kind)

    def R(self, plural, group=""):
        for res in self.resources():
            if res.plural == plural and res.group == group:
                return res
        raise KeyError(plural)

    # -- output ----------------------------------------------------------------
    def out(self, res, obj, version=None):
        obj = copy.deepcopy(obj)
        obj["apiVersion"] = res.api_version(version if version in res.versions else None)
        obj["kind"] = res.kind
        return {"apiVersion": obj.pop("apiVersion"), "kind": obj.pop("kind"), **obj}

    # -- verbs (store lock held by callers through these methods) -------------
    def ns_check(self, res, ns, creating=False):
        if not res.namespaced:
            return
        nsres = self.R("namespaces")
        namespace = self.store.get(nsres, "", ns)
        if namespace is None:
            raise not_found(nsres, ns)
        if creating and deep(namespace, "status", "phase") == "Terminating":
            raise ApiError(403, "Forbidden", '%s "%s" is forbidden: unable to create new content in namespace %s '
                           "because it is being terminated" % (res.qualified, "", ns),
                           {"kind": res.plural, "group": res.group, "causes": [
                               {"reason": "NamespaceTerminating", "field": "metadata.namespace", "message":
                                "namespace is being terminated"}]})

    def create(self, res, ns, body, dry_run=False, version=None, internal=False):
        with self.store.lock:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if meta is None:
                meta = obj["metadata"] = {}
            want_kind, want_api = obj.get("kind"), obj.get("apiVersion")
            if want_api and want_api != res.api_version(version):
                raise ApiError(400, "BadRequest", "the API version in the data (%s) does not match the expected "
                               "API version (%s)" % (want_api, res.api_version(version)))
            if want_kind and want_kind != res.kind:
                raise ApiError(400, "BadRequest", '%s in version "%s" cannot be handled as a %s: no kind "%s" is '
                               'registered for version "%s"' % (want_kind, version, res.kind, want_kind,
                                                                res.api_version(version)))
            obj.pop("apiVersion", None)
            obj.pop("kind", None)
            if res.namespaced:
                body_ns = meta.get("namespace")
                if body_ns and ns and body_ns != ns:
                    raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                                   "namespace sent on the request")
                ns = ns or body_ns or "default"
                meta["namespace"] = ns
                self.ns_check(res, ns, creating=True)
            else:
                meta.pop("namespace", None)
                ns = ""
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = meta["generateName"] + rand_suffix()
                else:
                    raise invalid(res, "", ["metadata.name: Required value: name or generateName is required"])
            name = meta["name"]
            if self.store.get(res, ns, name) is not None:
                raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (res.qualified, name),
                               {"name": name, "group": res.group, "kind": res.plural})
            if res.status and res.kind not in ("Node",) and not internal:
                obj.pop("status", None)
            validate_object(res, obj)
            for key in ("resourceVersion", "deletionTimestamp", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            self.admit(res, ns, obj)
            if "spec" in obj or res.crd:
                meta["generation"] = 1
            if dry_run:
                return self.out(res, obj, version)
            self.store.put(res, obj, "ADDED")
            self.sim.created(res, obj)
            return self.out(res, obj, version)

    def admit(self, res, ns, obj):
        """Defaults and admission (what the API server's plugins and webhooks do)."""
        kind = None if res.crd else res.kind
        meta = obj["metadata"]
        if kind == "Pod":
            default_pod(obj)
            sa = obj["spec"]["serviceAccountName"]
            if sa != "default" and self.store.get(self.R("serviceaccounts"), ns, sa) is None:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: error looking up service account %s/%s: '
                               'serviceaccount "%s" not found' % (meta.get("name"), ns, sa, sa))
            # kubernetes plugin/pkg/admission/runtimeclass/admission.go (Admit): a pod naming
            # a RuntimeClass that does not exist is refused at creation.
            rc_name = obj["spec"].get("runtimeClassName")
            if rc_name and self.store.get(self.R("runtimeclasses", "node.k8s.io"), "", rc_name) is None:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: pod rejected: RuntimeClass "%s" not found'
                               % (meta.get("name"), rc_name))
            claims = [v["persistentVolumeClaim"]["claimName"] for v in obj["spec"].get("volumes") or []
                      if v.get("persistentVolumeClaim")]
            for claim in claims:
                pvc = self.store.get(self.R("persistentvolumeclaims"), ns, claim)
                if pvc is not None and deep(pvc, "metadata", "deletionTimestamp"):
                    raise ApiError(400, "BadRequest", 'persistentvolumeclaim "%s" is being deleted' % claim)
        elif kind == "Namespace":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = {"phase": "Active"}
        elif kind == "Secret":
            obj.setdefault("type", "Opaque")
            string_data = obj.pop("stringData", None) or {}
            if string_data:
                data = obj.setdefault("data", {})
                for key, value in string_data.items():
                    data[key] = base64.b64encode(str(value).encode()).decode()
        elif kind == "Service":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if spec.get("clusterIP") != "None":
                spec.setdefault("clusterIP", self.sim.allocate_service_ip())
                spec["clusterIPs"] = [spec["clusterIP"]]
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
            obj["status"] = {"loadBalancer": {}}
        elif kind == "PersistentVolumeClaim":
            spec = obj.setdefault("spec", {})
            spec.setdefault("volumeMode", "Filesystem")
            if "storageClassName" not in spec:
                default = self.sim.default_storage_class()
                if default:
                    spec["storageClassName"] = default
            meta.setdefault("finalizers", [])
            if "kubernetes.io/pvc-protection" not in meta["finalizers"]:
                meta["finalizers"].append("kubernetes.io/pvc-protection")
            obj["status"] = {"phase": "Pending"}
        elif kind == "PersistentVolume":
            spec = obj.setdefault("spec", {})
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
            spec.setdefault("volumeMode", "Filesystem")
            meta.setdefault("finalizers", ["kubernetes.io/pv-protection"])
            obj["status"] = {"phase": "Bound" if spec.get("claimRef") else "Available"}
        elif kind == "StorageClass":
            obj.setdefault("reclaimPolicy", "Delete")
            obj.setdefault("volumeBindingMode", "Immediate")
        elif kind in ("Deployment", "StatefulSet", "ReplicaSet"):
            obj["spec"].setdefault("replicas", 1)
            obj["status"] = {}
        elif kind == "DaemonSet":
            obj["status"] = {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                             "numberReady": 0}
        elif kind == "Job":
            spec = obj["spec"]
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            uid_label = meta["uid"]
            labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
            labels.update({"batch.kubernetes.io/job-name": meta["name"], "job-name": meta["name"]})
            if spec.get("selector") is None:
                spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid_label}}
                labels.update({"batch.kubernetes.io/controller-uid": uid_label, "controller-uid": uid_label})
            meta.setdefault("labels", {}).update({k: v for k, v in labels.items() if "controller-uid" in k or
                                                 "job-name" in k})
            obj["status"] = {}
        elif kind == "CustomResourceDefinition":
            spec = obj.get("spec") or {}
            obj["status"] = {"acceptedNames": spec.get("names", {}), "storedVersions": [
                v["name"] for v in spec.get("versions") or [] if v.get("storage")],
                "conditions": [{"type": t, "status": "True", "reason": r, "message": m,
                                "lastTransitionTime": now_iso()} for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]}
        elif res.group == "batch.volcano.sh" and res.plural == "jobs":
            self.sim.admit_vcjob(ns, obj)
        elif res.group == "scheduling.volcano.sh" and res.plural == "queues":
            obj.setdefault("spec", {}).setdefault("weight", 1)
            obj["spec"].setdefault("reclaimable", True)
            obj["status"] = {"state": "Open"}
        elif res.group == "scheduling.volcano.sh" and res.plural == "podgroups":
            obj["status"] = {"phase": "Pending"}

    def get(self, res, ns, name, version=None):
        with self.store.lock:
            obj = self.store.get(res, ns, name)
            if obj is None:
                raise not_found(res, name)
            return self.out(res, obj, version)

    def list(self, res, ns, query, version=None):
        with self.store.lock:
            reqs = parse_label_selector(query.get("labelSelector"))
            freqs = parse_field_selector(query.get("fieldSelector"))
            items = []
            for obj in self.store.items(res, ns):
                if labels_match(reqs, deep(obj, "metadata", "labels")) and fields_match(freqs, obj):
                    item = copy.deepcopy(obj)
                    if res.crd:
                        item = self.out(res, item, version)
                    items.append(item)
            return {"kind": res.kind + "List", "apiVersion": res.api_version(version),
                    "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}

    def update(self, res, ns, name, body, subresource=None, dry_run=False, version=None, check_rv=True,
               internal=False):
        with self.store.lock:
            old = self.store.get(res, ns, name)
            if old is None:
                raise not_found(res, name)
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
            obj = copy.deepcopy(body)
            obj.pop("apiVersion", None)
            obj.pop("kind", None)
            meta = obj.setdefault("metadata", {}) or {}
            obj["metadata"] = meta
            if meta.get("name") not in (None, name):
                raise ApiError(400, "BadRequest", "the name of the object (%s) does not match the name on the URL "
                               "(%s)" % (meta.get("name"), name))
            rv = meta.get("resourceVersion")
            if check_rv and rv and rv != old["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the object has been '
                               "modified; please apply your changes to the latest version and try again"
                               % (res.qualified, name), {"name": name, "group": res.group, "kind": res.plural})
            if subresource == "status":
                new = copy.deepcopy(old)
                new["status"] = obj.get("status", {})
            elif subresource == "finalize" and res.kind == "Namespace":
                new = copy.deepcopy(old)
                new["spec"] = obj.get("spec", {})
            else:
                new = obj
                if res.status and not internal:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                            "generation"):
                    if key in old["metadata"]:
                        meta[key] = old["metadata"][key]
                    else:
                        meta.pop(key, None)
                meta["name"] = name
                if res.namespaced:
                    meta["namespace"] = ns
                if res.kind == "Secret" and not res.crd:
                    string_data = new.pop("stringData", None) or {}
                    for key, value in string_data.items():
                        new.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()
                validate_object(res, new, old)
                if "generation" in old["metadata"] and canonical(old.get("spec")) != canonical(new.get("spec")):
                    meta["generation"] = old["metadata"]["generation"] + 1
            if dry_run:
                return self.out(res, new, version)
            if deep(new, "metadata", "deletionTimestamp") and not deep(new, "metadata", "finalizers") and \
                    res.kind != "Namespace":
                gone = self.store.remove(res, ns, name)
                self.sim.deleted(res, gone, "Background")
                return self.out(res, gone, version)
            if canonical({k: v for k, v in new.items() if k != "metadata"}) == canonical(
                    {k: v for k, v in old.items() if k != "metadata"}) and canonical(
                    {k: v for k, v in new["metadata"].items() if k != "resourceVersion"}) == canonical(
                    {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}):
                return self.out(res, old, version)  # no-op writes keep the resourceVersion, as in the real API
            self.store.put(res, new)
            self.sim.updated(res, old, new)
            return self.out(res, new, version)

    def patch(self, res, ns, name, body, content_type, subresource=None, query=None, version=None):
        query = query or {}
        dry_run = query.get("dryRun") == "All"
        with self.store.lock:
            ctype = (content_type or "").split(";")[0].strip().lower()
            if ctype == "application/apply-patch+yaml":
                if not query.get("fieldManager"):
                    raise ApiError(400, "BadRequest", "PATCH %s: fieldManager is required for apply requests" % name)
                try:
                    patch = load_json_or_yaml(body.decode() if isinstance(body, bytes) else body)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise ApiError(400, "BadRequest", "error decoding YAML: %s" % exc)
                current = self.store.get(res, ns, name)
                if current is None:
                    if subresource:
                        raise not_found(res, name)
                    patch.setdefault("metadata", {})["name"] = name
                    created = self.create(res, ns, patch, dry_run, version)
                    return 201, created
                merged = merge_patch(current, {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")})
                return 200, self.update(res, ns, name, merged, subresource, dry_run, version, check_rv=False)
            try:
                patch = json.loads(body or b"null")
            except ValueError as exc:
                raise ApiError(400, "BadRequest", "error decoding patch: %s" % exc)
            current = self.store.get(res, ns, name)
            if current is None:
                raise not_found(res, name)
            current = copy.deepcopy(current)
            if ctype == "application/json-patch+json":
                new = json_patch(current, patch)
            elif ctype == "application/merge-patch+json":
                if not isinstance(patch, dict):
                    raise ApiError(400, "BadRequest", "json: cannot unmarshal into Go value of type map[string]interface {}")
                new = merge_patch(current, patch)
            elif ctype == "application/strategic-merge-patch+json":
                if res.crd:
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/json-patch+json, "
                                   "application/merge-patch+json, application/apply-patch+yaml")
                if not isinstance(patch, dict):
                    raise ApiError(400, "BadRequest", "json: cannot unmarshal into Go value of type map[string]interface {}")
                new = strategic_merge(current, patch)
            else:
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               "accepted media types include: application/json-patch+json, "
                               "application/merge-patch+json, application/apply-patch+yaml")
            rv = deep(patch, "metadata", "resourceVersion") if isinstance(patch, dict) else None
            if rv is None:
                new.setdefault("metadata", {})["resourceVersion"] = current["metadata"].get("resourceVersion")
            if subresource == "status":
                return 200, self.update(res, ns, name, new, "status", dry_run, version)
            if res.status:
                new["status"] = current.get("status")
                if new["status"] is None:
                    new.pop("status")
            return 200, self.update(res, ns, name, new, None, dry_run, version)

    def delete(self, res, ns, name, options=None, dry_run=False, version=None):
        options = options or {}
        with self.store.lock:
            obj = self.store.get(res, ns, name)
            if obj is None:
                raise not_found(res, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != obj["metadata"].get("uid"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": Precondition failed: UID '
                               "in precondition: %s, UID in object meta: %s" % (res.qualified, name, pre["uid"],
                                                                               obj["metadata"].get("uid")))
            if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": Precondition failed: '
                               "ResourceVersion in precondition: %s, ResourceVersion in object meta: %s"
                               % (res.qualified, name, pre["resourceVersion"], obj["metadata"].get("resourceVersion")))
            policy = options.get("propagationPolicy") or "Background"
            if dry_run:
                return self.out(res, obj, version)
            if obj["metadata"].get("finalizers") or (res.kind == "Namespace" and not res.crd):
                if not obj["metadata"].get("deletionTimestamp"):
                    new = copy.deepcopy(obj)
                    new["metadata"]["deletionTimestamp"] = now_iso()
                    new["metadata"]["deletionGracePeriodSeconds"] = 0
                    if res.kind == "Namespace" and not res.crd:
                        new["status"] = {"phase": "Terminating"}
                    self.store.put(res, new)
                    self.sim.terminating(res, new, policy)
                    obj = new
                return self.out(res, obj, version)
            gone = self.store.remove(res, ns, name)
            self.sim.deleted(res, gone, policy)
            if res.crd or res.kind == "Pod":
                if res.kind == "Pod":
                    gone["metadata"]["deletionTimestamp"] = now_iso()
                    gone["metadata"]["deletionGracePeriodSeconds"] = 0
                return self.out(res, gone, version)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": res.group, "kind": res.plural,
                                "uid": gone["metadata"].get("uid")}}

    # -- subresources ----------------------------------------------------------
    def evict(self, ns, name, body):
        pods = self.R("pods")
        with self.store.lock:
            pod = self.store.get(pods, ns, name)
            if pod is None:
                raise not_found(pods, name)
            phase = deep(pod, "status", "phase")
            if phase not in ("Succeeded", "Failed"):
                for pdb in self.store.items(self.R("poddisruptionbudgets", "policy"), ns):
                    reqs = selector_reqs(deep(pdb, "spec", "selector"))
                    if reqs is None or not labels_match(reqs, deep(pod, "metadata", "labels")):
                        continue
                    allowed, desired, healthy = self.sim.pdb_numbers(pdb)
                    if allowed < 1:
                        raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                       "disruption budget.", {"causes": [{"reason": "DisruptionBudget", "message":
                                       "The disruption budget %s needs %d healthy pods and has %d currently"
                                       % (pdb["metadata"]["name"], desired, healthy)}]})
            options = (body or {}).get("deleteOptions") or {}
            self.delete(pods, ns, name, options)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def bind(self, ns, name, body):
        pods = self.R("pods")
        with self.store.lock:
            pod = self.store.get(pods, ns, name)
            if pod is None:
                raise not_found(pods, name)
            if deep(pod, "spec", "nodeName"):
                raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on pods/binding "%s": pod %s is '
                               "already assigned to node \"%s\"" % (name, name, pod["spec"]["nodeName"]))
            target = deep(body or {}, "target", "name")
            if not target:
                raise invalid(pods, name, ["target.name: Required value"])
            self.sim.bind_pod(pod, target, by="binding")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def pod_log(self, ns, name, query):
        pods = self.R("pods")
        with self.store.lock:
            pod = self.store.get(pods, ns, name)
            if pod is None:
                raise not_found(pods, name)
            spec = pod.get("spec") or {}
            names = [c["name"] for c in spec.get("containers") or []]
            init_names = [c["name"] for c in spec.get("initContainers") or []]
            container = query.get("container")
            if not container:
                if len(names) != 1:
                    raise ApiError(400, "BadRequest", "a container name must be specified for pod %s, choose one "
                                   "of: [%s]%s" % (name, " ".join(names), " or one of the init containers: [%s]"
                                                   % " ".join(init_names) if init_names else ""))
                container = names[0]
            if container not in names + init_names:
                raise ApiError(400, "BadRequest", "container %s is not valid for pod %s" % (container, name))
            statuses = (deep(pod, "status", "containerStatuses", default=[]) or []) + \
                (deep(pod, "status", "initContainerStatuses", default=[]) or [])
            status = next((s for s in statuses if s.get("name") == container), None)
            waiting = deep(status or {}, "state", "waiting")
            if status is None or waiting:
                reason = (waiting or {}).get("reason") or ("PodInitializing" if init_names else "ContainerCreating")
                raise ApiError(400, "BadRequest", 'container "%s" in pod "%s" is waiting to start: %s'
                               % (container, name, reason))
            text = self.store.logs.get("%s/%s/%s" % (ns, name, container), "")
        lines = text.splitlines(True)
        if query.get("tailLines"):
            try:
                lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) > 0 else []
            except ValueError:
                pass
        if query.get("timestamps") in GO_TRUE:
            stamp = deep(status, "state", "running", "startedAt") or deep(status, "state", "terminated", "startedAt") \
                or now_iso()
            lines = ["%s %s" % (stamp.replace("Z", ".000000000Z"), line) for line in lines]
        return "".join(lines)

    # -- discovery -------------------------------------------------------------
    def discovery(self, parts):
        resources = self.resources()
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}
        groups = collections.OrderedDict()
        for res in resources:
            if res.group:
                versions = groups.setdefault(res.group, [])
                for v in res.versions:
                    if v not in versions:
                        versions.append(v)

        def group_doc(name):
            versions = groups[name]
            preferred = sorted(versions, key=version_priority)[0]
            return {"name": name, "versions": [{"groupVersion": "%s/%s" % (name, v), "version": v}
                                               for v in sorted(versions, key=version_priority)],
                    "preferredVersion": {"groupVersion": "%s/%s" % (name, preferred), "version": preferred}}
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc(g) for g in groups]}
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return dict(group_doc(parts[1]), kind="APIGroup", apiVersion="v1")
        if parts[0] == "api" and len(parts) == 2:
            group, version = "", parts[1]
        elif parts[0] == "apis" and len(parts) == 3:
            group, version = parts[1], parts[2]
        else:
            return None
        listed = [r for r in resources if r.group == group and version in r.versions]
        if not listed:
            return None
        out = []
        for r in listed:
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            entry = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                     "verbs": verbs}
            if r.short:
                entry["shortNames"] = list(r.short)
            out.append(entry)
            if r.status:
                out.append({"name": r.plural + "/status", "singularName": "", "namespaced": r.namespaced,
                            "kind": r.kind, "verbs": ["get", "patch", "update"]})
            if r.kind == "Pod" and not r.crd:
                out += [{"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
                        {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                         "version": "v1", "kind": "Eviction", "verbs": ["create"]},
                        {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                         "verbs": ["create"]}]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "%s/%s" % (group, version)
                if group else version, "resources": out}

    def aggregated_discovery(self, core):
        """/api (`core`) or /apis as an APIGroupDiscoveryList (apidiscovery.k8s.io/v2): the same
        groups, versions (preferred first) and resources as the per-group-version documents,
        subresources under their resource (client-go's aggregated_discovery.go turns them back
        into "plural/sub" entries)."""
        if core:
            groups = [("", ["v1"])]
        else:
            listed = self.discovery(["apis"])["groups"]
            groups = [(g["name"], [v["version"] for v in g["versions"]]) for g in listed]
        items = []
        for group, versions in groups:
            entries = []
            for version in versions:
                doc = self.discovery(["api", version] if not group else ["apis", group, version]) or {}
                entries.append({"version": version, "resources": aggregated_resources(group, version, doc),
                                "freshness": "Current"})
            items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": entries})
        return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
                "items": items}

    def serves_aggregated_discovery(self):
        m = K8S_VERSION_RE.match(self.version or "v1.33.5")
        return not m or int(m.group(2)) >= AGGREGATED_FROM_MINOR

    def openapi(self, parts):
        """/openapi/v3 (the index of group-versions) and one group-version's document."""
        resources = self.resources()
        gvs = sorted({("", v) if not r.group else (r.group, v) for r in resources for v in r.versions})
        if parts == ["openapi", "v3"]:
            index = {}
            for group, version in gvs:
                key = "api/%s" % version if not group else "apis/%s/%s" % (group, version)
                doc = json.dumps(openapi_v3_doc(resources, group, version, self.version), sort_keys=True)
                index[key] = {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (
                    key, hashlib.sha512(doc.encode()).hexdigest().upper()[:128])}
            return {"paths": index}
        wanted = ("", parts[3]) if parts[2:3] == ["api"] and len(parts) == 4 else \
            (parts[3], parts[4]) if parts[2:3] == ["apis"] and len(parts) == 5 else None
        if parts[1:2] != ["v3"] or wanted not in gvs:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return openapi_v3_doc(resources, wanted[0], wanted[1], self.version)

    def version_info(self):
        m = K8S_VERSION_RE.match(self.version or "v1.33.5")
        major, minor = (m.group(1), m.group(2)) if m else ("1", "33")
        return {"major": major, "minor": minor, "gitVersion": self.version, "gitCommit": "k3s-standin",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.6",
                "compiler": "gc", "platform": "linux/amd64"}

    # -- HTTP ------------------------------------------------------------------
    def handles(self, raw_path):
        path = urllib.parse.urlparse(raw_path).path.rstrip("/") or "/"
        return path in ("/api", "/apis", "/version") or path.startswith(("/api/", "/apis/", "/openapi")) or \
            path in HEALTH_PATHS

    def serve(self, handler, method):
        parsed = urllib.parse.urlparse(handler.path)
        path = parsed.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
        body = handler.body  # read whole with the headers (k3s_standin.QuietHandler.parse_request)
        try:
            identity = client_identity(handler)
            if identity is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if "system:masters" not in identity[1]:  # RBAC: only the admin group has rights here
                raise ApiError(403, "Forbidden", 'forbidden: User "%s" cannot %s path "%s"'
                               % (identity[0], method.lower(), path))
            if path in HEALTH_PATHS or path == "/version":
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                                   "resource")
                if path == "/version":
                    return self.send(handler, 200, self.version_info())
                return self.send(handler, 200, "ok", "text/plain; charset=utf-8")
            if method == "GET" and path in ("/api", "/apis") and self.serves_aggregated_discovery() and \
                    wants_aggregated_discovery(handler.headers.get("Accept")):
                return self.send(handler, 200, self.aggregated_discovery(path == "/api"), AGGREGATED_V2)
            status, result = self.dispatch(handler, method, path, query, body)
            if result is STREAMED:
                return None
            if method != "GET" and self.store.dirty:
                # etcd acknowledges a write only once raft has committed it to the WAL, and the
                # API server answers only after etcd did (etcd-io/etcd v3.5
                # server/etcdserver/v3_server.go, processInternalRaftRequestOnce waits for the
                # apply): a snapshot taken after the answer holds the object.
                self.save()
            if isinstance(result, str):
                return self.send(handler, status, result, "text/plain")
            return self.send(handler, status, result)
        except ApiError as exc:
            return self.send(handler, exc.code, exc.status())
        except Disconnect:
            return None

    @staticmethod
    def send(handler, status, body, content_type="application/json"):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Cache-Control", "no-cache, private")
        handler.end_headers()
        handler.wfile.write(body)

    def dispatch(self, handler, method, path, query, body):
        parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
        if parts[0] == "openapi":
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                               "resource")
            return 200, self.openapi(parts)
        if parts[0] == "api":
            if len(parts) < 2 or parts[1] != "v1":
                if len(parts) == 1 and method == "GET":
                    return 200, self.discovery(parts)
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            group, version, rest = "", parts[1], parts[2:]
        else:
            if len(parts) < 3:
                doc = self.discovery(parts) if method == "GET" else None
                if doc is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return 200, doc
            group, version, rest = parts[1], parts[2], parts[3:]
        if not rest:
            doc = self.discovery(parts) if method == "GET" else None
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return 200, doc
        ns = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and len(rest) == 3 and
                                                               rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = "/".join(rest[2:]) or None
        res = self.find(group, version, plural)
        if res is None or (ns is not None and not res.namespaced) or \
                (ns is None and res.namespaced and name is not None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        dry_run = query.get("dryRun") == "All"
        ctype = handler.headers.get("Content-Type", "application/json")

        def parse_body():
            if not body:
                return {}
            if ctype.split(";")[0].strip() == "application/vnd.kubernetes.protobuf":
                return decode_protobuf(body)
            try:
                return json.loads(body)
            except ValueError:
                try:
                    return load_yaml(body.decode())
                except (YamlError, UnicodeDecodeError):
                    raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")

        if sub and not ((sub == "status" and res.status) or (res.kind == "Pod" and not res.crd and sub in (
                "log", "eviction", "binding")) or (res.kind == "Namespace" and not res.crd and sub == "finalize")):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            if name is None:
                if query.get("watch") in GO_TRUE:
                    self.watch(handler, res, ns, query, version)
                    return 200, STREAMED
                listed = self.list(res, ns, query, version)
                return 200, as_table(res, listed) if wants_table(handler.headers.get("Accept")) else listed
            if sub == "log":
                return 200, self.pod_log(ns, name, query)
            if sub in ("eviction", "binding"):
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                               "resource")
            found = self.get(res, ns, name, version)
            return 200, as_table(res, found) if sub is None and wants_table(handler.headers.get("Accept")) else found
        if method == "POST":
            if name is None:
                return 201, self.create(res, ns, parse_body(), dry_run, version)
            if sub == "eviction":
                return 201, self.evict(ns, name, parse_body())
            if sub == "binding":
                return 201, self.bind(ns, name, parse_body())
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if method == "PUT" and name is not None and sub in (None, "status", "finalize"):
            return 200, self.update(res, ns, name, parse_body(), sub, dry_run, version)
        if method == "PATCH" and name is not None and sub in (None, "status"):
            return self.patch(res, ns, name, body, ctype, sub, query, version)
        if method == "DELETE":
            options = parse_body() or {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options[key] = query[key]
            if name is not None and sub is None:
                return 200, self.delete(res, ns, name, options, dry_run, version)
            if name is None:
                with self.store.lock:
                    listed = self.list(res, ns, query, version)["items"]
                    for item in listed:
                        try:
                            self.delete(res, item["metadata"].get("namespace", ""), item["metadata"]["name"],
                                        options, dry_run, version)
                        except ApiError:
                            pass
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # -- watch -----------------------------------------------------------------
    def watch(self, handler, res, ns, query, version):
        reqs = parse_label_selector(query.get("labelSelector"))
        freqs = parse_field_selector(query.get("fieldSelector"))
        try:
            timeout = min(float(query.get("timeoutSeconds") or 60), 300)
        except ValueError:
            timeout = 60
        since = query.get("resourceVersion") or ""
        store = self.store

        def matches(obj):
            return (ns is None or obj["metadata"].get("namespace", "") == ns) and \
                labels_match(reqs, deep(obj, "metadata", "labels")) and fields_match(freqs, obj)

        # A watch-list (client-go's WatchListClient, on by default since client-go 0.35: Helm's
        # --wait) asks sendInitialEvents=true: the current objects as ADDED, then a BOOKMARK
        # annotated k8s.io/initial-events-end (k8s.io/apiserver pkg/storage/cacher,
        # KEP-3157); without that bookmark the client waits for ever.
        initial = query.get("sendInitialEvents") in GO_TRUE
        with store.lock:
            pending = []
            if since in ("", "0") or initial:
                for obj in store.items(res, ns):
                    if matches(obj):
                        pending.append({"type": "ADDED", "object": self.out(res, obj, version)})
                cursor = store.rv
                if initial:
                    pending.append({"type": "BOOKMARK", "object": {
                        "kind": res.kind, "apiVersion": res.api_version(version), "metadata": {
                            "resourceVersion": str(cursor), "annotations": {"k8s.io/initial-events-end": "true"}}}})
            else:
                try:
                    cursor = int(since)
                except ValueError:
                    raise ApiError(400, "BadRequest", "invalid resource version: %s" % since)
                oldest = store.events[0][0] if store.events else store.rv + 1
                if cursor < oldest - 1 and cursor < store.rv:
                    pending.append({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "too old resource version: %s (%d)" % (since, oldest - 1), "reason": "Expired",
                        "code": 410}})
                    cursor = None
        # Chunked, and the connection stays open after the last chunk (the handler speaks
        # HTTP/1.1 with keep-alive): a client reuses it for its next request, as with Go's server.
        # Over HTTP/2 the events are DATA frames of the watch's stream (h2serve.H2Exchange).
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Cache-Control", "no-cache, private")
        handler.end_headers()

        def chunk(data):
            try:
                handler.write_chunk(data)
            except OSError:
                handler.close_connection = True
                raise Disconnect()

        for event in pending:
            chunk((json.dumps(event) + "\n").encode())
        deadline = time.monotonic() + timeout
        while cursor is not None and time.monotonic() < deadline and not self.stopping.is_set():
            with store.lock:
                store.changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                fresh = [e for e in store.events if e[0] > cursor]
                if fresh:
                    cursor = fresh[-1][0]
            for rv, etype, key, obj in fresh:
                if key == res.key and matches(obj):
                    chunk((json.dumps({"type": etype, "object": self.out(res, obj, version)}) + "\n").encode())
        chunk(b"")


STREAMED = object()


# =============================================================================
# What kubectl and Helm ask for besides objects: server-side printing (Tables, for
# `kubectl get`) and the OpenAPI v3 index with per-group-version documents (kubectl
# apply and Helm look there for PATCH's fieldValidation parameter before they send a
# request with it, k8s.io/cli-runtime pkg/resource/query_param_verifier_v3.go).
# =============================================================================

def human_duration(seconds):
    """k8s.io/apimachinery pkg/util/duration HumanDuration, as the AGE column shows it."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = m // 60
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    if h < 192:
        return "%dd%dh" % (h // 24, h % 24) if h % 24 else "%dd" % (h // 24)
    d = h // 24
    if d < 730:
        return "%dd" % d
    if d < 2920:
        return "%dy%dd" % (d // 365, d % 365) if d % 365 else "%dy" % (d // 365)
    return "%dy" % (d // 365)


def _age(obj):
    created = parse_iso(deep(obj, "metadata", "creationTimestamp"))
    return human_duration(time.time() - created) if created is not None else "<unknown>"


def _node_row(node):
    ready = next((c for c in deep(node, "status", "conditions", default=[]) or [] if c.get("type") == "Ready"), None)
    status = ["Ready" if ready and ready.get("status") == "True" else "NotReady" if ready and
              ready.get("status") == "False" else "Unknown"]
    if deep(node, "spec", "unschedulable"):
        status.append("SchedulingDisabled")
    labels = deep(node, "metadata", "labels", default={}) or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k)
    return [",".join(status), ",".join(roles) or "<none>", _age(node), deep(node, "status", "nodeInfo", "kubeletVersion",
                                                                             default="")]


def _pod_row(pod):
    statuses = deep(pod, "status", "containerStatuses", default=[]) or []
    containers = deep(pod, "spec", "containers", default=[]) or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    reason = deep(pod, "status", "reason") or deep(pod, "status", "phase") or "Unknown"
    for s in statuses:
        waiting, done = deep(s, "state", "waiting"), deep(s, "state", "terminated")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
        elif done and done.get("reason") and reason not in ("Succeeded",):
            reason = done["reason"]
    if deep(pod, "metadata", "deletionTimestamp"):
        reason = "Terminating"
    return ["%d/%d" % (ready, len(containers)), reason, restarts, _age(pod)]


def _workload_row(obj, kind):
    st, spec = obj.get("status") or {}, obj.get("spec") or {}
    if kind == "Deployment":
        return ["%d/%d" % (st.get("readyReplicas") or 0, spec.get("replicas", 1)), st.get("updatedReplicas") or 0,
                st.get("availableReplicas") or 0, _age(obj)]
    selector = deep(spec, "template", "spec", "nodeSelector", default={}) or {}
    return [st.get("desiredNumberScheduled") or 0, st.get("currentNumberScheduled") or 0, st.get("numberReady") or 0,
            st.get("updatedNumberScheduled") or 0, st.get("numberAvailable") or 0,
            ",".join("%s=%s" % kv for kv in sorted(selector.items())) or "<none>", _age(obj)]


# kubernetes/kubernetes pkg/printers/internalversion/printers.go (AddHandlers): the columns
# (priority 0) of the kinds a user lists first; other kinds get the default Name, Age
# (CRDs without additionalPrinterColumns print the same).
TABLE_COLUMNS = {
    "Node": (["Status", "Roles", "Age", "Version"], _node_row),
    "Pod": (["Ready", "Status", "Restarts", "Age"], _pod_row),
    "Namespace": (["Status", "Age"], lambda o: [deep(o, "status", "phase", default="Active"), _age(o)]),
    "Deployment": (["Ready", "Up-to-date", "Available", "Age"], lambda o: _workload_row(o, "Deployment")),
    "DaemonSet": (["Desired", "Current", "Ready", "Up-to-date", "Available", "Node Selector", "Age"],
                  lambda o: _workload_row(o, "DaemonSet")),
    "ConfigMap": (["Data", "Age"], lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o)]),
    "Secret": (["Type", "Data", "Age"], lambda o: [o.get("type") or "Opaque", len(o.get("data") or {}), _age(o)]),
}
TABLE_TYPES = {"Restarts": "integer", "Data": "integer", "Up-to-date": "integer", "Available": "integer",
               "Desired": "integer", "Current": "integer"}


def wants_table(accept):
    """client-go's `get` asks for application/json;as=Table;v=v1;g=meta.k8s.io first."""
    first = (accept or "").split(",")[0]
    return "as=Table" in first.replace(" ", "") and "g=meta.k8s.io" in first


def as_table(res, result):
    """A meta.k8s.io/v1 Table of a list or one object, rows carrying PartialObjectMetadata
    (includeObject=Metadata, the default)."""
    names, row = TABLE_COLUMNS.get(res.kind if not res.crd else "", (["Age"], lambda o: [_age(o)]))
    columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a "
                "namespace.", "priority": 0}] + [{"name": n, "type": TABLE_TYPES.get(n, "string"), "format": "",
                                                  "description": "", "priority": 0} for n in names]
    items = result["items"] if "items" in result else [result]
    rows = [{"cells": [o["metadata"]["name"]] + row(o), "object": {
        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}} for o in items]
    meta = {"resourceVersion": deep(result, "metadata", "resourceVersion", default="")}
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns,
            "rows": rows}


PATCH_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


# Protobuf request bodies. client-go's typed clients (Helm's release storage: Secrets; its
# --create-namespace; kubectl create namespace|secret|configmap) send
# application/vnd.kubernetes.protobuf: "k8s\x00" then a runtime.Unknown {typeMeta, raw}
# (k8s.io/apimachinery pkg/runtime/serializer/protobuf/protobuf.go, generated.proto). The
# messages below are field numbers from k8s.io/api core/v1 and apimachinery meta/v1
# generated.proto, for the kinds those clients send; another kind is 415, as for a server
# without the type. Replies stay JSON (the clients accept it: Accept lists application/json).
PROTO_MAGIC = b"k8s\x00"
_TIME = {1: ("seconds", "int"), 2: ("nanos", "int")}
_OWNER = {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"), 5: ("apiVersion", "string"),
          6: ("controller", "bool"), 7: ("blockOwnerDeletion", "bool")}
_META = {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"), 5: ("uid", "string"),
         6: ("resourceVersion", "string"), 7: ("generation", "int"), 8: ("creationTimestamp", _TIME),
         11: ("labels", ("map", "string")), 12: ("annotations", ("map", "string")),
         13: ("ownerReferences", ("repeated", _OWNER)), 14: ("finalizers", ("repeated", "string"))}
PROTO_KINDS = {
    "Secret": {1: ("metadata", _META), 2: ("data", ("map", "bytes")), 3: ("type", "string"),
               4: ("stringData", ("map", "string")), 5: ("immutable", "bool")},
    "ConfigMap": {1: ("metadata", _META), 2: ("data", ("map", "string")), 3: ("binaryData", ("map", "bytes")),
                  4: ("immutable", "bool")},
    "Namespace": {1: ("metadata", _META), 2: ("spec", {1: ("finalizers", ("repeated", "string"))}),
                  3: ("status", {1: ("phase", "string")})},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int"), 2: ("preconditions", {1: ("uid", "string"),
                                                                               2: ("resourceVersion", "string")}),
                      3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "string"),
                      5: ("dryRun", ("repeated", "string"))},
}
_UNKNOWN = {1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}), 2: ("raw", "raw")}


def _varint(data, pos):
    shift = value = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _proto_fields(data):
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            value, pos = data[pos:pos + width], pos + width
        else:
            raise ValueError("unsupported wire type %d" % wire)
        yield number, value


def _proto_value(kind, value):
    if kind == "string":
        return value.decode()
    if kind == "bytes":
        return base64.b64encode(value).decode()  # as the JSON form of []byte
    if kind == "raw":
        return value
    if kind == "int":
        return value - (1 << 64) if value >= 1 << 63 else value
    if kind == "bool":
        return bool(value)
    if kind is _TIME:
        seconds = proto_message(_TIME, value).get("seconds")
        return now_iso(seconds) if seconds else None
    return proto_message(kind, value)


def proto_message(spec, data):
    out = {}
    for number, value in _proto_fields(data):
        if number not in spec:
            continue
        name, kind = spec[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = dict(_proto_fields(value))
            out.setdefault(name, {})[entry.get(1, b"").decode()] = _proto_value(kind[1], entry.get(2, b""))
        elif isinstance(kind, tuple):
            out.setdefault(name, []).append(_proto_value(kind[1], value))
        else:
            decoded = _proto_value(kind, value)
            if decoded not in ("", None, 0, False, {}):  # optional fields the Go side leaves empty
                out[name] = decoded
    return out


def decode_protobuf(body):
    """A JSON-shaped object from a protobuf request body, or ApiError 415."""
    try:
        if not body.startswith(PROTO_MAGIC):
            raise ValueError("no protobuf magic")
        unknown = proto_message(_UNKNOWN, body[len(PROTO_MAGIC):])
        meta = unknown.get("typeMeta") or {}
        spec = PROTO_KINDS.get(meta.get("kind"))
        if spec is None:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json, application/yaml (protobuf is "
                           "taken for %s only)" % ", ".join(sorted(PROTO_KINDS)))
        obj = proto_message(spec, unknown.get("raw") or b"")
    except (ValueError, UnicodeDecodeError, IndexError):
        raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
    if meta.get("apiVersion"):
        obj["apiVersion"] = meta["apiVersion"]
    obj["kind"] = meta["kind"]
    return obj


def openapi_v3_doc(resources, group, version, k8s_version):
    """One group-version's OpenAPI v3 document: its paths with the operations and query
    parameters the stand-in takes. No schemas: PATCH lists no strategic-merge body, so
    kubectl computes client-side strategic merges from its built-in types, as it does for a
    group-version without one."""
    paths = {}
    base = "/api/%s" % version if not group else "/apis/%s/%s" % (group, version)
    for res in resources:
        if res.group != group or version not in res.versions:
            continue
        gvk = {"group": group, "version": version, "kind": res.kind}
        collection = base + ("/namespaces/{namespace}/" if res.namespaced else "/") + res.plural
        params = [{"name": p, "in": "query", "schema": {"type": "string"}} for p in PATCH_PARAMS]
        op = {"x-kubernetes-group-version-kind": gvk, "parameters": params}
        content = {t: {"schema": {"type": "object"}} for t in (
            "application/apply-patch+yaml", "application/json-patch+json", "application/merge-patch+json")}
        paths[collection] = {"get": dict(op, **{"x-kubernetes-action": "list"}),
                             "post": dict(op, **{"x-kubernetes-action": "post"})}
        paths[collection + "/{name}"] = {
            "get": dict(op, **{"x-kubernetes-action": "get"}), "put": dict(op, **{"x-kubernetes-action": "put"}),
            "delete": dict(op, **{"x-kubernetes-action": "delete"}),
            "patch": dict(op, **{"x-kubernetes-action": "patch", "requestBody": {"content": content}})}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": k8s_version}, "paths": paths,
            "components": {"schemas": {}}}


def aggregated_resources(group, version, doc):
    """An APIResourceList's entries as aggregated discovery's resources with subresources."""
    resources, order = {}, []
    for entry in doc.get("resources", []):
        kind = {"group": entry.get("group", group), "version": entry.get("version", version), "kind": entry["kind"]}
        name, _, sub = entry["name"].partition("/")
        if not sub:
            resources[name] = {"resource": name, "responseKind": kind,
                               "scope": "Namespaced" if entry["namespaced"] else "Cluster",
                               "singularResource": entry.get("singularName", ""), "verbs": entry["verbs"],
                               **({"shortNames": entry["shortNames"]} if entry.get("shortNames") else {})}
            order.append(name)
        elif name in resources:
            resources[name].setdefault("subresources", []).append(
                {"subresource": sub, "responseKind": kind, "verbs": entry["verbs"]})
    return [resources[name] for name in order]


def version_priority(version):
    """Kubernetes version order: GA before beta before alpha, higher first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


# =============================================================================
# Host facts an agent (or server) reports when it joins: CPUs, memory, GPUs
# (`nvidia-smi -L`, answered by the nvidia-smi stand-in on GPU test hosts) and RDMA
# devices with their netdevs (/sys/class/infiniband/*/device/net/*).
# =============================================================================

GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)")


def probe_hardware(host=lambda path: path):
    hw = {"cpu": os.cpu_count() or 1, "kernel": os.uname().release, "os_image": "Debian GNU/Linux"}
    # kubelet's nodeInfo.machineID: cAdvisor reads /etc/machine-id, then /var/lib/dbus/machine-id.
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(host(path)) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if re.fullmatch(r"[0-9a-f]{32}", text):
            hw["machine_id"] = text
            break
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    hw["memory_kib"] = int(line.split()[1])
    except OSError:
        pass
    try:
        with open(host("/etc/os-release")) as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    hw["os_image"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    try:
        st = os.statvfs(host("/var/lib") if os.path.isdir(host("/var/lib")) else "/")
        hw["ephemeral_kib"] = st.f_blocks * st.f_frsize // 1024
    except OSError:
        pass
    nvsmi = shutil.which("nvidia-smi")
    if nvsmi:
        try:
            proc = subprocess.run([nvsmi, "-L"], capture_output=True, text=True, timeout=15)
            gpus = [GPU_LINE.match(line) for line in proc.stdout.splitlines()]
            gpus = [m for m in gpus if m]
            if proc.returncode == 0 and gpus:
                hw["gpus"] = {"count": len(gpus), "model": gpus[0].group(2), "uuids": [m.group(3) for m in gpus]}
            else:
                hw["gpu_error"] = (proc.stdout + proc.stderr).strip()[-300:] or "nvidia-smi -L exit %d" % proc.returncode
        except (OSError, subprocess.SubprocessError) as exc:
            hw["gpu_error"] = str(exc)
    ib = host("/sys/class/infiniband")
    rdma = []
    if os.path.isdir(ib):
        for hca in sorted(os.listdir(ib)):
            dev = os.path.join(ib, hca, "device")

            def read(*parts):
                try:
                    with open(os.path.join(*parts)) as fh:
                        return fh.read().strip()
                except OSError:
                    return ""
            netdir = os.path.join(dev, "net")
            rdma.append({"hca": hca, "netdevs": sorted(os.listdir(netdir)) if os.path.isdir(netdir) else [],
                         "vendor": read(dev, "vendor"), "device": read(dev, "device"),
                         "link_layer": read(ib, hca, "ports", "1", "link_layer")})
    # Test hosts cannot fake /sys: a stand-in file may list RDMA devices instead (same shape).
    try:
        with open(host("/etc/bootstrap-standin/infiniband.json")) as fh:
            rdma += json.load(fh)
    except (OSError, ValueError):
        pass
    if rdma:
        hw["rdma"] = rdma
    return hw


# =============================================================================
# GPU facts the simulator plays (H200 only: the GPU the project's fixtures come from).
# =============================================================================

GPU_MODELS = {  # model -> memory MiB, family, MIG profiles {profile: (compute slices, memory eighths, max per GPU)}
    "NVIDIA H200": {"memory": 143771, "family": "hopper", "mig": {
        "1g.18gb": (1, 1, 7), "1g.18gb+me": (1, 1, 1), "1g.35gb": (1, 2, 4), "2g.35gb": (2, 2, 3),
        "3g.71gb": (3, 4, 2), "4g.71gb": (4, 4, 1), "7g.141gb": (7, 8, 1)}},
}
MIG_MEMORY_MIB = {"1g.18gb": 16384, "1g.18gb+me": 16384, "1g.35gb": 32768, "2g.35gb": 32768, "3g.71gb": 71424,
                  "4g.71gb": 71424, "7g.141gb": 143104}
BUILTIN_MIG_LAYOUTS = {  # mig-parted's layouts for the H200, as the GPU Operator's default config has them
    "all-disabled": None, "all-enabled": {},
    "all-1g.18gb": {"1g.18gb": 7}, "all-1g.18gb.me": {"1g.18gb+me": 1}, "all-1g.35gb": {"1g.35gb": 4},
    "all-2g.35gb": {"2g.35gb": 3}, "all-3g.71gb": {"3g.71gb": 2}, "all-4g.71gb": {"4g.71gb": 1},
    "all-7g.141gb": {"7g.141gb": 1}, "all-balanced": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
}
VECTORADD_OK = ("[Vector addition of 50000 elements]\nCopy input data from the host memory to the CUDA device\n"
                "CUDA kernel launch with 196 blocks of 256 threads\nCopy output data from the CUDA device to the "
                "host memory\nTest PASSED\nDone\n")
VECTORADD_NO_GPU = ("[Vector addition of 50000 elements]\nFailed to allocate device vector A (error code "
                    "no CUDA-capable device is detected)!\n")
GPU_RESOURCE_RE = re.compile(r"^nvidia\.com/(gpu|gpu\.shared|mig-.+)$")


def gpu_product(model):
    return model.replace(" ", "-")


# A node whose kubelet never confirms a pod's deletion (see Pods in Sim's docstring). An
# approximation: a real pod in graceful deletion keeps deletionTimestamp and no finalizer
# until its kubelet deletes it with grace 0 (kubernetes pkg/registry/core/pod/strategy.go,
# CheckGracefulDelete); a finalizer gives the same "stays, deleted" to every reader, except
# a force delete (grace 0), which the tool never sends.
KEEPER_LABEL = ("standin.k3s/kubelet", "keeps-deleted-pods")
KEEPER_FINALIZER = "standin.k3s/kubelet-confirms"


def mig_layout_error(layout, devices, model):
    """Why mig-parted would refuse this layout on this GPU, or None."""
    table = (GPU_MODELS.get(model) or {}).get("mig")
    if table is None:
        return "no MIG profiles known for %s" % model
    compute = memory = 0
    for profile, count in devices.items():
        if profile not in table:
            return ("error validating values in config file: invalid MIG profile '%s' for %s (valid: %s)"
                    % (profile, model, ", ".join(sorted(table))))
        c, m, most = table[profile]
        if not isinstance(count, int) or count < 0 or count > most:
            return "error applying MIG configuration: %d x %s does not fit on one %s" % (count, profile, model)
        compute, memory = compute + c * count, memory + m * count
    if compute > 7 or memory > 8:
        return ("error applying MIG configuration: layout %s needs %d compute and %d memory slices; a %s has 7 "
                "and 8" % (layout, compute, memory, model))
    return None


# =============================================================================
# A very small shell: what a validation pod's command prints. Handles `sh -c "..."`
# scripts and plain argv: echo, printf, cat, sleep, true/false/exit, test/[, ls, mkdir,
# touch, rm, hostname, env, grep, wc, head, tail, date, df, nvidia-smi (-L), vectorAdd;
# `> >> <` redirections, pipes, && || ;. Files live on the pod's volumes (a PVC's files
# outlive the pod). Unknown commands exit 0 silently.
# =============================================================================

class PodProgram:
    def __init__(self, ctx):
        self.ctx = ctx
        self.out = []
        self.duration = 0.0
        self.forever = False
        self.env = dict(ctx.get("env") or {})
        self.status = 0

    # files ------------------------------------------------------------------
    def locate(self, path):
        if not path.startswith("/"):
            path = "/" + path
        for mount, volume in self.ctx["mounts"]:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                rel = path[len(mount.rstrip("/")):].lstrip("/")
                return self.ctx["volumes"].setdefault(volume, {}), rel
        return self.ctx["volumes"].setdefault(self.ctx["rootfs"], {}), path.lstrip("/")

    def read(self, path):
        files, rel = self.locate(path)
        return files.get(rel)

    def write(self, path, text, append=False):
        files, rel = self.locate(path)
        files[rel] = (files.get(rel, "") if append else "") + text

    def exists_dir(self, path):
        files, rel = self.locate(path)
        prefix = rel.rstrip("/") + "/" if rel else ""
        return any(k.startswith(prefix) for k in files) or any(
            path.rstrip("/") == m.rstrip("/") for m, _ in self.ctx["mounts"]) or path in ("/", "/tmp", "/data")

    # running ----------------------------------------------------------------
    def run_argv(self, argv):
        if argv and os.path.basename(argv[0]) in ("sh", "bash", "ash", "dash") and "-c" in argv:
            i = argv.index("-c")
            script = argv[i + 1] if i + 1 < len(argv) else ""
            return self.run_script(script)
        return self.run_script(" ".join(shlex.quote(a) for a in argv))

    def expand(self, line):
        out, i, quote = [], 0, None
        while i < len(line):
            ch = line[i]
            if ch == "'" and quote != '"':
                quote = None if quote == "'" else "'"
            elif ch == '"' and quote != "'":
                quote = None if quote == '"' else '"'
            if ch == "$" and quote != "'":
                m = re.match(r"\$(\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|\?)", line[i:])
                if m:
                    name = m.group(2) or m.group(3)
                    value = str(self.status) if m.group(0) == "$?" else self.env.get(name, "")
                    out.append(value if quote == '"' else shlex.quote(value) if value else "")
                    i += len(m.group(0))
                    continue
            out.append(ch)
            i += 1
        return "".join(out)

    def run_script(self, script):
        for line in script.replace("\r", "").split("\n"):
            if self.forever:
                break
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                lexer = shlex.shlex(self.expand(line), posix=True, punctuation_chars=";&|<>")
                lexer.whitespace_split = True
                lexer.commenters = "#"
                tokens = list(lexer)
            except ValueError:
                self.out.append("sh: syntax error: unterminated quoted string\n")
                self.status = 2
                return self.status
            self.run_tokens(tokens)
            if self.exited:
                break
        return self.status

    exited = False

    def run_tokens(self, tokens):
        # split into (operator, pipeline) items
        pipeline, items, op = [], [], None
        for tok in tokens:
            if tok in ("&&", "||", ";", "&"):
                items.append((op, pipeline))
                pipeline, op = [], tok
            else:
                pipeline.append(tok)
        items.append((op, pipeline))
        for op, pipe in items:
            if self.forever or self.exited:
                return
            if not pipe:
                continue
            if op == "&&" and self.status != 0:
                continue
            if op == "||" and self.status == 0:
                continue
            self.status = self.run_pipeline(pipe)

    def run_pipeline(self, tokens):
        commands, current = [], []
        for tok in tokens:
            if tok == "|":
                commands.append(current)
                current = []
            else:
                current.append(tok)
        commands.append(current)
        stdin, status = None, 0
        for index, cmd in enumerate(commands):
            last = index == len(commands) - 1
            argv, redirect_out, append, redirect_in, silent = [], None, False, None, False
            i = 0
            while i < len(cmd):
                tok = cmd[i]
                if tok in (">", ">>", "<", ">&", "<&") or (tok.isdigit() and i + 1 < len(cmd) and
                                                          cmd[i + 1] in (">", ">>", ">&")):
                    fd = None
                    if tok.isdigit():
                        fd, i = tok, i + 1
                        tok = cmd[i]
                    target = cmd[i + 1] if i + 1 < len(cmd) else ""
                    i += 2
                    if tok == "<":
                        redirect_in = target
                    elif fd == "2" or tok == ">&":
                        silent = silent or target == "/dev/null"
                    else:
                        redirect_out, append = target, tok == ">>"
                    continue
                argv.append(tok)
                i += 1
            if redirect_in is not None:
                stdin = self.read(redirect_in) or ""
            output, status = self.builtin(argv, stdin)
            if redirect_out is not None:
                if redirect_out != "/dev/null":
                    self.write(redirect_out, output, append)
                output = ""
            if last:
                self.out.append(output)
            else:
                stdin = output
        return status

    def builtin(self, argv, stdin):
        if not argv:
            return "", 0
        name = os.path.basename(argv[0])
        args = argv[1:]
        ctx = self.ctx
        if "vectoradd" in name.lower():
            return (VECTORADD_OK, 0) if ctx.get("gpus") else (VECTORADD_NO_GPU, 1)
        if argv[0] in ("/cuda-samples/sample", "/cuda-samples/nbody") and ctx.get("cuda_sample") == "nbody":
            return run_nbody(args, ctx)
        if name == "nbody" and "/" not in argv[0]:  # not on PATH in the k8s-samples image (above)
            return "/bin/sh: 1: nbody: not found\n", 127
        if name == "echo":
            newline = True
            while args and args[0] in ("-n", "-e", "-ne", "-en"):
                newline = newline and "n" not in args[0]
                args = args[1:]
            return " ".join(args) + ("\n" if newline else ""), 0
        if name == "printf":
            if not args:
                return "", 1
            fmt, rest = args[0], list(args[1:])
            text = re.sub(r"%[sd]", lambda m: rest.pop(0) if rest else "", fmt)
            return text.replace("\\n", "\n").replace("\\t", "\t"), 0
        if name == "cat":
            if not args:
                return stdin or "", 0
            out = []
            for path in args:
                data = self.read(path)
                if data is None:
                    return "".join(out) + "cat: can't open '%s': No such file or directory\n" % path, 1
                out.append(data)
            return "".join(out), 0
        if name == "sleep":
            for arg in args:
                if arg in ("infinity", "inf"):
                    self.forever = True
                    return "", 0
                m = re.fullmatch(r"([0-9.]+)([smhd]?)", arg)
                if m:
                    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
                    if seconds >= 86400:
                        self.forever = True
                    self.duration += seconds
            return "", 0
        if name in ("true", ":"):
            return "", 0
        if name == "false":
            return "", 1
        if name == "exit":
            self.exited = True
            return "", int(args[0]) if args and args[0].isdigit() else self.status
        if name in ("test", "["):
            if name == "[" and args and args[-1] == "]":
                args = args[:-1]
            negate = bool(args) and args[0] == "!"
            if negate:
                args = args[1:]
            ok = False
            if len(args) == 2 and args[0] in ("-f", "-e", "-s", "-r"):
                data = self.read(args[1])
                ok = data is not None and (args[0] != "-s" or bool(data)) or (args[0] == "-e" and
                                                                             self.exists_dir(args[1]))
            elif len(args) == 2 and args[0] == "-d":
                ok = self.exists_dir(args[1])
            elif len(args) == 2 and args[0] in ("-z", "-n"):
                ok = (args[1] == "") == (args[0] == "-z")
            elif len(args) == 3 and args[1] in ("=", "=="):
                ok = args[0] == args[2]
            elif len(args) == 3 and args[1] == "!=":
                ok = args[0] != args[2]
            elif len(args) == 1:
                ok = args[0] != ""
            return "", 0 if ok != negate else 1
        if name == "ls":
            path = next((a for a in args if not a.startswith("-")), "/")
            files, rel = self.locate(path)
            if rel in files:
                return path + "\n", 0
            prefix = rel.rstrip("/") + "/" if rel else ""
            names = sorted({k[len(prefix):].split("/")[0] for k in files if k.startswith(prefix)})
            if not names and not self.exists_dir(path):
                return "ls: %s: No such file or directory\n" % path, 1
            return "".join(n + "\n" for n in names), 0
        if name == "mkdir":
            return "", 0
        if name == "touch":
            for path in args:
                if self.read(path) is None:
                    self.write(path, "")
            return "", 0
        if name == "rm":
            for path in (a for a in args if not a.startswith("-")):
                files, rel = self.locate(path)
                for key in [k for k in files if k == rel or k.startswith(rel.rstrip("/") + "/")]:
                    del files[key]
            return "", 0
        if name == "hostname":
            return ctx["pod"] + "\n", 0
        if name in ("env", "printenv"):
            return "".join("%s=%s\n" % kv for kv in sorted(self.env.items())), 0
        if name == "date":
            return time.strftime("%a %b %d %H:%M:%S UTC %Y\n", time.gmtime()), 0
        if name in ("whoami", "id"):
            return ("root\n" if name == "whoami" else "uid=0(root) gid=0(root) groups=0(root)\n"), 0
        if name == "df":
            return ("Filesystem           1K-blocks      Used Available Use% Mounted on\n"
                    "overlay               61255492   8123456  50000000  14% /\n"), 0
        if name == "grep":
            flags = set()
            while args and args[0].startswith("-") and len(args[0]) > 1:
                flags.update(args[0][1:])
                args = args[1:]
            if not args:
                return "", 2
            pattern, files = args[0], args[1:]
            text = stdin or ""
            if files:
                text = "".join(self.read(f) or "" for f in files)
            try:
                rx = re.compile(pattern, re.I if "i" in flags else 0)
            except re.error:
                rx = re.compile(re.escape(pattern))
            hits = [line for line in text.splitlines(True) if bool(rx.search(line)) != ("v" in flags)]
            if "q" in flags:
                return "", 0 if hits else 1
            if "c" in flags:
                return "%d\n" % len(hits), 0 if hits else 1
            return "".join(h if h.endswith("\n") else h + "\n" for h in hits), 0 if hits else 1
        if name == "wc":
            text = stdin if not [a for a in args if not a.startswith("-")] else "".join(
                self.read(a) or "" for a in args if not a.startswith("-"))
            text = text or ""
            if "-l" in args:
                return "%d\n" % text.count("\n"), 0
            if "-c" in args:
                return "%d\n" % len(text.encode()), 0
            return "%d %d %d\n" % (text.count("\n"), len(text.split()), len(text.encode())), 0
        if name in ("head", "tail"):
            n, files = 10, []
            i = 0
            while i < len(args):
                if args[i] == "-n" and i + 1 < len(args):
                    n, i = int(args[i + 1]), i + 2
                    continue
                if re.fullmatch(r"-\d+", args[i]):
                    n = int(args[i][1:])
                else:
                    files.append(args[i])
                i += 1
            text = "".join(self.read(f) or "" for f in files) if files else (stdin or "")
            lines = text.splitlines(True)
            return "".join(lines[:n] if name == "head" else lines[-n:] if n else []), 0
        if name == "nvidia-smi":
            gpus = ctx.get("gpus") or []
            if not gpus:
                return "sh: nvidia-smi: not found\n", 127
            if args and args[0] == "-L" or not args:
                return "".join(gpus), 0
            return "", 0
        return "", 0  # anything else: ran and exited 0


def nccl_output(busbw):
    rows = "".join("%12d %12d     float     sum      -1   %7.1f  %6.2f  %6.2f      0   %7.1f  %6.2f  %6.2f      0\n"
                   % (size, size // 4, size / busbw / 1e3, busbw * 0.53, busbw, size / busbw / 1e3,
                      busbw * 0.53, busbw) for size in (536870912, 1073741824, 2147483648))
    return ("# nThread 1 nGpus 1 minBytes 536870912 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20\n"
            "#\n#                                                              out-of-place                       in-place\n"
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
            + rows + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %.3f \n#\n" % busbw)


# NVIDIA's k8s-samples images (nvcr.io/nvidia/k8s/cuda-sample:<sample>-cuda<version>) hold one
# CUDA sample at /cuda-samples/<sample>, linked as /cuda-samples/sample, which is the image's
# ENTRYPOINT; /cuda-samples is not on PATH, so a shell in the image cannot run `nbody` by name
# (NVIDIA/k8s-samples deployments/container/Dockerfile.ubuntu at 7eab568, the commit that made
# the cuda11.7.1 images, and deployments/container/Dockerfile at 06bd13b; the base image is
# nvidia/cuda's Ubuntu, whose /bin/sh is dash: "/bin/sh: 1: nbody: not found", status 127).
# A pod's `command` replaces the ENTRYPOINT and `args` follow it, as the kubelet does.
CUDA_SAMPLE_IMAGE_RE = re.compile(r"/cuda-sample:([A-Za-z][A-Za-z0-9]*)-")
CUDA_SAMPLE_ENTRYPOINT = ["/cuda-samples/sample"]
NBODY_GFLOPS = {"NVIDIA H200": 27000.0}  # single precision; other models: NBODY_GFLOPS_DEFAULT
NBODY_GFLOPS_DEFAULT = 20000.0
# n-body's words (NVIDIA/cuda-samples Samples/5_Domain_Specific/nbody/nbody.cpp at 2e41896:
# main, showHelp, _runBenchmark; helper_string.h takes a flag with one or two leading '-').
NBODY_HELP = ("Run \"nbody -benchmark [-numbodies=<numBodies>]\" to measure performance.\n"
              "\t-fullscreen       (run n-body simulation in fullscreen mode)\n"
              "\t-fp64             (use double precision floating point values for simulation)\n"
              "\t-hostmem          (stores simulation data in host memory)\n"
              "\t-benchmark        (run benchmark to measure performance) \n"
              "\t-numbodies=<N>    (number of bodies (>= 1) to run in simulation) \n"
              "\t-device=<d>       (where d=0,1,2.... for the CUDA device to use)\n"
              "\t-numdevices=<i>   (where i=(number of CUDA devices > 0) to use for simulation)\n"
              "\t-compare          (compares simulation results running once on the default GPU and once on "
              "the CPU)\n"
              "\t-cpu              (run n-body simulation on the CPU)\n"
              "\t-tipsy=<file.bin> (load a tipsy model file for simulation)\n\n"
              "NOTE: The CUDA Samples are not meant for performance measurements. Results may vary when GPU "
              "Boost is enabled.\n\n")


def nbody_flags(args):
    flags = {}
    for arg in args:
        name, _, value = arg.lstrip("-").partition("=")
        flags[name] = value
    return flags


def run_nbody(args, ctx):
    """(output, status) of /cuda-samples/nbody with `args` in a container with ctx's GPUs."""
    flags = nbody_flags(args)
    if "help" in flags:
        return "\n> Command line options\n" + NBODY_HELP.split("\n", 1)[1].split("NOTE:")[0], 0
    out = NBODY_HELP
    gpus = ctx.get("gpus") or []
    if "benchmark" not in flags and "compare" not in flags:
        # Without -benchmark it opens an OpenGL window; a pod has no display.
        return out + "freeglut (/cuda-samples/sample): failed to open display ':0'\n", 1
    if not gpus:
        return out + "Error: only 0 Devices available, 1 requested.  Exiting.\n", 1
    model = re.sub(r"^GPU \d+: (.*?) \(UUID:.*", r"\1", gpus[0].splitlines()[0])
    bodies = int(flags.get("numbodies") or 0) if (flags.get("numbodies") or "").isdigit() else 0
    bodies = bodies or 256 * 4 * 132
    iterations = int(flags["i"]) if (flags.get("i") or "").isdigit() and int(flags["i"]) > 0 else 10
    gflops = NBODY_GFLOPS.get(model, NBODY_GFLOPS_DEFAULT)
    interactions = float(bodies) * bodies * iterations
    ms = interactions * 20 / (gflops * 1e9) * 1000
    out += ("> Windowed mode\n> Simulation data stored in video memory\n> Single precision floating point "
            "simulation\n> 1 Devices used for simulation\nGPU Device 0: \"Hopper\" with compute capability 9.0\n\n"
            "> Compute 9.0 CUDA device: [%s]\n" % model)
    if "numbodies" in flags:
        out += "number of bodies = %d\n" % bodies
    out += ("%d bodies, total time for %d iterations: %.3f ms\n= %.3f billion interactions per second\n"
            "= %.3f single-precision GFLOP/s at 20 flops per interaction\n"
            % (bodies, iterations, ms, interactions / ms / 1e6, gflops))
    return out, 0


def pull_error(image):
    """containerd's error for an image whose registry cannot be resolved, or None: a registry
    host under .invalid (RFC 2606: never resolves), as any node would fail it. The text is
    containerd v2.0's, which k3s v1.33 ships (containerd/containerd v2.0.5,
    internal/cri/server/images/image_pull.go: "failed to pull and unpack image %q: %w";
    core/remotes/docker/resolver.go: "failed to resolve reference"), as the kubelet gets it
    over gRPC ("rpc error: code = Unknown desc = ...")."""
    first = image.split("/", 1)[0]
    if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
        return None
    host = first.split(":", 1)[0]
    if not host.endswith(".invalid"):
        return None
    path, _, digest = image.split("/", 1)[1].partition("@")
    repo, tag = path.rsplit(":", 1) if ":" in path else (path, "latest")
    tag = digest or tag
    return ('rpc error: code = Unknown desc = failed to pull and unpack image "%s": failed to resolve reference '
            '"%s": failed to do request: Head "https://%s/v2/%s/manifests/%s": dial tcp: lookup %s: no such host'
            % (image, image, first, repo, tag, host))


def run_container(container, ctx):
    """(log text, exit code, seconds it runs or None for "until deleted")."""
    image = container.get("image", "")
    base = env_float("K3S_STANDIN_POD_SECONDS", 1.0)
    sample = CUDA_SAMPLE_IMAGE_RE.search(image)
    ctx = dict(ctx, cuda_sample=sample.group(1) if sample else None)
    entrypoint = CUDA_SAMPLE_ENTRYPOINT if sample and sample.group(1) != "vectoradd" else []
    argv = list(container.get("command") or entrypoint) + list(container.get("args") or [])
    repo = image.rsplit("@", 1)[0]
    if "fail" in repo.lower():
        return ("standin: simulated failure: image %s exits 1\nError: task failed\n" % image, 1, base)
    if any("all_reduce_perf" in arg for arg in argv):
        # nccl-tests' launcher: the real summary format; the bandwidth comes from the image
        # tag (`...:busbw-120` -> 120 GB/s) so tests can place it above or below a floor.
        match = re.search(r"busbw-([0-9.]+)", repo)
        return (nccl_output(float(match.group(1)) if match else 181.4), 0, base)
    program = PodProgram(ctx)
    if not argv:
        if "vectoradd" in repo.lower():
            return (VECTORADD_OK, 0, base) if ctx.get("gpus") else (VECTORADD_NO_GPU, 1, base)
        return "", 0, base
    status = program.run_argv(argv)
    return "".join(program.out), status, None if program.forever else base + program.duration


# =============================================================================
# The simulator
# =============================================================================

def node_ready(node):
    cond = next((c for c in deep(node, "status", "conditions", default=[]) or [] if c.get("type") == "Ready"), None)
    return bool(cond) and cond.get("status") == "True"


def tolerates(t, taint):
    """k8s.io/api core/v1 toleration.go (v0.33), ToleratesTaint: an effect, when given, must
    match; a key, when given, must match (an empty key with Exists tolerates every taint);
    operator Exists matches any value, Equal or empty the same value, any other operator
    nothing. kube-scheduler's TaintToleration filter (pkg/scheduler/framework/plugins/
    tainttoleration/taint_toleration.go) asks this for every NoSchedule and NoExecute taint."""
    if t.get("effect") and t.get("effect") != taint.get("effect"):
        return False
    if t.get("key") and t.get("key") != taint.get("key"):
        return False
    operator = t.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (t.get("value") or "") == (taint.get("value") or "")


def tolerated(tolerations, taint):
    return any(isinstance(t, dict) and tolerates(t, taint) for t in tolerations or [])


# What the DaemonSet controller adds to every DaemonSet pod, and nothing else: a taint of
# another key (a GPU node's, the acceptance gate's) needs the DaemonSet's own toleration
# (kubernetes pkg/controller/daemon/util/daemonset_util.go, AddOrUpdateDaemonPodTolerations;
# network-unavailable only for hostNetwork pods).
DAEMON_POD_TOLERATIONS = (("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
                          ("node.kubernetes.io/disk-pressure", "NoSchedule"),
                          ("node.kubernetes.io/memory-pressure", "NoSchedule"),
                          ("node.kubernetes.io/pid-pressure", "NoSchedule"),
                          ("node.kubernetes.io/unschedulable", "NoSchedule"))


def node_selector_terms_match(terms, node):
    labels = deep(node, "metadata", "labels", default={}) or {}
    for term in terms or []:
        ok = True
        for expr in term.get("matchExpressions") or []:
            key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
            have = labels.get(key)
            if op == "In":
                ok = have in values
            elif op == "NotIn":
                ok = have not in values
            elif op == "Exists":
                ok = key in labels
            elif op == "DoesNotExist":
                ok = key not in labels
            elif op in ("Gt", "Lt"):
                try:
                    ok = (int(have) > int(values[0])) if op == "Gt" else (int(have) < int(values[0]))
                except (TypeError, ValueError, IndexError):
                    ok = False
            if not ok:
                break
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name":
                name = node["metadata"]["name"]
                inside = name in (expr.get("values") or [])
                ok = ok and (inside if expr.get("operator") == "In" else not inside)
        if ok:
            return True
    return False


def node_addresses(annotations, name):
    """status.addresses as k3s's cloud provider sets them from the Node's annotations: k3s-io/k3s
    pkg/cloudprovider/instances.go (commit 93565e9), InstanceMetadata: an InternalIP for each
    k3s.io/internal-ip entry, an ExternalIP for each k3s.io/external-ip entry, then the
    Hostname (k3s.io/hostname)."""
    out = []
    for key, kind in (("k3s.io/internal-ip", "InternalIP"), ("k3s.io/external-ip", "ExternalIP")):
        out += [{"type": kind, "address": a} for a in (annotations.get(key) or "").split(",") if a]
    out.append({"type": "Hostname", "address": annotations.get("k3s.io/hostname") or name})
    return out


def parse_taint(text):
    m = re.fullmatch(r"([^=:]+)(?:=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)", text.strip())
    if not m:
        return None
    taint = {"key": m.group(1), "effect": m.group(3)}
    if m.group(2):
        taint["value"] = m.group(2)
    return taint


class Simulator:
    """Plays what a small k3s cluster's controllers, scheduler and kubelets do.

    Nodes   One Node per join record (server and agents; labels and taints from the
            node's config at registration, as k3s applies them only then; k3s's role
            labels; capacity from the host; k3s's address annotations k3s.io/internal-ip,
            k3s.io/external-ip and, with flannel-external-ip, flannel's
            public-ip-overwrite, merged into the Node's at each registration; addresses
            from them as k3s's cloud provider sets them). NotReady for
            K3S_STANDIN_NODE_READY_SECONDS (1) after registering and until the node's
            flannel reported its lease (heartbeats; recorded as flannel's annotations
            backend-type, backend-data, public-ip, kube-subnet-manager), then Ready; with
            flannel-backend none no lease is needed. A node
            whose k3s stopped heartbeating (agents every K3S_STANDIN_HEARTBEAT seconds,
            3) goes Ready=Unknown with the unreachable taints after
            K3S_STANDIN_NODE_GRACE seconds (20); Ready again on the next heartbeat.
            Cordoned (spec.unschedulable) -> the unschedulable taint. A deleted Node
            stays deleted until its k3s registers again (a restart); its pods and its
            <node>.node-password.k3s Secret go with it. A server node annotated
            etcd.k3s.cattle.io/remove=true gets etcd.k3s.cattle.io/removed-node-name.
    GPUs    Nodes whose host reported GPUs (`nvidia-smi -L`) carry GFD's labels
            (nvidia.com/gpu.present, .product, .count, .memory, .family, mig.capable).
            The device plugin (see gpu_operator_active for K3S_STANDIN_DEVICE_PLUGIN)
            advertises nvidia.com/gpu = GPUs x replicas
            of the node's config (label nvidia.com/device-plugin.config=<key>, else the
            ClusterPolicy's default, else 1), time-slicing or MPS, renameByDefault ->
            nvidia.com/gpu.shared, product label -SHARED; and MIG manager applies
            nvidia.com/mig.config=<layout> (pending, then success or failed after
            K3S_STANDIN_MIG_SECONDS, 1.5; a failure's reason in the node annotation
            nvidia.com/mig.config.state.reason and a Warning event), from
            gpu-operator/bootstrap-mig-parted-config (config.yaml) when it exists, else
            mig-parted's built-in H200 layouts; MIG strategy from the node label
            nvidia.com/mig.strategy, else the ClusterPolicy, else single.
    RDMA    ConfigMap kube-system/rdma-devices (config.json of the RDMA shared device
            plugin): <resourcePrefix|rdma>/<resourceName> = rdmaHcaMax on nodes whose
            reported RDMA netdevs match the entry's devices / selectors.ifNames (hosts
            report /sys/class/infiniband, plus /etc/bootstrap-standin/infiniband.json:
            [{"hca": "mlx5_0", "netdevs": ["ib0"], "vendor": "0x15b3", ...}]).
    Pods    default-scheduler: nodeName, nodeSelector, required node affinity, taints
            and tolerations, cordons, requests against allocatable minus the pods on the
            node (extended resources default to their limits), PVC binding and volume
            node affinity; else Pending, PodScheduled=False Unschedulable with the
            scheduler's message and a FailedScheduling event. Kubelet: admission
            (OutOf<resource>), ContainerCreating, Running after
            K3S_STANDIN_POD_START_SECONDS (0.3), then the container's program (see
            PodProgram) runs K3S_STANDIN_POD_SECONDS (1) plus its sleeps; `sleep
            infinity` runs until deleted. restartPolicy Never/OnFailure: Succeeded or
            Failed by exit code; Always: stays Running. Images containing "vectoradd":
            the CUDA sample's output when the pod got a GPU resource, else its CUDA
            error; cuda-sample:nbody-* images: their ENTRYPOINT /cuda-samples/sample (n-body)
            with the pod's args, n-body's benchmark output per container (each its own GPU),
            `nbody` by name not found (not on PATH); images containing "fail": exit 1.
            Deleting a pod removes it at once, except on a node labelled
            standin.k3s/kubelet=keeps-deleted-pods (registered so, node-label): a kubelet
            that never confirms a deletion (a hostile or a broken one); its pods carry the
            finalizer standin.k3s/kubelet-confirms and stay, deletionTimestamp set, for ever.
    Namespaces  A deleted namespace is Terminating about a second (the namespace controller),
            then its objects go with it, except those with finalizers: they are marked
            deleted and the namespace stays Terminating until they are gone (kubernetes
            pkg/controller/namespace/deletion/namespaced_resources_deleter.go: the
            namespace is finalized once its content is gone).
    Storage k3s's local-path StorageClass (default, WaitForFirstConsumer) unless
            local-storage is disabled. PVCs get the default class (also later), bind
            (Immediate: when the class exists; WaitForFirstConsumer: once a pod using
            them is scheduled) to a new PV (local-path ones pinned to that node).
    Jobs    batch/v1 Jobs make pods (completions, parallelism, backoffLimit) and get
            Complete / Failed conditions. Deployments, StatefulSets, ReplicaSets and
            DaemonSets get a ready status (no pods are made for them).
    Volcano Jobs (batch.volcano.sh/v1alpha1) need an existing queue; they get a PodGroup
            and their pods, which the volcano scheduler binds only when at least
            minAvailable of them fit at once (gang); else all stay Pending with the
            gang message on the PodGroup, the Job and an event.
    GC      Objects whose owners were deleted go (propagationPolicy Orphan keeps them);
            namespaces being deleted are emptied, then removed.
    """

    def __init__(self, api):
        self.api = api
        self.store = api.store
        self.last_seen = {}
        self.timers = {}
        self.gc_uids = set()
        self.terminating_since = {}
        self.wake = threading.Event()
        self.records_at = 0.0
        self.records = {}
        self.flannel_leases = {}  # node -> the lease its running flannel reported (heartbeats)
        self.sync_now = True
        self.tick_seconds = 0.2
        self.grace = env_float("K3S_STANDIN_NODE_GRACE", 20)
        self.ready_delay = env_float("K3S_STANDIN_NODE_READY_SECONDS", 1.0)
        self.start_delay = env_float("K3S_STANDIN_POD_START_SECONDS", 0.3)
        self.mig_seconds = env_float("K3S_STANDIN_MIG_SECONDS", 1.5)
        self.errors = 0

    # -- helpers ---------------------------------------------------------------
    def R(self, plural, group=""):
        return self.api.R(plural, group)

    def put(self, res, obj):
        """Write obj if it differs from what is stored (internal writes skip validation)."""
        meta = obj["metadata"]
        old = self.store.get(res, meta.get("namespace", ""), meta["name"])
        if old is not None and canonical({k: v for k, v in obj.items() if k != "metadata"}) == canonical(
                {k: v for k, v in old.items() if k != "metadata"}) and canonical(
                {k: v for k, v in meta.items() if k != "resourceVersion"}) == canonical(
                {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}):
            return old
        return self.store.put(res, obj, "MODIFIED" if old is not None else "ADDED")

    def new(self, res, obj):
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        if res.namespaced:
            meta.setdefault("namespace", "default")
        return self.store.put(res, obj, "ADDED")

    def event(self, obj, kind, etype, reason, message, component="default-scheduler", api_version="v1"):
        events = self.R("events")
        ns = deep(obj, "metadata", "namespace") or "default"
        uid = deep(obj, "metadata", "uid")
        for ev in self.store.items(events, ns):
            if deep(ev, "involvedObject", "uid") == uid and ev.get("reason") == reason and \
                    ev.get("message") == message:
                last = parse_iso(ev.get("lastTimestamp")) or 0
                if time.time() - last < 30:
                    return ev
                ev = copy.deepcopy(ev)
                ev["count"] = ev.get("count", 1) + 1
                ev["lastTimestamp"] = now_iso()
                return self.store.put(events, ev)
        name = "%s.%x" % (obj["metadata"]["name"], random.getrandbits(64))
        stamp = now_iso()
        ev = {"metadata": {"name": name, "namespace": ns},
              "involvedObject": {"kind": kind, "name": obj["metadata"]["name"], "uid": uid,
                                 "apiVersion": api_version, "resourceVersion": obj["metadata"].get("resourceVersion")},
              "reason": reason, "message": message, "type": etype, "count": 1, "firstTimestamp": stamp,
              "lastTimestamp": stamp, "source": {"component": component}, "reportingComponent": component,
              "reportingInstance": ""}
        if deep(obj, "metadata", "namespace"):
            ev["involvedObject"]["namespace"] = obj["metadata"]["namespace"]
        items = self.store.items(events)
        if len(items) > 2000:
            oldest = min(items, key=lambda e: int(e["metadata"]["resourceVersion"]))
            self.store.remove(events, oldest["metadata"]["namespace"], oldest["metadata"]["name"])
        return self.new(events, ev)

    def allocate_service_ip(self):
        n = self.store.sim.get("service_ip", 10) + 1
        self.store.sim["service_ip"] = n
        return "10.43.%d.%d" % (n // 250, n % 250 + 1)

    def default_storage_class(self):
        for sc in self.store.items(self.R("storageclasses", "storage.k8s.io")):
            if deep(sc, "metadata", "annotations", "storageclass.kubernetes.io/is-default-class") == "true":
                return sc["metadata"]["name"]
        return None

    # -- lifecycle ---------------------------------------------------------------
    def start(self):
        threading.Thread(target=self.loop, name="kubeapi-simulator", daemon=True).start()

    def loop(self):
        while not self.api.stopping.is_set():
            self.wake.wait(self.tick_seconds)
            self.wake.clear()
            try:
                with self.store.lock:
                    self.tick()
            except Exception:  # keep simulating; say what went wrong once in a while
                self.errors += 1
                if self.errors < 20 or self.errors % 100 == 0:
                    import traceback
                    sys.stderr.write('time="%s" level=error msg=%s\n' % (
                        now_iso(), json.dumps("kubeapi simulator: %s" % traceback.format_exc(limit=4))))
                    sys.stderr.flush()

    def heartbeat(self, name, lease=None):
        """The node's k3s runs; `lease`: its flannel's lease attributes (backend-type,
        backend-data, public-ip), once flannel registered its network."""
        self.last_seen[name] = time.monotonic()
        if lease:
            self.flannel_leases[name] = dict(lease)

    # k3s's node password check (k3s-io/k3s pkg/nodepassword/nodepassword.go, ensure and
    # verifyHash, v1.33 line): a <node>.node-password.k3s secret in kube-system holds a hash of
    # the node's /etc/rancher/node/password; a node whose password does not match it is
    # refused (pkg/nodepassword/validate.go answers 403) until the secret goes, which it does
    # with the Node (the secret is owned by it, pkg/nodepassword/controller.go; see
    # `deleted`). The stand-in keeps the password's sha256 where k3s keeps an scrypt hash.
    def node_password(self, name, password_sha256):
        """True when `name` may use this password: it matches the secret, or there was no
        secret and one is made (as k3s's ensure does)."""
        secrets = self.R("secrets")
        wanted = base64.b64encode((password_sha256 or "").encode()).decode()
        with self.store.lock:
            secret = self.store.get(secrets, "kube-system", name + ".node-password.k3s")
            if secret is not None:
                return (secret.get("data") or {}).get("hash") == wanted
            self.new(secrets, self.node_password_secret(name, password_sha256))
            return True

    def node_password_secret(self, name, password_sha256):
        return {"metadata": {"name": name + ".node-password.k3s", "namespace": "kube-system",
                             "labels": {"node.k3s.cattle.io/name": name}},
                "type": "k3s.cattle.io/node-password", "immutable": True,
                "data": {"hash": base64.b64encode((password_sha256 or "").encode()).decode()}}

    def deferred_node_password(self, name, password_sha256):
        """A server's own node: k3s verifies it against the local password file while its
        apiserver is not up yet, and checks the secret later, only recording the outcome on
        the Node (pkg/nodepassword/validate.go, verifyLocalPassword and ensureSecret:
        "As the node has already joined the cluster at this point, this is purely
        informational")."""
        with self.store.lock:
            if self.node_password(name, password_sha256):
                return
            ref = {"metadata": {"name": name, "uid": name, "namespace": ""}}
            self.event(ref, "Node", "Warning", "NodePasswordValidationFailed",
                       "Deferred node password secret validation failed: unable to verify password for node %s: "
                       "hash does not match" % name, "k3s-supervisor")

    def joined(self, record):
        self.last_seen[record["name"]] = time.monotonic()
        self.sync_now = True
        self.wake.set()

    def bootstrap(self, first):
        """k3s's own objects (first start), and what a restart re-applies."""
        with self.store.lock:
            opts = self.api.options
            disabled = set(opts.get("disable") or [])
            nsres = self.R("namespaces")
            if first:
                for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                    self.api.create(nsres, None, {"metadata": {"name": ns}})
                crd = self.R("customresourcedefinitions", "apiextensions.k8s.io")
                presets = os.environ.get("K3S_STANDIN_API_PRESETS", DEFAULT_PRESETS)
                defs = list(K3S_CRDS)
                for preset in [p.strip() for p in presets.split(",") if p.strip() and p.strip() != "none"]:
                    defs += PRESETS.get(preset, [])
                for d in defs:
                    self.api.create(crd, None, crd_object(*d))
                svc = self.R("services")
                self.api.create(svc, "default", {"metadata": {"name": "kubernetes", "labels": {
                    "component": "apiserver", "provider": "kubernetes"}}, "spec": {
                    "clusterIP": "10.43.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                                                         "targetPort": 6443}]}})
                pc = self.R("priorityclasses", "scheduling.k8s.io")
                for name, value in (("system-cluster-critical", 2000000000), ("system-node-critical", 2000001000)):
                    self.api.create(pc, None, {"metadata": {"name": name}, "value": value,
                                               "description": "Used for system critical pods that must run in the "
                                                              "cluster, but can be moved to another node if necessary."})
                if self._has("queues", "scheduling.volcano.sh"):  # what Volcano creates when installed
                    q = self.R("queues", "scheduling.volcano.sh")
                    for name in ("root", "default"):
                        self.api.create(q, None, {"metadata": {"name": name}, "spec": {"weight": 1,
                                                                                       "reclaimable": name != "root"}})
            packaged = {
                "coredns": [("deployments", "apps", "kube-system", "coredns"), ("services", "", "kube-system", "kube-dns")],
                "local-storage": [("deployments", "apps", "kube-system", "local-path-provisioner"),
                                  ("storageclasses", "storage.k8s.io", "", "local-path")],
                "metrics-server": [("deployments", "apps", "kube-system", "metrics-server")],
                "traefik": [("deployments", "apps", "kube-system", "traefik")],
                "runtimes": [("runtimeclasses", "node.k8s.io", "", n) for n in (
                    "crun", "lunatic", "nvidia", "nvidia-experimental", "slight", "spin", "wasmedge", "wasmer",
                    "wasmtime", "wws")],
            }
            for component, objects in packaged.items():
                for plural, group, ns, name in objects:
                    res = self.R(plural, group)
                    exists = self.store.get(res, ns, name) is not None
                    if component in disabled and exists:
                        self.store.remove(res, ns, name)
                    elif component not in disabled and not exists:
                        self.api.create(res, ns or None, self.packaged_object(plural, name), internal=True)

    def _has(self, plural, group):
        try:
            self.R(plural, group)
            return True
        except KeyError:
            return False

    @staticmethod
    def packaged_object(plural, name):
        labels = {"k8s-app": "kube-dns" if name == "coredns" else name}
        if plural == "deployments":
            return {"metadata": {"name": name, "labels": labels}, "spec": {
                "replicas": 1, "selector": {"matchLabels": labels}, "template": {
                    "metadata": {"labels": labels}, "spec": {
                        "containers": [{"name": name, "image": "rancher/mirrored-%s:standin" % name}],
                        "priorityClassName": "system-cluster-critical"}}}}
        if plural == "services":
            return {"metadata": {"name": name, "labels": labels}, "spec": {
                "clusterIP": "10.43.0.10", "selector": {"k8s-app": "kube-dns"},
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53,
                                                                          "protocol": "TCP"}]}}
        if plural == "storageclasses":
            return {"metadata": {"name": name, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true",
                "objectset.rio.cattle.io/id": "", "defaultVolumeType": "local"}},
                "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete",
                "volumeBindingMode": "WaitForFirstConsumer"}
        if plural == "runtimeclasses":
            return {"metadata": {"name": name}, "handler": name}
        return {"metadata": {"name": name}}

    # -- hooks from the API (store lock held) ------------------------------------
    def created(self, res, obj):
        if res.kind == "Namespace" and not res.crd:
            ns = obj["metadata"]["name"]
            sa = self.R("serviceaccounts")
            if self.store.get(sa, ns, "default") is None:
                self.new(sa, {"metadata": {"name": "default", "namespace": ns}})
            cm = self.R("configmaps")
            if self.store.get(cm, ns, "kube-root-ca.crt") is None:
                self.new(cm, {"metadata": {"name": "kube-root-ca.crt", "namespace": ns, "annotations": {
                    "kubernetes.io/description": "Contains a CA bundle that can be used to verify the "
                                                 "kube-apiserver when using internal endpoints such as the internal "
                                                 "service IP or kubernetes.default.svc. No other usage is guaranteed "
                                                 "across distributions of Kubernetes clusters."}},
                              "data": {"ca.crt": self.api.options.get("ca") or ""}})
        self.wake.set()

    def updated(self, res, old, new):
        self.wake.set()

    def terminating(self, res, obj, policy):
        if res.kind == "Namespace" and not res.crd:
            self.terminating_since[obj["metadata"]["name"]] = time.monotonic()
        self.wake.set()

    def deleted(self, res, gone, policy):
        uid = gone["metadata"].get("uid")
        if res.kind == "Node" and not res.crd:
            name = gone["metadata"]["name"]
            self.flannel_leases.pop(name, None)
            self.store.remove(self.R("secrets"), "kube-system", name + ".node-password.k3s")
            # k3s-io/k3s pkg/etcd/member_controller.go, onRemove: a deleted etcd node's member
            # is removed from the cluster (unless the removal annotation already did it).
            if deep(gone, "metadata", "labels", "node-role.kubernetes.io/etcd") == "true" and \
                    self.api.cluster is not None and hasattr(self.api.cluster, "etcd_removed"):
                try:
                    self.api.cluster.etcd_removed(name)
                except Exception:
                    pass
            for pod in self.store.items(self.R("pods")):
                if deep(pod, "spec", "nodeName") == name:
                    self.remove_pod(pod)
        elif res.kind == "Pod" and not res.crd:
            self.forget_pod(gone)
        elif res.kind == "PersistentVolumeClaim" and not res.crd:
            pv_name = deep(gone, "spec", "volumeName")
            pvres = self.R("persistentvolumes")
            pv = self.store.get(pvres, "", pv_name) if pv_name else None
            if pv is not None:
                if deep(pv, "spec", "persistentVolumeReclaimPolicy") == "Delete":
                    self.store.remove(pvres, "", pv_name)
                    self.store.volumes.pop("pv:" + pv_name, None)
                else:
                    pv = copy.deepcopy(pv)
                    pv["status"] = {"phase": "Released"}
                    self.put(pvres, pv)
        if uid:
            if policy == "Orphan":
                for table in self.store.objects.values():
                    for obj in list(table.values()):
                        refs = deep(obj, "metadata", "ownerReferences") or []
                        if any(r.get("uid") == uid for r in refs):
                            obj = copy.deepcopy(obj)
                            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                            if not obj["metadata"]["ownerReferences"]:
                                del obj["metadata"]["ownerReferences"]
                            self.store.put(self._res_of(obj), obj)
            else:
                self.gc_uids.add(uid)
        self.wake.set()

    def _res_of(self, obj):
        for key, table in self.store.objects.items():
            if any(o is obj or (o["metadata"].get("uid") == obj["metadata"].get("uid")) for o in table.values()):
                return next(r for r in self.api.resources() if r.key == key)
        raise KeyError(obj["metadata"]["name"])

    def remove_pod(self, pod):
        gone = self.store.remove(self.R("pods"), pod["metadata"]["namespace"], pod["metadata"]["name"])
        if gone:
            self.forget_pod(gone)
            self.gc_uids.add(gone["metadata"]["uid"])

    def forget_pod(self, pod):
        meta = pod["metadata"]
        self.timers.pop(meta.get("uid"), None)
        prefix = "%s/%s/" % (meta.get("namespace"), meta["name"])
        for key in [k for k in self.store.logs if k.startswith(prefix)]:
            del self.store.logs[key]
        for key in [k for k in self.store.volumes if k.startswith("pod:%s:" % meta.get("uid"))]:
            del self.store.volumes[key]

    # -- the tick ------------------------------------------------------------------
    def tick(self):
        self.sync_nodes()
        self.node_health()
        self.devices()
        self.etcd_removal()
        self.namespaces()
        self.storage()
        self.batch_jobs()
        self.workload_status()
        self.volcano_jobs()
        self.schedule()
        self.volcano_schedule()
        self.kubelets()
        self.volcano_status()
        self.garbage_collect()

    # -- nodes ---------------------------------------------------------------------
    def sync_nodes(self):
        cluster = self.api.cluster
        if cluster is None:
            return
        now = time.monotonic()
        if self.sync_now or now - self.records_at > 2:
            self.records = cluster.records()
            self.records_at, self.sync_now = now, False
        me = self.api.node_name
        if me:
            self.last_seen[me] = now
        registered = self.store.sim.setdefault("registered", {})
        nodes = self.R("nodes")
        for name, rec in sorted(self.records.items()):
            stamp = rec.get("registered_at") or rec.get("joined_at") or "0"
            node = self.store.get(nodes, "", name)
            if registered.get(name) == stamp:
                continue
            registered[name] = stamp
            self.store.dirty = True
            self.last_seen.setdefault(name, now)
            if node is None:
                node = self.node_object(rec)
                node = self.new(nodes, node)
                self.event(node, "Node", "Normal", "RegisteredNode", "Node %s event: Registered Node %s in "
                           "Controller" % (name, name), "node-controller")
                secrets = self.R("secrets")
                if self.store.get(secrets, "kube-system", name + ".node-password.k3s") is None:
                    self.new(secrets, self.node_password_secret(name, rec.get("password_sha256")))
            else:
                node = copy.deepcopy(node)
                fresh = self.node_object(rec)
                node["status"]["nodeInfo"] = fresh["status"]["nodeInfo"]
                # k3s-io/k3s pkg/agent/run.go updateAddressAnnotations merges its address
                # annotations into the Node's (labels.Merge): a key it no longer sets (an
                # external IP taken out of the config) stays, and so does the address the
                # cloud provider derives from it.
                annotations = node["metadata"].setdefault("annotations", {})
                annotations.update(fresh["metadata"]["annotations"])
                annotations["k3s.io/standin-registered-at"] = stamp
                node["status"]["addresses"] = node_addresses(annotations, name)
                self.put(nodes, node)
            self.store.sim.setdefault("ready_after", {})[name] = time.time() + self.ready_delay
        self.sync_api_endpoints()

    def sync_api_endpoints(self):
        """The `kubernetes` Service's Endpoints (default namespace): each server's advertise
        address on its port, as kube-apiserver's endpoint reconciler publishes its
        --advertise-address (k3s sets it from advertise-address, else node-external-ip, else
        node-ip: k3s-io/k3s pkg/cli/server/server.go, pkg/daemons/control/server.go). In-cluster
        clients and the agents' load balancers (pkg/agent/tunnel/tunnel.go) go there."""
        servers = sorted({rec["advertise"] for rec in self.records.values()
                          if rec.get("role") == "server" and rec.get("advertise")})
        if not servers:
            return
        subsets = [{"addresses": [{"ip": a.rsplit(":", 1)[0].strip("[]")} for a in servers],
                    "ports": [{"name": "https", "port": int(servers[0].rsplit(":", 1)[1]), "protocol": "TCP"}]}]
        endpoints = self.R("endpoints")
        current = self.store.get(endpoints, "default", "kubernetes")
        if current is None:
            self.new(endpoints, {"metadata": {"name": "kubernetes", "namespace": "default",
                                              "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                                 "subsets": subsets})
        elif current.get("subsets") != subsets:
            current = copy.deepcopy(current)
            current["subsets"] = subsets
            self.put(endpoints, current)

    def node_object(self, rec):
        name = rec["name"]
        hw = rec.get("hardware") or {}
        address = rec.get("address") or "127.0.0.1"
        labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "node.kubernetes.io/instance-type": "k3s", "beta.kubernetes.io/instance-type": "k3s"}
        if rec.get("role") == "server":
            labels["node-role.kubernetes.io/control-plane"] = "true"
            labels["node-role.kubernetes.io/master"] = "true"
            if rec.get("etcd"):
                labels["node-role.kubernetes.io/etcd"] = "true"
        for item in rec.get("labels") or []:
            key, sep, value = str(item).partition("=")
            if sep and key:
                labels[key.strip()] = value.strip()
        gpus = hw.get("gpus") or {}
        if gpus.get("count"):
            labels.update(self.gfd_labels(gpus))
        taints = [t for t in (parse_taint(str(x)) for x in rec.get("taints") or []) if t]
        cpu = hw.get("cpu") or 1
        mem_kib = hw.get("memory_kib") or 4 * 1024 * 1024
        eph_kib = hw.get("ephemeral_kib") or 60 * 1024 * 1024
        capacity = {"cpu": str(cpu), "memory": "%dKi" % mem_kib, "pods": "110", "ephemeral-storage": "%dKi" % eph_kib,
                    "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
        allocatable = dict(capacity, memory="%dKi" % max(0, mem_kib - 102400),
                           **{"ephemeral-storage": str(int(eph_kib * 1024 * 0.9))})
        annotations = self.address_annotations(rec, name, address)
        seed = hashlib.sha256(name.encode()).hexdigest()
        stamp = now_iso()
        not_ready = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                     "message:Network plugin returns error: cni plugin not initialized")
        spec = {"podCIDR": rec.get("pod_cidr") or "10.42.0.0/24", "podCIDRs": [rec.get("pod_cidr") or "10.42.0.0/24"],
                "providerID": "k3s://" + name}
        if taints:
            spec["taints"] = taints
        return {
            "metadata": {"name": name, "labels": labels, "annotations": dict(annotations, **{
                "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "k3s.io/standin-registered-at": rec.get("registered_at") or ""})},
            "spec": spec,
            "status": {
                "capacity": capacity, "allocatable": allocatable, "addresses": node_addresses(annotations, name),
                "conditions": [
                    self.condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                                   "kubelet has sufficient memory available", stamp),
                    self.condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure",
                                   stamp),
                    self.condition("PIDPressure", "False", "KubeletHasSufficientPID",
                                   "kubelet has sufficient PID available", stamp),
                    self.condition("Ready", "False", "KubeletNotReady", not_ready, stamp)],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.UUID(seed[:32])),
                             "containerRuntimeVersion": "containerd://2.0.5-k3s1",
                             "kernelVersion": hw.get("kernel") or "6.1.0", "kubeProxyVersion": rec.get("version") or "",
                             "kubeletVersion": rec.get("version") or "",
                             "machineID": hw.get("machine_id") or seed[:32],
                             "operatingSystem": "linux", "osImage": hw.get("os_image") or "Debian GNU/Linux 12 (bookworm)",
                             "systemUUID": str(uuid.UUID(seed[32:64]))},
                "images": []},
        }

    def address_annotations(self, rec, name, address):
        """What k3s writes on its Node: k3s-io/k3s pkg/agent/run.go (commit 0097157)
        updateAddressAnnotations: k3s.io/hostname, k3s.io/internal-ip (every node-ip,
        comma-joined), k3s.io/external-ip (every node-external-ip), and with the server's
        flannel-external-ip flannel.alpha.coreos.com/public-ip-overwrite (IPv4) and
        public-ipv6-overwrite (IPv6), the address flannel's peers use for this node (also set by
        pkg/agent/flannel/setup.go setAnnotations)."""
        internal = [a for a in rec.get("node_ips") or [address] if a]
        external = [a for a in rec.get("external_ips") or ([rec["external_ip"]] if rec.get("external_ip") else [])
                    if a]
        out = {"k3s.io/hostname": name, "k3s.io/internal-ip": ",".join(internal)}
        if external:
            out["k3s.io/external-ip"] = ",".join(external)
            if (self.api.options.get("flannel") or {}).get("external_ip"):
                for ip in external:
                    key = "public-ipv6-overwrite" if ":" in ip else "public-ip-overwrite"
                    out["flannel.alpha.coreos.com/" + key] = ip
        return out

    def flannel_backend(self):
        return (self.api.options.get("flannel") or {}).get("backend") or "vxlan"

    def network_ready(self, name):
        """The node's flannel registered its network (its lease came), or the cluster runs no
        flannel: until then its kubelet reports the CNI not initialized (NotReady), as a node
        whose flannel failed (a missing WireGuard module) never gets a pod network."""
        return self.flannel_backend() == "none" or name in self.flannel_leases

    def apply_flannel_lease(self, node):
        """flannel-io/flannel pkg/subnet/kube/kube.go (commit cdf760595c23292fd03ff4daf03638ac1ceef417),
        AcquireLease: the lease on the Node's annotations; public-ip is public-ip-overwrite when
        that is set (what k3s sets for flannel-external-ip), else the lease's address (the
        flannel interface's)."""
        lease = self.flannel_leases.get(node["metadata"]["name"])
        if not lease:
            return
        ann = node["metadata"].setdefault("annotations", {})
        prefix = "flannel.alpha.coreos.com/"
        ann[prefix + "backend-type"] = lease.get("backend-type") or ""
        ann[prefix + "backend-data"] = lease.get("backend-data") or "null"
        ann[prefix + "public-ip"] = ann.get(prefix + "public-ip-overwrite") or lease.get("public-ip") or ""
        ann[prefix + "kube-subnet-manager"] = "true"

    @staticmethod
    def condition(ctype, status, reason, message, stamp):
        return {"type": ctype, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp}

    def gfd_labels(self, gpus):
        model = gpus.get("model") or "NVIDIA GPU"
        info = GPU_MODELS.get(model, {})
        labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": gpu_product(model),
                  "nvidia.com/gpu.count": str(gpus.get("count", 0))}
        if info:
            labels["nvidia.com/gpu.memory"] = str(info["memory"])
            labels["nvidia.com/gpu.family"] = info["family"]
            labels["nvidia.com/mig.capable"] = "true" if info.get("mig") else "false"
        return labels

    def node_health(self):
        nodes = self.R("nodes")
        now, wall = time.monotonic(), time.time()
        ready_after = self.store.sim.setdefault("ready_after", {})
        for node in self.store.items(nodes):
            name = node["metadata"]["name"]
            seen = self.last_seen.get(name)
            if seen is None:
                self.last_seen[name] = seen = now
            conds = {c["type"]: c for c in node["status"].get("conditions") or []}
            ready = conds.get("Ready", {}).get("status")
            want = ready
            if now - seen > self.grace:
                want = "Unknown"
            elif wall >= ready_after.get(name, 0) and self.network_ready(name):
                want = "True"
            elif ready != "True":
                want = "False"
            new = copy.deepcopy(node)
            self.apply_flannel_lease(new)
            if want != ready:
                stamp = now_iso()
                if want == "Unknown":
                    new["status"]["conditions"] = [
                        self.condition(c["type"], "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node "
                                       "status.", stamp) | {"lastHeartbeatTime": c.get("lastHeartbeatTime", stamp)}
                        for c in node["status"]["conditions"]]
                    self.event(node, "Node", "Normal", "NodeNotReady", "Node %s status is now: NodeNotReady" % name,
                               "node-controller")
                elif want == "True":
                    new["status"]["conditions"] = [
                        self.condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                                       "kubelet has sufficient memory available", stamp),
                        self.condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                                       "kubelet has no disk pressure", stamp),
                        self.condition("PIDPressure", "False", "KubeletHasSufficientPID",
                                       "kubelet has sufficient PID available", stamp),
                        self.condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", stamp)]
                    self.event(node, "Node", "Normal", "NodeReady", "Node %s status is now: NodeReady" % name,
                               "kubelet")
            # taints the node lifecycle controller keeps
            taints = [t for t in new["spec"].get("taints") or [] if t.get("key") not in (
                "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unschedulable")]
            old_taints = {(t.get("key"), t.get("effect")): t for t in new["spec"].get("taints") or []}
            extra = []
            if want == "Unknown":
                extra = [("node.kubernetes.io/unreachable", "NoSchedule"), ("node.kubernetes.io/unreachable", "NoExecute")]
            elif want == "False":
                extra = [("node.kubernetes.io/not-ready", "NoSchedule")]
            if new["spec"].get("unschedulable"):
                extra.append(("node.kubernetes.io/unschedulable", "NoSchedule"))
            for key, effect in extra:
                taints.append(old_taints.get((key, effect)) or {"key": key, "effect": effect,
                                                                "timeAdded": now_iso()})
            if taints:
                new["spec"]["taints"] = taints
            else:
                new["spec"].pop("taints", None)
            self.put(nodes, new)

    def etcd_removal(self):
        nodes = self.R("nodes")
        for node in self.store.items(nodes):
            ann = deep(node, "metadata", "annotations") or {}
            if ann.get("etcd.k3s.cattle.io/remove") == "true" and "etcd.k3s.cattle.io/removed-node-name" not in ann:
                if deep(node, "metadata", "labels", "node-role.kubernetes.io/etcd") != "true":
                    continue
                name = node["metadata"]["name"]
                new = copy.deepcopy(node)
                member = (self.records.get(name) or {}).get("member") or \
                    "%s-%s" % (name, (self.api.options.get("ca_hash") or "")[:8])
                new["metadata"]["annotations"]["etcd.k3s.cattle.io/removed-node-name"] = member
                self.put(nodes, new)
                self.event(node, "Node", "Normal", "MemberRemoved", "Removed member %s from etcd cluster" % member,
                           "k3s-supervisor")
                if self.api.cluster is not None and hasattr(self.api.cluster, "etcd_removed"):
                    try:
                        self.api.cluster.etcd_removed(name)
                    except Exception:
                        pass

    # -- GPUs (GFD, device plugin, MIG manager) and RDMA ---------------------------
    def cluster_policy(self):
        if not self._has("clusterpolicies", "nvidia.com"):
            return None
        items = self.store.items(self.R("clusterpolicies", "nvidia.com"))
        return items[0] if items else None

    def gpu_operator_active(self, policy):
        """K3S_STANDIN_DEVICE_PLUGIN=always (default): the device plugin and MIG manager run on
        every GPU node (tests record Helm instead of installing the GPU Operator); =operator:
        only once the operator shows (a ClusterPolicy, the device plugin ConfigMap, or a
        DaemonSet in namespace gpu-operator)."""
        if os.environ.get("K3S_STANDIN_DEVICE_PLUGIN", "always") != "operator" or policy is not None:
            return True
        cm_name = "bootstrap-device-plugin-config"
        if self.store.get(self.R("configmaps"), "gpu-operator", cm_name) is not None:
            return True
        return bool(self.store.items(self.R("daemonsets", "apps"), "gpu-operator"))

    def mig_layouts(self, policy):
        name = deep(policy or {}, "spec", "migManager", "config", "name") or "bootstrap-mig-parted-config"
        cm = self.store.get(self.R("configmaps"), "gpu-operator", name)
        if cm is None or "config.yaml" not in (cm.get("data") or {}):
            return dict(BUILTIN_MIG_LAYOUTS), None
        try:
            config = load_yaml(cm["data"]["config.yaml"]) or {}
        except YamlError as exc:
            return {}, "error parsing config file %s/config.yaml: %s" % (name, exc)
        layouts = {}
        for layout, entries in (config.get("mig-configs") or {}).items():
            devices, enabled = {}, False
            for entry in entries or []:
                enabled = enabled or bool(entry.get("mig-enabled"))
                for profile, count in (entry.get("mig-devices") or {}).items():
                    devices[str(profile)] = count
            layouts[layout] = devices if enabled else None
        return layouts, None

    def devices(self):
        nodes = self.R("nodes")
        policy = self.cluster_policy()
        operator = self.gpu_operator_active(policy)
        dp_name = deep(policy or {}, "spec", "devicePlugin", "config", "name") or "bootstrap-device-plugin-config"
        dp_default = deep(policy or {}, "spec", "devicePlugin", "config", "default")
        dp_cm = self.store.get(self.R("configmaps"), "gpu-operator", dp_name)
        rdma_cm = self.store.get(self.R("configmaps"), "kube-system", "rdma-devices")
        rdma_entries = []
        if rdma_cm is not None:
            try:
                rdma_entries = json.loads((rdma_cm.get("data") or {}).get("config.json") or "{}").get("configList") or []
            except ValueError:
                rdma_entries = []
        layouts = None
        mig_state = self.store.sim.setdefault("mig", {})
        for node in self.store.items(nodes):
            name = node["metadata"]["name"]
            rec = self.records.get(name) or {}
            hw = rec.get("hardware") or {}
            gpus = hw.get("gpus") or {}
            new = copy.deepcopy(node)
            labels = new["metadata"].setdefault("labels", {})
            extended = {}
            count = gpus.get("count") or 0
            if count:
                model = gpus.get("model") or "NVIDIA GPU"
                labels.update(self.gfd_labels(gpus))
                for key in [k for k in labels if re.fullmatch(r"nvidia\.com/mig-.+\.count", k)]:
                    del labels[key]
                for key in ("nvidia.com/gpu.replicas", "nvidia.com/gpu.sharing-strategy"):
                    labels.pop(key, None)
                mine = mig_state.setdefault(name, {"applied": None, "devices": None})
                if operator:
                    want = labels.get("nvidia.com/mig.config")
                    if want is not None and want != mine.get("target"):
                        mine.update(target=want, since=time.time(), state="pending", reason=None)
                    if mine.get("state") == "pending" and time.time() - mine.get("since", 0) >= self.mig_seconds:
                        if layouts is None:
                            layouts, layouts_error = self.mig_layouts(policy)
                        target = mine["target"]
                        if layouts_error:
                            reason = layouts_error
                        elif target not in layouts:
                            reason = ("error validating configuration: selected mig-config not present: %s "
                                      "(known: %s)" % (target, ", ".join(sorted(layouts))))
                        else:
                            reason = mig_layout_error(target, layouts[target], model) if layouts[target] else None
                        annotations = new["metadata"].setdefault("annotations", {})
                        if reason:
                            annotations["nvidia.com/mig.config.state.reason"] = reason
                            mine.update(state="failed", reason=reason)
                            self.event(node, "Node", "Warning", "MigConfigFailed", "Failed to apply MIG config %s: %s"
                                       % (target, reason), "nvidia-mig-manager")
                        else:
                            annotations.pop("nvidia.com/mig.config.state.reason", None)
                            mine.update(state="success", applied=target, devices=layouts[target], reason=None)
                            self.event(node, "Node", "Normal", "MigConfigApplied", "Applied MIG config %s" % target,
                                       "nvidia-mig-manager")
                        self.store.dirty = True
                    if mine.get("state"):
                        labels["nvidia.com/mig.config.state"] = mine["state"]
                    extended, more_labels, error = self.device_plugin(
                        node, labels, count, model, mine.get("devices"), policy, dp_cm, dp_default)
                    labels.update(more_labels)
                    if error:
                        self.event(node, "Node", "Warning", "DevicePluginConfigError", error, "nvidia-device-plugin")
            if rdma_entries:
                for entry in rdma_entries:
                    if self.rdma_matches(entry, hw.get("rdma") or []):
                        resource = "%s/%s" % (entry.get("resourcePrefix") or "rdma", entry.get("resourceName"))
                        extended[resource] = str(entry.get("rdmaHcaMax", 1000))
            for field in ("capacity", "allocatable"):
                res = new["status"].setdefault(field, {})
                for key in [k for k in res if k.startswith(("nvidia.com/", "rdma/")) or
                            k in self.store.sim.get("extended_names", [])]:
                    del res[key]
                res.update(extended)
            names = set(self.store.sim.get("extended_names", [])) | set(extended)
            self.store.sim["extended_names"] = sorted(names)
            self.put(nodes, new)

    def device_plugin(self, node, labels, count, model, mig_devices, policy, dp_cm, dp_default):
        """-> (extended resources, labels, error)."""
        key = labels.get("nvidia.com/device-plugin.config") or dp_default
        config = {}
        if key:
            text = (dp_cm or {}).get("data", {}).get(key) if dp_cm else None
            if text is None:
                return ({"nvidia.com/gpu": "0"}, {},
                        "unable to load device plugin config %r: not found in ConfigMap gpu-operator/%s"
                        % (key, deep(policy or {}, "spec", "devicePlugin", "config", "name")
                           or "bootstrap-device-plugin-config"))
            try:
                config = load_json_or_yaml(text) or {}
            except (YamlError, ValueError) as exc:
                return {"nvidia.com/gpu": "0"}, {}, "unable to parse device plugin config %r: %s" % (key, exc)
        strategy = labels.get("nvidia.com/mig.strategy") or deep(policy or {}, "spec", "mig", "strategy")
        if not strategy:
            flag = deep(config, "flags", "migStrategy")
            strategy = flag if flag in ("single", "mixed") else "single"
        sharing = config.get("sharing") or {}
        mode, rename, replicas = "none", False, {}
        for kind, label in (("timeSlicing", "time-slicing"), ("mps", "mps")):
            block = sharing.get(kind) or {}
            for item in block.get("resources") or []:
                # NVIDIA/k8s-device-plugin api/config/v1/replicas.go, ReplicatedResource.UnmarshalJSON
                # (v0.20.0): "no replicas specified", "number of replicas must be >= 2"; the
                # config fails to load and the plugin advertises nothing.
                if "replicas" not in item:
                    return {"nvidia.com/gpu": "0"}, {}, "unable to load config: no replicas specified"
                try:
                    wanted = int(item["replicas"])
                except (TypeError, ValueError):
                    return {"nvidia.com/gpu": "0"}, {}, "unable to load config: replicas: not an integer"
                if wanted < 2:
                    return {"nvidia.com/gpu": "0"}, {}, "unable to load config: number of replicas must be >= 2"
                replicas[item.get("name")] = wanted
                mode = label
                rename = bool(block.get("renameByDefault")) or bool(item.get("rename"))
        # The operator sets MIG_STRATEGY on the plugin from the ClusterPolicy's mig.strategy
        # (NVIDIA/gpu-operator controllers/object_controls.go, TransformDevicePlugin), over the
        # config's flags; and
        # NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go validateFlags refuses
        # "using --mig-strategy=mixed is not supported with MPS".
        if mode == "mps" and deep(policy or {}, "spec", "mig", "strategy") == "mixed":
            return {"nvidia.com/gpu": "0"}, {}, "using --mig-strategy=mixed is not supported with MPS"
        out, extra = {}, {}
        gpu_replicas = replicas.get("nvidia.com/gpu", 1)
        if mig_devices is not None:
            if not mig_devices:
                out["nvidia.com/gpu"] = "0"
            elif strategy == "single":
                if len(mig_devices) != 1:
                    return ({"nvidia.com/gpu": "0"}, {}, "invalid MIG configuration: the single strategy needs all MIG "
                            "devices of a node to be of one profile, got %s" % ", ".join(sorted(mig_devices)))
                (profile, per_gpu), = mig_devices.items()
                out["nvidia.com/gpu"] = str(per_gpu * count * gpu_replicas)
                extra.update({"nvidia.com/gpu.product": "%s-MIG-%s" % (gpu_product(model), profile),
                              "nvidia.com/gpu.count": str(per_gpu * count),
                              "nvidia.com/gpu.memory": str(MIG_MEMORY_MIB.get(profile, 0))})
            else:
                for profile, per_gpu in mig_devices.items():
                    resource = "nvidia.com/mig-" + profile
                    out[resource] = str(per_gpu * count * replicas.get(resource, 1))
                    extra["nvidia.com/mig-%s.count" % profile] = str(per_gpu * count)
                out["nvidia.com/gpu"] = "0"
            extra["nvidia.com/mig.strategy"] = strategy
        else:
            resource = "nvidia.com/gpu.shared" if rename and gpu_replicas > 1 else "nvidia.com/gpu"
            out[resource] = str(count * gpu_replicas)
            if resource != "nvidia.com/gpu":
                out["nvidia.com/gpu"] = "0"
            if gpu_replicas > 1 and not rename:
                extra["nvidia.com/gpu.product"] = gpu_product(model) + "-SHARED"
        extra["nvidia.com/gpu.replicas"] = str(gpu_replicas)
        extra["nvidia.com/gpu.sharing-strategy"] = mode if gpu_replicas > 1 else "none"
        return out, extra, None

    @staticmethod
    def rdma_matches(entry, hcas):
        selectors = entry.get("selectors") or {}
        names = set(entry.get("devices") or []) | set(selectors.get("ifNames") or [])
        vendors = {v.lower().replace("0x", "") for v in selectors.get("vendors") or []}
        device_ids = {v.lower().replace("0x", "") for v in selectors.get("deviceIDs") or []}
        for hca in hcas:
            if names and not names & set(hca.get("netdevs") or []):
                continue
            if vendors and hca.get("vendor", "").lower().replace("0x", "") not in vendors:
                continue
            if device_ids and hca.get("device", "").lower().replace("0x", "") not in device_ids:
                continue
            if names or vendors or device_ids:
                return True
        return False

    # -- namespaces ------------------------------------------------------------------
    def namespaces(self):
        nsres = self.R("namespaces")
        for ns in self.store.items(nsres):
            if deep(ns, "status", "phase") != "Terminating":
                continue
            name = ns["metadata"]["name"]
            since = self.terminating_since.setdefault(name, time.monotonic())
            if time.monotonic() - since < 1.0:  # what the namespace controller takes, about
                continue
            kept = False
            for res in self.api.resources():
                if not res.namespaced:
                    continue
                for obj in self.store.items(res, name):
                    if deep(obj, "metadata", "finalizers"):  # stays (deleted) until its finalizers go
                        kept = True
                        if not deep(obj, "metadata", "deletionTimestamp"):
                            marked = copy.deepcopy(obj)
                            marked["metadata"]["deletionTimestamp"] = now_iso()
                            self.store.put(res, marked)
                        continue
                    gone = self.store.remove(res, name, obj["metadata"]["name"])
                    if gone:
                        self.deleted(res, gone, "Background")
            if not kept:
                self.terminating_since.pop(name, None)
                self.store.remove(nsres, "", name)

    # -- storage ---------------------------------------------------------------------
    def storage(self):
        pvcs = self.R("persistentvolumeclaims")
        classes = {sc["metadata"]["name"]: sc for sc in self.store.items(self.R("storageclasses", "storage.k8s.io"))}
        default = self.default_storage_class()
        pods = self.store.items(self.R("pods"))
        used = collections.defaultdict(list)
        for pod in pods:
            for vol in deep(pod, "spec", "volumes", default=[]) or []:
                claim = deep(vol, "persistentVolumeClaim", "claimName")
                if claim:
                    used[(pod["metadata"]["namespace"], claim)].append(pod)
        for pvc in self.store.items(pvcs):
            ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
            new = copy.deepcopy(pvc)
            if deep(pvc, "metadata", "deletionTimestamp"):
                users = [p for p in used.get((ns, name), []) if deep(p, "status", "phase") not in ("Succeeded", "Failed")]
                if not users:
                    new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or []
                                                     if f != "kubernetes.io/pvc-protection"]
                    if not new["metadata"]["finalizers"]:
                        gone = self.store.remove(pvcs, ns, name)
                        self.deleted(pvcs, gone, "Background")
                        continue
                self.put(pvcs, new)
                continue
            if deep(pvc, "status", "phase") != "Pending":
                continue
            spec = new["spec"]
            if "storageClassName" not in spec and default:
                spec["storageClassName"] = default  # retroactive default class assignment
            cls = spec.get("storageClassName")
            if cls == "":
                self.bind_static(new)
            elif cls not in classes:
                if cls:
                    self.event(pvc, "PersistentVolumeClaim", "Warning", "ProvisioningFailed",
                               'storageclass.storage.k8s.io "%s" not found' % cls, "persistentvolume-controller")
                else:
                    self.event(pvc, "PersistentVolumeClaim", "Normal", "FailedBinding",
                               "no persistent volumes available for this claim and no storage class is set",
                               "persistentvolume-controller")
            else:
                sc = classes[cls]
                selected = deep(new, "metadata", "annotations", "volume.kubernetes.io/selected-node")
                if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and not selected:
                    self.event(pvc, "PersistentVolumeClaim", "Normal", "WaitForFirstConsumer",
                               "waiting for first consumer to be created before binding", "persistentvolume-controller")
                else:
                    self.provision(new, sc, selected)
            self.put(pvcs, new)

    def provision(self, pvc, sc, node_name):
        pvs = self.R("persistentvolumes")
        meta = pvc["metadata"]
        pv_name = "pvc-" + meta["uid"]
        size = deep(pvc, "spec", "resources", "requests", "storage") or "1Gi"
        pv = {"metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": sc["provisioner"]},
                           "finalizers": ["kubernetes.io/pv-protection"]},
              "spec": {"capacity": {"storage": size}, "accessModes": list(deep(pvc, "spec", "accessModes") or []),
                       "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or "Delete",
                       "storageClassName": sc["metadata"]["name"], "volumeMode": deep(pvc, "spec", "volumeMode")
                       or "Filesystem",
                       "claimRef": {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                    "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1"}},
              "status": {"phase": "Bound"}}
        if sc["provisioner"] == "rancher.io/local-path":
            pv["spec"]["hostPath"] = {"path": "/var/lib/rancher/k3s/storage/%s_%s_%s" % (
                pv_name, meta["namespace"], meta["name"]), "type": "DirectoryOrCreate"}
            if node_name:
                pv["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}]}}
        else:
            pv["spec"]["csi"] = {"driver": sc["provisioner"], "volumeHandle": pv_name}
        if self.store.get(pvs, "", pv_name) is None:
            self.new(pvs, pv)
        self.bound(pvc, pv, sc["provisioner"])
        self.event(pvc, "PersistentVolumeClaim", "Normal", "ProvisioningSucceeded",
                   "Successfully provisioned volume %s" % pv_name, sc["provisioner"])

    def bound(self, pvc, pv, provisioner=None):
        pvc["spec"]["volumeName"] = pv["metadata"]["name"]
        ann = pvc["metadata"].setdefault("annotations", {})
        ann["pv.kubernetes.io/bind-completed"] = "yes"
        ann["pv.kubernetes.io/bound-by-controller"] = "yes"
        if provisioner:
            ann["volume.beta.kubernetes.io/storage-provisioner"] = provisioner
            ann["volume.kubernetes.io/storage-provisioner"] = provisioner
        pvc["status"] = {"phase": "Bound", "accessModes": list(deep(pv, "spec", "accessModes") or []),
                         "capacity": dict(deep(pv, "spec", "capacity") or {})}

    def bind_static(self, pvc):
        pvs = self.R("persistentvolumes")
        want = parse_quantity(deep(pvc, "spec", "resources", "requests", "storage") or "0")
        for pv in self.store.items(pvs):
            if deep(pv, "status", "phase") != "Available" or (deep(pv, "spec", "storageClassName") or "") != "":
                continue
            if parse_quantity(deep(pv, "spec", "capacity", "storage") or "0") < want:
                continue
            if not set(deep(pvc, "spec", "accessModes") or []) <= set(deep(pv, "spec", "accessModes") or []):
                continue
            pv = copy.deepcopy(pv)
            meta = pvc["metadata"]
            pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                      "name": meta["name"], "uid": meta["uid"], "apiVersion": "v1"}
            pv["status"] = {"phase": "Bound"}
            self.put(pvs, pv)
            self.bound(pvc, pv)
            return

    # -- batch/v1 Jobs, workload status -------------------------------------------------
    def owned(self, res, ns, uid):
        return [o for o in self.store.items(res, ns)
                if any(r.get("uid") == uid for r in deep(o, "metadata", "ownerReferences") or [])]

    def owner_ref(self, res, obj, version=None):
        return {"apiVersion": res.api_version(version), "kind": res.kind, "name": obj["metadata"]["name"],
                "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def pod_from_template(self, template, ns, name, owner_ref, extra_labels=None, annotations=None):
        template = copy.deepcopy(template or {})
        meta = template.get("metadata") or {}
        pod = {"metadata": {"name": name, "namespace": ns, "labels": dict(meta.get("labels") or {}, **(extra_labels or {})),
                            "annotations": dict(meta.get("annotations") or {}, **(annotations or {})),
                            "ownerReferences": [owner_ref]},
               "spec": template.get("spec") or {}}
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        default_pod(pod)
        return pod

    def batch_jobs(self):
        jobs, pods = self.R("jobs", "batch"), self.R("pods")
        for job in self.store.items(jobs):
            status = job.get("status") or {}
            if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                   for c in status.get("conditions") or []):
                ttl = deep(job, "spec", "ttlSecondsAfterFinished")
                done = parse_iso(status.get("completionTime") or deep(status, "conditions", default=[{}])[-1].get(
                    "lastTransitionTime"))
                if ttl is not None and done is not None and time.time() - done >= ttl:
                    gone = self.store.remove(jobs, job["metadata"]["namespace"], job["metadata"]["name"])
                    self.deleted(jobs, gone, "Background")
                continue
            if deep(job, "metadata", "deletionTimestamp") or deep(job, "spec", "suspend"):
                continue
            ns, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
            mine = self.owned(pods, ns, uid)
            succeeded = sum(1 for p in mine if deep(p, "status", "phase") == "Succeeded")
            failed = sum(1 for p in mine if deep(p, "status", "phase") == "Failed")
            active = [p for p in mine if deep(p, "status", "phase") not in ("Succeeded", "Failed")]
            spec = job["spec"]
            new = copy.deepcopy(job)
            st = new.setdefault("status", {})
            st.setdefault("startTime", now_iso())
            stamp = now_iso()
            if succeeded >= spec.get("completions", 1):
                st["conditions"] = [
                    {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods", "lastProbeTime": stamp,
                     "lastTransitionTime": stamp},
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                     "message": "Reached expected number of succeeded pods", "lastProbeTime": stamp,
                     "lastTransitionTime": stamp}]
                st["completionTime"] = stamp
                self.event(job, "Job", "Normal", "Completed", "Job completed", "job-controller", "batch/v1")
            elif failed > spec.get("backoffLimit", 6):
                st["conditions"] = [
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastProbeTime": stamp,
                     "lastTransitionTime": stamp},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastProbeTime": stamp,
                     "lastTransitionTime": stamp}]
                for p in active:
                    self.remove_pod(p)
                active = []
                self.event(job, "Job", "Warning", "BackoffLimitExceeded", "Job has reached the specified backoff "
                           "limit", "job-controller", "batch/v1")
            else:
                want = min(spec.get("parallelism", 1), spec.get("completions", 1) - succeeded) - len(active)
                for _ in range(max(0, want)):
                    name = "%s-%s" % (job["metadata"]["name"], rand_suffix())
                    pod = self.pod_from_template(spec.get("template"), ns, name, self.owner_ref(jobs, job),
                                                 {"batch.kubernetes.io/job-name": job["metadata"]["name"],
                                                  "job-name": job["metadata"]["name"]})
                    self.new(pods, pod)
                    active.append(pod)
                    self.event(job, "Job", "Normal", "SuccessfulCreate", "Created pod: %s" % name, "job-controller",
                               "batch/v1")
            st.update({"active": len(active), "succeeded": succeeded, "failed": failed, "terminating": 0,
                       "ready": sum(1 for p in active if deep(p, "status", "phase") == "Running"),
                       "uncountedTerminatedPods": {}})
            for key in ("active", "succeeded", "failed"):
                if not st[key]:
                    del st[key]
            self.put(jobs, new)

    def eligible_nodes(self, pod_spec, daemon=False):
        out = []
        for node in self.store.items(self.R("nodes")):
            labels = deep(node, "metadata", "labels", default={}) or {}
            if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
                continue
            terms = deep(pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                         "nodeSelectorTerms")
            if terms and not node_selector_terms_match(terms, node):
                continue
            tolerations = list(pod_spec.get("tolerations") or [])
            if daemon:
                tolerations += [{"key": k, "operator": "Exists", "effect": e} for k, e in DAEMON_POD_TOLERATIONS]
                if pod_spec.get("hostNetwork"):
                    tolerations.append({"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                                        "effect": "NoSchedule"})
            if any(t.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(tolerations, t)
                   for t in deep(node, "spec", "taints", default=[]) or []):
                continue
            out.append(node)
        return out

    def workload_status(self):
        stamp = now_iso()
        for plural in ("deployments", "statefulsets", "replicasets", "daemonsets"):
            res = self.R(plural, "apps")
            for obj in self.store.items(res):
                new = copy.deepcopy(obj)
                gen = obj["metadata"].get("generation", 1)
                if plural == "daemonsets":
                    nodes = self.eligible_nodes(deep(obj, "spec", "template", "spec", default={}) or {}, daemon=True)
                    n = len(nodes)
                    ready = sum(1 for node in nodes if node_ready(node))
                    new["status"] = {"currentNumberScheduled": n, "desiredNumberScheduled": n, "numberMisscheduled": 0,
                                     "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": n,
                                     "observedGeneration": gen}
                    if ready < n:
                        new["status"]["numberUnavailable"] = n - ready
                    if not ready:
                        del new["status"]["numberAvailable"]
                else:
                    n = deep(obj, "spec", "replicas")
                    n = 1 if n is None else n
                    if plural == "statefulsets":
                        new["status"] = {"replicas": n, "readyReplicas": n, "currentReplicas": n,
                                         "updatedReplicas": n, "availableReplicas": n, "observedGeneration": gen,
                                         "collisionCount": 0}
                    else:
                        new["status"] = {"replicas": n, "readyReplicas": n, "availableReplicas": n,
                                         "observedGeneration": gen}
                        if plural == "deployments":
                            new["status"]["updatedReplicas"] = n
                            old = {c["type"]: c for c in deep(obj, "status", "conditions", default=[]) or []}
                            new["status"]["conditions"] = [
                                old.get("Available") or {"type": "Available", "status": "True", "reason":
                                                         "MinimumReplicasAvailable", "message": "Deployment has "
                                                         "minimum availability.", "lastUpdateTime": stamp,
                                                         "lastTransitionTime": stamp},
                                old.get("Progressing") or {"type": "Progressing", "status": "True", "reason":
                                                           "NewReplicaSetAvailable", "message": 'ReplicaSet "%s" has '
                                                           "successfully progressed." % obj["metadata"]["name"],
                                                           "lastUpdateTime": stamp, "lastTransitionTime": stamp}]
                    for key in [k for k, v in new["status"].items() if v == 0 and k != "replicas" and
                                k != "observedGeneration"]:
                        if plural != "statefulsets" or key not in ("replicas",):
                            del new["status"][key]
                self.put(res, new)

    def pdb_numbers(self, pdb):
        """(disruptions allowed, desired healthy, current healthy)."""
        reqs = selector_reqs(deep(pdb, "spec", "selector")) or []
        pods = [p for p in self.store.items(self.R("pods"), pdb["metadata"]["namespace"])
                if labels_match(reqs, deep(p, "metadata", "labels"))]
        healthy = sum(1 for p in pods if deep(p, "status", "phase") == "Running")
        expected = len(pods)

        def amount(value):
            if isinstance(value, str) and value.endswith("%"):
                return int(-(-expected * int(value[:-1]) // 100))
            return int(value)
        if deep(pdb, "spec", "minAvailable") is not None:
            desired = amount(pdb["spec"]["minAvailable"])
        elif deep(pdb, "spec", "maxUnavailable") is not None:
            desired = expected - amount(pdb["spec"]["maxUnavailable"])
        else:
            desired = expected
        return max(0, healthy - desired), desired, healthy

    # -- Volcano -------------------------------------------------------------------------
    def admit_vcjob(self, ns, obj):
        spec = obj.setdefault("spec", {})
        deny = 'admission webhook "validatejob.volcano.sh" denied the request: '
        tasks = spec.get("tasks") or []
        if not tasks:
            raise ApiError(400, "BadRequest", deny + "No task specified in job spec")
        seen, total = set(), 0
        for task in tasks:
            if task.get("name") in seen:
                raise ApiError(400, "BadRequest", deny + "duplicated task name %s" % task.get("name"))
            seen.add(task.get("name"))
            replicas = task.setdefault("replicas", 1)
            if not isinstance(replicas, int) or replicas < 0:
                raise ApiError(400, "BadRequest", deny + "'replicas' < 0 in task: %s" % task.get("name"))
            total += replicas
        spec.setdefault("minAvailable", total)
        if spec["minAvailable"] > total:
            raise ApiError(400, "BadRequest", deny + "job 'minAvailable' should not be greater than total replicas "
                           "in tasks")
        spec.setdefault("queue", "default")
        spec.setdefault("schedulerName", "volcano")
        spec.setdefault("maxRetry", 3)
        if self._has("queues", "scheduling.volcano.sh"):
            queue = self.store.get(self.R("queues", "scheduling.volcano.sh"), "", spec["queue"])
            if queue is None:
                raise ApiError(400, "BadRequest", deny + 'unable to find job queue: queues.scheduling.volcano.sh '
                               '"%s" not found' % spec["queue"])
            if deep(queue, "status", "state") not in (None, "Open"):
                raise ApiError(400, "BadRequest", deny + "can only submit job to queue with state `Open`, queue `%s` "
                               "status is `%s`" % (spec["queue"], deep(queue, "status", "state")))
        obj["status"] = {"state": {"phase": "Pending", "lastTransitionTime": now_iso()},
                         "minAvailable": spec["minAvailable"]}

    def volcano_jobs(self):
        if not (self._has("jobs", "batch.volcano.sh") and self._has("podgroups", "scheduling.volcano.sh")):
            return
        vcjobs, pgs, pods = self.R("jobs", "batch.volcano.sh"), self.R("podgroups", "scheduling.volcano.sh"), \
            self.R("pods")
        for job in self.store.items(vcjobs):
            if deep(job, "metadata", "deletionTimestamp"):
                continue
            ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
            pg_name = "%s-%s" % (name, uid)
            if self.store.get(pgs, ns, pg_name) is None and deep(job, "status", "state", "phase") == "Pending":
                spec = job["spec"]
                min_res = collections.Counter()
                taken = 0
                for task in spec.get("tasks") or []:
                    for _ in range(task.get("replicas", 1)):
                        if taken < spec["minAvailable"]:
                            min_res.update(pod_requests(deep(task, "template", "spec", default={}) or {}))
                            taken += 1
                pg = {"metadata": {"name": pg_name, "namespace": ns, "ownerReferences": [self.owner_ref(vcjobs, job)],
                                   "annotations": {}},
                      "spec": {"minMember": spec["minAvailable"], "queue": spec["queue"],
                               "minTaskMember": {t.get("name"): t.get("minAvailable", t.get("replicas", 1))
                                                 for t in spec.get("tasks") or []},
                               "minResources": {k: ("%gm" % (v * 1000) if k == "cpu" else str(int(v)))
                                                for k, v in min_res.items()}},
                      "status": {"phase": "Pending"}}
                if spec.get("priorityClassName"):
                    pg["spec"]["priorityClassName"] = spec["priorityClassName"]
                self.new(pgs, pg)
                for task in spec.get("tasks") or []:
                    for index in range(task.get("replicas", 1)):
                        pod_name = "%s-%s-%d" % (name, task.get("name"), index)
                        if self.store.get(pods, ns, pod_name) is not None:
                            continue
                        template = copy.deepcopy(task.get("template") or {})
                        template.setdefault("spec", {}).setdefault("schedulerName", spec.get("schedulerName",
                                                                                             "volcano"))
                        pod = self.pod_from_template(
                            template, ns, pod_name, self.owner_ref(vcjobs, job, "v1alpha1"),
                            {"volcano.sh/job-name": name, "volcano.sh/job-namespace": ns,
                             "volcano.sh/queue-name": spec["queue"], "volcano.sh/task-spec": task.get("name"),
                             "volcano.sh/job-version": "0", "volcano.sh/task-index": str(index)},
                            {"scheduling.k8s.io/group-name": pg_name, "volcano.sh/job-name": name,
                             "volcano.sh/task-spec": task.get("name"), "volcano.sh/job-version": "0",
                             "volcano.sh/queue-name": spec["queue"], "volcano.sh/task-index": str(index)})
                        pod["spec"]["hostname"] = pod_name
                        self.new(pods, pod)

    def volcano_status(self):
        if not (self._has("jobs", "batch.volcano.sh") and self._has("podgroups", "scheduling.volcano.sh")):
            return
        vcjobs, pgs, pods = self.R("jobs", "batch.volcano.sh"), self.R("podgroups", "scheduling.volcano.sh"), \
            self.R("pods")
        for job in self.store.items(vcjobs):
            ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
            mine = self.owned(pods, ns, uid)
            if not mine:
                continue
            counts = collections.Counter(deep(p, "status", "phase") for p in mine)
            bound_pending = sum(1 for p in mine if deep(p, "status", "phase") == "Pending" and deep(p, "spec", "nodeName"))
            running, succeeded, failed = counts["Running"], counts["Succeeded"], counts["Failed"]
            pending = counts["Pending"]
            min_available = deep(job, "spec", "minAvailable", default=len(mine))
            old_phase = deep(job, "status", "state", "phase")
            if pending + running == 0:
                phase = "Completed" if succeeded >= min_available and failed == 0 else "Failed"
            elif running + succeeded + bound_pending >= min_available and (running + bound_pending) > 0:
                phase = "Running"
            else:
                phase = "Pending"
            if old_phase in ("Completed", "Failed"):
                phase = old_phase
            new = copy.deepcopy(job)
            st = new.setdefault("status", {})
            tasks = collections.defaultdict(lambda: collections.Counter())
            for p in mine:
                tasks[deep(p, "metadata", "labels", "volcano.sh/task-spec") or ""][deep(p, "status", "phase")] += 1
            st.update({"pending": pending, "running": running, "succeeded": succeeded, "failed": failed,
                       "minAvailable": min_available, "version": 0, "retryCount": 0,
                       "taskStatusCount": {t: {"phase": dict(c)} for t, c in tasks.items()}})
            for key in ("pending", "running", "succeeded", "failed"):
                if not st[key]:
                    del st[key]
            pg = self.store.get(pgs, ns, "%s-%s" % (name, uid))
            gang = None
            if pg is not None:
                gang = next((c.get("message") for c in deep(pg, "status", "conditions", default=[]) or []
                             if c.get("type") == "Unschedulable" and c.get("status") == "True"), None)
            state = st.setdefault("state", {})
            if phase != old_phase:
                state.update(phase=phase, lastTransitionTime=now_iso())
                st.setdefault("conditions", []).append({"status": phase, "lastTransitionTime": now_iso()})
                if phase == "Completed":
                    self.event(job, "Job", "Normal", "Completed", "Job completed", "vc-controller-manager",
                               "batch.volcano.sh/v1alpha1")
            if phase == "Pending" and gang:
                state.update(reason="Unschedulable", message=gang)
            else:
                state.pop("reason", None)
                state.pop("message", None)
            self.put(vcjobs, new)
            if pg is not None:
                pg = copy.deepcopy(pg)
                pg_phase = {"Pending": "Pending" if not gang else "Pending", "Running": "Running",
                            "Completed": "Completed", "Failed": "Completed"}[phase]
                pg.setdefault("status", {}).update(phase=pg_phase, running=running, succeeded=succeeded, failed=failed)
                for key in ("running", "succeeded", "failed"):
                    if not pg["status"][key]:
                        del pg["status"][key]
                if phase != "Pending":
                    pg["status"]["conditions"] = [c for c in pg["status"].get("conditions") or []
                                                  if c.get("type") != "Unschedulable"]
                    if not pg["status"]["conditions"]:
                        del pg["status"]["conditions"]
                self.put(pgs, pg)

    def volcano_schedule(self):
        if not self._has("podgroups", "scheduling.volcano.sh"):
            return
        pgs, pods = self.R("podgroups", "scheduling.volcano.sh"), self.R("pods")
        queues = self.R("queues", "scheduling.volcano.sh") if self._has("queues", "scheduling.volcano.sh") else None
        by_group = collections.defaultdict(list)
        for pod in self.store.items(pods):
            group = deep(pod, "metadata", "annotations", "scheduling.k8s.io/group-name")
            if group and deep(pod, "spec", "schedulerName") == "volcano":
                by_group[(pod["metadata"]["namespace"], group)].append(pod)
        for pg in self.store.items(pgs):
            ns, name = pg["metadata"]["namespace"], pg["metadata"]["name"]
            members = by_group.get((ns, name), [])
            waiting = [p for p in members if not deep(p, "spec", "nodeName") and deep(p, "status", "phase") == "Pending"
                       and not deep(p, "metadata", "deletionTimestamp")]
            if not waiting:
                continue
            placed_before = sum(1 for p in members if deep(p, "spec", "nodeName") and
                                deep(p, "status", "phase") != "Failed")
            min_member = deep(pg, "spec", "minMember", default=1)
            queue_name = deep(pg, "spec", "queue") or "default"
            queue = self.store.get(queues, "", queue_name) if queues else {}
            if queue is None or deep(queue or {}, "status", "state") not in (None, "Open"):
                message = "queue %s is %s" % (queue_name, "not found" if queue is None else
                                              deep(queue, "status", "state"))
                self.gang_blocked(pg, waiting, message, message)
                continue
            free = self.free_resources()
            placements, reasons = [], collections.Counter()
            for pod in sorted(waiting, key=lambda p: p["metadata"]["name"]):
                node, why = self.place(pod, free)
                if node:
                    placements.append((pod, node))
                    for k, v in pod_requests(pod["spec"]).items():
                        free[node]["res"][k] = free[node]["res"].get(k, 0) - v
                    free[node]["pods"] += 1
                else:
                    reasons.update(why)
            if placed_before + len(placements) >= min_member:
                for pod, node in placements:
                    self.bind_pod(pod, node, by="volcano")
                if placements:
                    pg = copy.deepcopy(pg)
                    pg["status"]["conditions"] = [c for c in pg["status"].get("conditions") or []
                                                  if c.get("type") != "Unschedulable"] + [
                        {"type": "Scheduled", "status": "True", "reason": "tasks in gang are ready to be scheduled",
                         "transitionID": str(uuid.uuid4()), "lastTransitionTime": now_iso()}]
                    pg["status"]["phase"] = "Running"
                    self.put(pgs, pg)
            else:
                n_nodes = len(self.store.items(self.R("nodes")))
                node_msg = "0/%d nodes are unavailable: %s." % (n_nodes, ", ".join(
                    "%d %s" % (c, r) for r, c in sorted(reasons.items()))) if reasons else \
                    "0/%d nodes are unavailable" % n_nodes
                unready = len(waiting)
                gang = ("%d/%d tasks in gang unschedulable: pod group is not ready, %d Pending, %d minAvailable; "
                        "Pending: %d Unschedulable" % (unready, len(members), len(waiting), min_member, unready))
                self.gang_blocked(pg, waiting, gang, node_msg)

    def gang_blocked(self, pg, waiting, gang, node_msg):
        pgs = self.R("podgroups", "scheduling.volcano.sh")
        new = copy.deepcopy(pg)
        conds = [c for c in new["status"].get("conditions") or [] if c.get("type") != "Unschedulable"]
        old = next((c for c in pg["status"].get("conditions") or [] if c.get("type") == "Unschedulable"), None)
        if old and old.get("message") == gang:
            conds.append(old)
        else:
            conds.append({"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources", "message": gang,
                          "transitionID": str(uuid.uuid4()), "lastTransitionTime": now_iso()})
        new["status"]["conditions"] = conds
        new["status"]["phase"] = "Pending"
        self.put(pgs, new)
        self.event(pg, "PodGroup", "Warning", "Unschedulable", gang, "volcano", "scheduling.volcano.sh/v1beta1")
        for pod in waiting:
            self.set_unschedulable(pod, node_msg, "volcano")

    # -- the default scheduler -------------------------------------------------------------
    def free_resources(self):
        """node name -> {"res": allocatable minus requests of its live pods, "pods": count, "node": obj}."""
        free = {}
        for node in self.store.items(self.R("nodes")):
            alloc = {}
            for k, v in (deep(node, "status", "allocatable") or {}).items():
                try:
                    alloc[k] = parse_quantity(v)
                except ValueError:
                    pass
            free[node["metadata"]["name"]] = {"res": alloc, "pods": 0, "node": node}
        for pod in self.store.items(self.R("pods")):
            node = deep(pod, "spec", "nodeName")
            if node in free and deep(pod, "status", "phase") not in ("Succeeded", "Failed"):
                for k, v in pod_requests(pod["spec"]).items():
                    free[node]["res"][k] = free[node]["res"].get(k, 0) - v
                free[node]["pods"] += 1
        return free

    def volume_constraints(self, pod):
        """-> (blocking message or None, required node or None, [pvcs waiting for a first consumer])."""
        pvcs, pvs = self.R("persistentvolumeclaims"), self.R("persistentvolumes")
        classes = {sc["metadata"]["name"]: sc for sc in self.store.items(self.R("storageclasses", "storage.k8s.io"))}
        ns = pod["metadata"]["namespace"]
        required, wffc = None, []
        for vol in deep(pod, "spec", "volumes", default=[]) or []:
            claim = deep(vol, "persistentVolumeClaim", "claimName")
            if not claim:
                continue
            pvc = self.store.get(pvcs, ns, claim)
            if pvc is None:
                return 'persistentvolumeclaim "%s" not found' % claim, None, []
            if deep(pvc, "status", "phase") == "Bound":
                pv = self.store.get(pvs, "", deep(pvc, "spec", "volumeName") or "")
                terms = deep(pv or {}, "spec", "nodeAffinity", "required", "nodeSelectorTerms")
                if terms:
                    for term in terms:
                        for expr in term.get("matchExpressions") or []:
                            if expr.get("key") == "kubernetes.io/hostname" and expr.get("values"):
                                required = expr["values"][0]
                continue
            sc = classes.get(deep(pvc, "spec", "storageClassName") or "")
            if sc is not None and sc.get("volumeBindingMode") == "WaitForFirstConsumer":
                wffc.append(pvc)
                continue
            return "pod has unbound immediate PersistentVolumeClaims", None, []
        return None, required, wffc

    def place(self, pod, free):
        """Best node for pod given free resources -> (name, None) or (None, Counter of reasons)."""
        spec = pod["spec"]
        blocked, required, _ = self.volume_constraints(pod)
        if blocked:
            return None, collections.Counter({blocked: len(free)})
        reqs = pod_requests(spec)
        eligible = {n["metadata"]["name"] for n in self.eligible_nodes(spec)}
        reasons, fits = collections.Counter(), []
        for name, slot in sorted(free.items()):
            node = slot["node"]
            if spec.get("nodeName") and spec["nodeName"] != name:
                reasons["node(s) didn't match the requested node name"] += 1
                continue
            if required and required != name:
                reasons["node(s) had volume node affinity conflict"] += 1
                continue
            if name not in eligible:
                labels = deep(node, "metadata", "labels", default={}) or {}
                selector_ok = all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())
                terms = deep(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                             "nodeSelectorTerms")
                if not selector_ok or (terms and not node_selector_terms_match(terms, node)):
                    reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                else:
                    taint = next(t for t in deep(node, "spec", "taints", default=[]) or []
                                 if t.get("effect") in ("NoSchedule", "NoExecute") and
                                 not tolerated(spec.get("tolerations"), t))
                    if taint.get("key") == "node.kubernetes.io/unschedulable":
                        reasons["node(s) were unschedulable"] += 1
                    else:
                        reasons["node(s) had untolerated taint {%s: %s}" % (taint.get("key"),
                                                                           taint.get("value", ""))] += 1
                continue
            short = False
            if slot["pods"] + 1 > slot["res"].get("pods", 110):
                reasons["Too many pods"] += 1
                short = True
            for k, v in sorted(reqs.items()):
                if slot["res"].get(k, 0) + 1e-9 < v:
                    reasons["Insufficient %s" % k] += 1
                    short = True
            if not short:
                fits.append((slot["pods"], name))
        if fits:
            return sorted(fits)[0][1], None
        return None, reasons

    def schedule(self):
        pods = self.R("pods")
        free = None
        for pod in self.store.items(pods):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or deep(pod, "status", "phase") != "Pending" or \
                    deep(pod, "metadata", "deletionTimestamp") or spec.get("schedulerName") != "default-scheduler":
                continue
            if free is None:
                free = self.free_resources()
            node, reasons = self.place(pod, free)
            if node:
                for k, v in pod_requests(spec).items():
                    free[node]["res"][k] = free[node]["res"].get(k, 0) - v
                free[node]["pods"] += 1
                self.bind_pod(pod, node)
            else:
                n = len(free)
                if len(reasons) == 1 and not next(iter(reasons)).startswith(("node(s)", "Insufficient", "Too many")):
                    message = "0/%d nodes are available: %s. preemption: 0/%d nodes are available: %d Preemption is " \
                              "not helpful for scheduling." % (n, next(iter(reasons)), n, n)
                else:
                    message = "0/%d nodes are available: %s. preemption: 0/%d nodes are available: %d Preemption is " \
                              "not helpful for scheduling." % (n, ", ".join("%d %s" % (c, r) for r, c in sorted(
                                  reasons.items())), n, n) if n else "no nodes available to schedule pods"
                self.set_unschedulable(pod, message, "default-scheduler")

    def set_unschedulable(self, pod, message, component):
        new = copy.deepcopy(pod)
        conds = [c for c in new["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
        old = next((c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if old and old.get("message") == message and old.get("status") == "False":
            return
        conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                      "lastProbeTime": None, "lastTransitionTime": now_iso()})
        new["status"]["conditions"] = conds
        self.put(self.R("pods"), new)
        self.event(pod, "Pod", "Warning", "FailedScheduling", message, component)

    def bind_pod(self, pod, node, by="default-scheduler"):
        pods = self.R("pods")
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = node
        bound_to = self.store.get(self.R("nodes"), "", node)
        if deep(bound_to or {}, "metadata", "labels", KEEPER_LABEL[0]) == KEEPER_LABEL[1]:
            new["metadata"]["finalizers"] = list(new["metadata"].get("finalizers") or []) + [KEEPER_FINALIZER]
        conds = [c for c in new["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": now_iso()})
        new["status"]["conditions"] = conds
        _, _, wffc = self.volume_constraints(pod)
        pvcs = self.R("persistentvolumeclaims")
        for pvc in wffc:
            pvc = copy.deepcopy(pvc)
            pvc["metadata"].setdefault("annotations", {})["volume.kubernetes.io/selected-node"] = node
            self.put(pvcs, pvc)
        self.put(pods, new)
        if by != "binding":
            self.event(new, "Pod", "Normal", "Scheduled", "Successfully assigned %s/%s to %s" % (
                pod["metadata"]["namespace"], pod["metadata"]["name"], node), by if by == "volcano" else
                "default-scheduler")
        self.wake.set()

    # -- kubelets ----------------------------------------------------------------------------
    def admit_on_node(self, pod, node):
        """The kubelet's admission: (reason, message) when the pod does not fit, else None."""
        free = self.free_resources()
        slot = free.get(node["metadata"]["name"])
        if slot is None:
            return None
        reqs = pod_requests(pod["spec"])
        # free_resources already counted this pod on its node: add it back
        for k, v in sorted(reqs.items()):
            have = slot["res"].get(k, 0) + v
            if have + 1e-9 < v:
                alloc = parse_quantity((deep(node, "status", "allocatable") or {}).get(k, "0"))
                used = alloc - have
                return ("OutOf" + k, "Pod was rejected: Node didn't have enough resource: %s, requested: %g, used: "
                        "%g, capacity: %g" % (k, v, max(0, used), alloc))
        return None

    def volumes_ready(self, pod):
        """The kubelet mounts a claim only once it is Bound (the pod stays ContainerCreating)."""
        pvcs = self.R("persistentvolumeclaims")
        for vol in deep(pod, "spec", "volumes", default=[]) or []:
            claim = deep(vol, "persistentVolumeClaim", "claimName")
            if claim:
                pvc = self.store.get(pvcs, pod["metadata"]["namespace"], claim)
                if pvc is None or deep(pvc, "status", "phase") != "Bound":
                    return False
        return True

    def pod_ip(self, node):
        counters = self.store.sim.setdefault("pod_ip", {})
        n = counters.get(node["metadata"]["name"], 0) + 1
        counters[node["metadata"]["name"]] = n
        cidr = deep(node, "spec", "podCIDR") or "10.42.0.0/24"
        base = cidr.split("/")[0].rsplit(".", 1)[0]
        return "%s.%d" % (base, (n - 1) % 250 + 2)

    def runtime_handler(self, pod, node):
        """(handler, None), or (None, why the sandbox cannot be created). The pod's
        RuntimeClass names the handler, else containerd's default_runtime_name (runc unless
        k3s's default-runtime says otherwise); containerd knows only the runtimes k3s found
        (k3s-io/k3s pkg/agent/containerd/nvidia.go). containerd internal/cri/server
        (runtimeHandler lookup): 'no runtime for "X" is configured'."""
        runtimes = ((self.records.get(node["metadata"]["name"]) or {}).get("hardware") or {}).get("runtimes") \
            or {"handlers": ["runc"], "default": "runc"}
        name = deep(pod, "spec", "runtimeClassName")
        if name:
            rc = self.store.get(self.R("runtimeclasses", "node.k8s.io"), "", name)
            if rc is None:  # deleted since admission let the pod in
                return None, 'RuntimeClass "%s" not found' % name
            handler = rc.get("handler") or name
        else:
            handler = runtimes.get("default") or "runc"
        if handler not in runtimes.get("handlers", ["runc"]):
            return None, 'failed to get sandbox runtime: no runtime for "%s" is configured' % handler
        return handler, None

    def devices_reach_pod(self, pod, node):
        """Whether the GPUs the device plugin allocated get into the container: through an
        NVIDIA runtime (nvidia-container-runtime reads NVIDIA_VISIBLE_DEVICES), or through
        CDI when the operator's ClusterPolicy has CDI on and the host holds a CDI spec
        (containerd 2 injects CDI devices for any runtime: `enable_cdi` is on by default,
        containerd docs/cri/config.md, v2.0). With runc and no CDI spec the container starts
        without them: `nvidia-smi` is not found."""
        handler, _ = self.runtime_handler(pod, node)
        if handler and handler.startswith("nvidia"):
            return True
        runtimes = ((self.records.get(node["metadata"]["name"]) or {}).get("hardware") or {}).get("runtimes") or {}
        return bool(runtimes.get("cdi_specs")) and deep(self.cluster_policy() or {}, "spec", "cdi", "enabled") is True

    def container_context(self, pod, container, node):
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        env = {"HOSTNAME": meta["name"], "KUBERNETES_SERVICE_HOST": "10.43.0.1", "KUBERNETES_SERVICE_PORT": "443",
               "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": uid,
                  "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName"),
                  "status.podIP": deep(pod, "status", "podIP") or "", "status.hostIP": deep(pod, "status", "hostIP")
                  or ""}
        cms, secrets = self.R("configmaps"), self.R("secrets")
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif deep(item, "valueFrom", "fieldRef", "fieldPath"):
                env[item["name"]] = fields.get(item["valueFrom"]["fieldRef"]["fieldPath"], "") or ""
            elif deep(item, "valueFrom", "configMapKeyRef"):
                ref = item["valueFrom"]["configMapKeyRef"]
                cm = self.store.get(cms, meta["namespace"], ref.get("name"))
                env[item["name"]] = ((cm or {}).get("data") or {}).get(ref.get("key"), "")
            elif deep(item, "valueFrom", "secretKeyRef"):
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.store.get(secrets, meta["namespace"], ref.get("name"))
                value = ((secret or {}).get("data") or {}).get(ref.get("key"), "")
                env[item["name"]] = base64.b64decode(value).decode(errors="replace") if value else ""
        hw = (self.records.get(node["metadata"]["name"]) or {}).get("hardware") or {}
        gpus = hw.get("gpus") or {}
        requests = pod_requests({"containers": [container]})
        gpu_lines = []
        if gpus.get("count") and self.devices_reach_pod(pod, node):
            uuids = gpus.get("uuids") or []
            for name, amount in sorted(requests.items()):
                m = GPU_RESOURCE_RE.match(name)
                if not m or amount <= 0:
                    continue
                if m.group(1).startswith("mig-"):
                    profile = m.group(1)[4:]
                    for i in range(int(amount)):
                        gpu_lines.append("GPU %d: %s (UUID: %s)\n  MIG %-14s Device %2d: (UUID: MIG-%s)\n" % (
                            0, gpus.get("model"), uuids[0] if uuids else "GPU-0", profile, i,
                            str(uuid.UUID(hashlib.md5(("%s%d" % (uid, i)).encode()).hexdigest()))))
                else:
                    for i in range(min(int(amount), gpus["count"])):
                        gpu_lines.append("GPU %d: %s (UUID: %s)\n" % (i, gpus.get("model"), uuids[i] if i < len(uuids)
                                                                        else "GPU-%d" % i))
        if gpu_lines:
            env.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(str(i) for i in range(len(gpu_lines))))
        volumes = self.store.volumes
        mounts = []
        pvcs = self.R("persistentvolumeclaims")
        defs = {v.get("name"): v for v in spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            vol = defs.get(mount.get("name")) or {}
            path = mount.get("mountPath", "/")
            sub = mount.get("subPath")
            if vol.get("persistentVolumeClaim"):
                pvc = self.store.get(pvcs, meta["namespace"], vol["persistentVolumeClaim"].get("claimName"))
                volume_id = "pv:%s" % (deep(pvc or {}, "spec", "volumeName") or "unbound")
            elif vol.get("hostPath"):
                volume_id = "host:%s:%s" % (node["metadata"]["name"], vol["hostPath"].get("path"))
            else:
                volume_id = "pod:%s:%s" % (uid, mount.get("name"))
                files = volumes.setdefault(volume_id, {})
                source = None
                if vol.get("configMap"):
                    cm = self.store.get(cms, meta["namespace"], vol["configMap"].get("name"))
                    source = {k: v for k, v in ((cm or {}).get("data") or {}).items()}
                elif vol.get("secret"):
                    secret = self.store.get(secrets, meta["namespace"], vol["secret"].get("secretName"))
                    source = {k: base64.b64decode(v).decode(errors="replace")
                              for k, v in ((secret or {}).get("data") or {}).items()}
                if source is not None:
                    files.update(source)
            if sub:
                files = volumes.setdefault(volume_id, {})
                volume_id = volume_id + "/" + sub
                volumes.setdefault(volume_id, {})
            mounts.append((path, volume_id))
        mounts.sort(key=lambda m: -len(m[0]))
        return {"pod": meta["name"], "namespace": meta["namespace"], "env": env, "gpus": gpu_lines,
                "mounts": mounts, "volumes": volumes, "rootfs": "pod:%s:%s:/" % (uid, container.get("name"))}

    def container_status(self, container, state, ready, restarts=0):
        image = container.get("image", "")
        digest = hashlib.sha256(image.encode()).hexdigest()
        status = {"name": container["name"], "image": image if "/" in image.split(":")[0] or "." in image.split(
                  "/")[0] else "docker.io/library/" + image, "imageID": "docker.io/library/%s@sha256:%s" % (
                  image.split(":")[0].split("@")[0].rsplit("/", 1)[-1], digest), "ready": ready,
                  "restartCount": restarts, "started": "running" in state, "state": state, "lastState": {}}
        if "waiting" not in state:
            status["containerID"] = "containerd://" + hashlib.sha256((container["name"] + digest + str(
                time.time())).encode()).hexdigest()
        return status

    def pull_failed(self, pod, new, containers, timer, pods):
        """An image the node cannot pull (pull_error) holds the pod Pending, as the kubelet's
        image manager does (kubernetes pkg/kubelet/images/image_manager.go, v1.33.5,
        EnsureImageExists): the container waits with ErrImagePull and the pull's error, then,
        while the kubelet backs off, ImagePullBackOff 'Back-off pulling image "<image>"'; a
        Failed event each time. True while it fails."""
        failing = next(((c, err) for c in containers if (err := pull_error(c.get("image", "")))), None)
        if failing is None:
            return False
        container, err = failing
        image = container.get("image", "")
        failed_at = timer.setdefault("pull_failed_at", time.monotonic())
        backing_off = time.monotonic() - failed_at >= 1.0  # the kubelet's next sync, in its back-off
        reason, message = ("ImagePullBackOff", 'Back-off pulling image "%s"' % image) if backing_off \
            else ("ErrImagePull", err)
        st = new["status"]
        inits = pod["spec"].get("initContainers") or []
        key, siblings = ("initContainerStatuses", inits) if container in inits else \
            ("containerStatuses", pod["spec"].get("containers") or [])
        st[key] = [self.container_status(c, {"waiting": {"reason": reason, "message": message}}, False)
                   if c.get("name") == container.get("name") else s for c, s in zip(siblings, st.get(key) or [])]
        if timer.get("pull_failed") != reason:
            timer["pull_failed"] = reason
            self.put(pods, new)
            if backing_off:
                self.event(pod, "Pod", "Normal", "BackOff", message, "kubelet")
            else:
                self.event(pod, "Pod", "Warning", "Failed", 'Failed to pull image "%s": %s' % (image, err), "kubelet")
        return True

    def pod_conditions(self, pod, ready, initialized, started, reason=None):
        stamp = now_iso()
        old = {c["type"]: c for c in deep(pod, "status", "conditions", default=[]) or []}

        def cond(ctype, ok, why=None):
            status = "True" if ok else "False"
            prev = old.get(ctype)
            c = {"type": ctype, "status": status, "lastProbeTime": None,
                 "lastTransitionTime": prev["lastTransitionTime"] if prev and prev.get("status") == status else stamp}
            if not ok and why:
                c["reason"] = why
            return c
        return [cond("PodReadyToStartContainers", started), cond("Initialized", initialized, "PodCompleted"
                                                                 if reason == "PodCompleted" else
                                                                 "ContainersNotInitialized"),
                cond("Ready", ready, reason or "ContainersNotReady"),
                cond("ContainersReady", ready, reason or "ContainersNotReady"),
                old.get("PodScheduled") or cond("PodScheduled", True)]

    def kubelets(self):
        pods, nodes = self.R("pods"), self.R("nodes")
        now = time.monotonic()
        for pod in self.store.items(pods):
            spec, status = pod["spec"], pod.get("status") or {}
            node_name, phase = spec.get("nodeName"), status.get("phase")
            if not node_name or phase not in ("Pending", "Running") or deep(pod, "metadata", "deletionTimestamp"):
                continue
            node = self.store.get(nodes, "", node_name)
            if node is None or not node_ready(node):
                continue
            uid = pod["metadata"]["uid"]
            timer = self.timers.get(uid)
            new = copy.deepcopy(pod)
            st = new["status"]
            containers = spec.get("containers") or []
            inits = spec.get("initContainers") or []
            if phase == "Pending" and timer is None:
                rejected = self.admit_on_node(pod, node)
                if rejected:
                    st.update(phase="Failed", reason=rejected[0], message=rejected[1], startTime=now_iso())
                    self.put(pods, new)
                    self.event(pod, "Pod", "Warning", rejected[0], rejected[1], "kubelet")
                    continue
                address = next((a["address"] for a in deep(node, "status", "addresses", default=[])
                                if a.get("type") == "InternalIP"), "")
                st.update(hostIP=address, hostIPs=[{"ip": address}], startTime=now_iso())
                st["containerStatuses"] = [self.container_status(c, {"waiting": {
                    "reason": "PodInitializing" if inits else "ContainerCreating"}}, False) for c in containers]
                if inits:
                    st["initContainerStatuses"] = [self.container_status(c, {"waiting": {"reason": "PodInitializing"}},
                                                                         False) for c in inits]
                st["conditions"] = self.pod_conditions(new, False, not inits, False)
                self.timers[uid] = {"start": now + self.start_delay}
                self.put(pods, new)
                continue
            if phase == "Pending" and now >= timer["start"]:
                if not self.volumes_ready(pod):
                    continue
                _, no_sandbox = self.runtime_handler(pod, node)
                if no_sandbox:  # the kubelet retries; the pod stays ContainerCreating
                    if timer.get("sandbox_error") != no_sandbox:
                        timer["sandbox_error"] = no_sandbox
                        self.event(pod, "Pod", "Warning", "FailedCreatePodSandBox",
                                   "Failed to create pod sandbox: " + no_sandbox, "kubelet")
                    continue
                if self.pull_failed(pod, new, inits + containers, timer, pods):
                    continue
                ip = self.pod_ip(node)
                st.update(podIP=ip, podIPs=[{"ip": ip}])
                started = now_iso()
                failed_init = None
                init_statuses = []
                for c in inits:
                    out, code, _ = run_container(c, self.container_context(new, c, node))
                    self.store.logs["%s/%s/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"])] = out
                    init_statuses.append(self.container_status(c, {"terminated": {
                        "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
                        "finishedAt": started}}, code == 0))
                    if code != 0:
                        failed_init = c["name"]
                        break
                if inits:
                    st["initContainerStatuses"] = init_statuses + [
                        self.container_status(c, {"waiting": {"reason": "PodInitializing"}}, False)
                        for c in inits[len(init_statuses):]]
                if failed_init:
                    st["phase"] = "Failed"
                    st["conditions"] = self.pod_conditions(new, False, False, True)
                    self.timers[uid] = {"done": True}
                    self.put(pods, new)
                    continue
                ends, codes = {}, {}
                for c in containers:
                    out, code, seconds = run_container(c, self.container_context(new, c, node))
                    self.store.logs["%s/%s/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"])] = out
                    ends[c["name"]] = None if seconds is None else now + seconds
                    codes[c["name"]] = code
                self.store.dirty = True
                self.timers[uid] = {"ends": ends, "codes": codes, "started": started}
                st["phase"] = "Running"
                st["containerStatuses"] = [self.container_status(c, {"running": {"startedAt": started}}, True)
                                           for c in containers]
                st["conditions"] = self.pod_conditions(new, True, True, True)
                self.put(pods, new)
                self.event(pod, "Pod", "Normal", "Started", "Started container %s" % containers[0]["name"], "kubelet")
                continue
            if phase == "Running":
                if timer is None or "ends" not in timer:  # after a restart of the server: run out from now
                    base = env_float("K3S_STANDIN_POD_SECONDS", 1.0)
                    timer = self.timers[uid] = {"ends": {c["name"]: now + base for c in containers},
                                                "codes": {c["name"]: 0 for c in containers},
                                                "started": deep(st, "startTime") or now_iso()}
                if spec.get("restartPolicy", "Always") == "Always":
                    continue
                done = {n for n, end in timer["ends"].items() if end is not None and end <= now}
                if not done:
                    continue
                finished = now_iso()
                statuses = []
                for c in containers:
                    cs = next((s for s in st.get("containerStatuses") or [] if s["name"] == c["name"]), None) or \
                        self.container_status(c, {"running": {"startedAt": timer["started"]}}, True)
                    if c["name"] in done and "terminated" not in cs["state"]:
                        code = timer["codes"][c["name"]]
                        cs = dict(cs, ready=False, started=False, state={"terminated": {
                            "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                            "startedAt": timer["started"], "finishedAt": finished, "containerID": cs.get(
                                "containerID", "")}})
                    statuses.append(cs)
                st["containerStatuses"] = statuses
                if all("terminated" in s["state"] for s in statuses):
                    ok = all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
                    st["phase"] = "Succeeded" if ok else "Failed"
                    st["conditions"] = self.pod_conditions(new, False, True, False, "PodCompleted")
                    timer["done"] = True
                self.put(pods, new)

    # -- garbage collection ---------------------------------------------------------------
    def garbage_collect(self):
        if not self.gc_uids:
            return
        deleted, self.gc_uids = self.gc_uids, set()
        alive = set()
        for table in self.store.objects.values():
            for obj in table.values():
                alive.add(obj["metadata"].get("uid"))
        for res in self.api.resources():
            for obj in self.store.items(res):
                refs = deep(obj, "metadata", "ownerReferences") or []
                if not refs or not any(r.get("uid") in deleted for r in refs):
                    continue
                if any(r.get("uid") in alive for r in refs):
                    continue
                if res.kind == "Pod" and not res.crd:
                    self.remove_pod(obj)
                    continue
                gone = self.store.remove(res, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                if gone:
                    self.deleted(res, gone, "Background")
