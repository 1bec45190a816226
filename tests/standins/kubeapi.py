"""Stand-in Kubernetes API server and cluster simulator, served by the k3s stand-in.

The k3s stand-in (k3s_standin.py) serves this on its supervisor port (6443) next to its
own endpoints, over plain HTTP, so the tool reaches it through the same SSH tunnel and
the same code path (the official `kubernetes` Python client) as a real cluster. The
builder (airgap.py) embeds this file into the built stand-in; Debian 12's python3 (3.11)
standard library only, threads, no third-party packages.

Contract (what the official client needs; details in each section):
  Auth       "Authorization: Bearer <token>" with the kubeconfig's token (derived from the
             cluster token, so every server of a cluster accepts the same one); 401 else.
             /version, /healthz, /livez, /readyz need none.
  Discovery  /version, /api, /api/v1, /apis, /apis/G, /apis/G/V (legacy discovery, JSON),
             no /openapi.
  Objects    GET (get, list, watch=true), POST (create), PUT (replace), PATCH (JSON patch,
             merge patch, strategic merge patch for built-in kinds, server-side apply),
             DELETE (one, collection) on the built-in kinds in BUILTIN below and on custom
             resources of every CustomResourceDefinition (k3s's own, the PRESETS, and any
             created through the API). Subresources: status (GET/PUT/PATCH), pods/log,
             pods/eviction, pods/binding, namespaces/finalize.
  Lists      kind "<Kind>List", metadata.resourceVersion; labelSelector (=, ==, !=, in,
             notin, exists, !exists), fieldSelector (any dotted field, = == !=); limit is
             accepted, everything comes in one page (no continue token).
  Watch      watch=true streams chunked JSON lines {"type", "object"} from resourceVersion
             (ADDED for the current objects when none is given), until timeoutSeconds
             (default 60, at most 300); a resourceVersion older than the last 4096 changes
             gets one ERROR event with code 410 (the client then lists again).
  Errors     Status objects with the reasons and messages of the real API server
             (NotFound, AlreadyExists, Conflict, Invalid 422, BadRequest, Forbidden,
             MethodNotAllowed, UnsupportedMediaType).
  State      JSON in <data-dir>/server/standin-api.json (0600), written within ~0.5 s of a
             change and at exit; `k3s etcd-snapshot save` carries it, a restore puts it back.

The simulator (class Simulator, a thread ticking every 0.2 s) plays the controllers,
the scheduler and the kubelets of a small k3s cluster; its rules are in its docstring.
Exec, attach and port-forward (SPDY/websocket upgrades) are not served.
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
import string
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
            self.events.append((self.rv, etype, res.key, copy.deepcopy(obj)))
            self.dirty = True
            self.changed.notify_all()
            return obj

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

PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")
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


def admin_token(password):
    """The kubeconfig's bearer token: the same on every server of a cluster (they share
    the cluster token), and not the cluster token itself."""
    return "standin-admin." + hashlib.sha256(("k3s-standin-kubeapi:" + password).encode()).hexdigest()[:40]


class KubeAPI:
    def __init__(self, server_dir, version, token, node_name=None, cluster=None, options=None):
        self.server_dir = server_dir
        self.version = version
        self.token = token
        self.node_name = node_name
        self.cluster = cluster  # adapter: records() -> {name: join record}; etcd_removed(name)
        self.options = dict(options or {})
        self.store = Store()
        self._res_cache = (None, None)
        self.started = time.time()
        self.stopping = threading.Event()
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
            if want_kind and want_kind != res.kind:
                raise ApiError(400, "BadRequest", "the API version in the data (%s) does not match the expected "
                               "API version (%s)" % (want_api, res.api_version(version)) if want_api !=
                               res.api_version(version) else "%s in version \"%s\" cannot be handled as a %s: "
                               "kind mismatch" % (want_kind, version, res.kind))
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
            self.admit(res, ns, obj)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            for key in ("resourceVersion", "deletionTimestamp", "selfLink"):
                meta.pop(key, None)
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
            uid_label = str(uuid.uuid4())
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
        if query.get("timestamps") in ("true", "1"):
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

    def version_info(self):
        m = K8S_VERSION_RE.match(self.version or "v1.33.5")
        major, minor = (m.group(1), m.group(2)) if m else ("1", "33")
        return {"major": major, "minor": minor, "gitVersion": self.version, "gitCommit": "k3s-standin",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.6",
                "compiler": "gc", "platform": "linux/amd64"}

    # -- HTTP ------------------------------------------------------------------
    def handles(self, raw_path):
        path = urllib.parse.urlparse(raw_path).path.rstrip("/") or "/"
        return path in ("/api", "/apis") or path.startswith(("/api/", "/apis/", "/openapi")) or path in PUBLIC_PATHS

    def serve(self, handler, method):
        parsed = urllib.parse.urlparse(handler.path)
        path = parsed.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length > 0 else b""
        try:
            if path in PUBLIC_PATHS:
                if method != "GET":
                    raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                                   "resource")
                if path == "/version":
                    return self.send(handler, 200, self.version_info())
                return self.send(handler, 200, "ok", "text/plain; charset=utf-8")
            auth = handler.headers.get("Authorization", "")
            if auth != "Bearer " + self.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            status, result = self.dispatch(handler, method, path, query, body)
            if result is STREAMED:
                return None
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
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
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
                if query.get("watch") in ("true", "1"):
                    self.watch(handler, res, ns, query, version)
                    return 200, STREAMED
                return 200, self.list(res, ns, query, version)
            if sub == "log":
                return 200, self.pod_log(ns, name, query)
            if sub in ("eviction", "binding"):
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                               "resource")
            return 200, self.get(res, ns, name, version)
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

        with store.lock:
            pending = []
            if since in ("", "0"):
                for obj in store.items(res, ns):
                    if matches(obj):
                        pending.append({"type": "ADDED", "object": self.out(res, obj, version)})
                cursor = store.rv
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
        handler.protocol_version = "HTTP/1.1"
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Cache-Control", "no-cache, private")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True

        def chunk(data):
            try:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            except OSError:
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


def version_priority(version):
    """Kubernetes version order: GA before beta before alpha, higher first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)
