#!/usr/bin/python3
"""k3s stand-in: plays the host side of a real k3s binary on test hosts.

Nothing here can download k3s, so the tests install this program as
/usr/local/bin/k3s through the tool's air-gap path (tests/standins/airgap.py builds
the folder). It is one file, Debian 12's python3 (3.11) standard library only, and
python3-h2 for HTTP/2 where installed (h2serve.py; without it HTTP/1.1 only). The
builder embeds the k3s version and the valid `k3s server` / `k3s agent` flag names
(the product's bootstrap/checks/k3s_flags.txt) into the EMBEDDED line below; the source file itself
refuses to run.

What it honours, like real k3s (details in each section below):
  k3s --version | -v                  "k3s version vX+k3sN (commit)" / "go version goX"
  k3s server [flags] / k3s agent [flags]
      config: /etc/rancher/k3s/config.yaml, then config.yaml.d/*.yaml (alphabetical;
      later wins; `key+:` appends), then CLI flags (`--f v`, `--f=v`, `-f`, booleans);
      --config/-c and $K3S_CONFIG_FILE move the file; K3S_TOKEN, K3S_URL, ... fill
      flags that are not set. A key or flag that is not a flag of the subcommand is
      fatal and named: `flag provided but not defined: -not-a-flag`.
  k3s etcd-snapshot save|ls|delete|prune       (server data dir, etcd mode)
  k3s server --cluster-reset [--cluster-reset-restore-path=FILE]

Server: token files (server/token, node-token, agent-token: K10<sha256 of the CA>::
server:<password>, 0600), kubeconfig /etc/rancher/k3s/k3s.yaml (0600 unless
write-kubeconfig-mode: https://127.0.0.1:<port> with the server CA and the system:admin
client certificate embedded), the cluster CAs generated once per data dir (server/tls/
server-ca.crt, client-ca.crt and keys, ECDSA P-256, made with openssl: k3s_pki.py). It
speaks HTTPS on the supervisor port (https-listen-port, default 6443), with a certificate
from the server CA whose SANs are k3s's (127.0.0.1, the node's addresses, tls-san, ...):
  GET  /ping                  -> "pong"
  GET  /cacerts               -> the cluster CA (its sha256 is the K10 hash)
  POST /v1-standin/join       token in "Authorization: Bearer <token>" (short password
                              or full K10 token); JSON body {name, role, address, labels,
                              taints, ...}; 401 wrong password/CA hash, 409 a server
                              joining a cluster without etcd, 400 critical config
                              mismatch; 200 records the node in server/standin-nodes.json
  GET  /v1-standin/nodes      the recorded nodes (for tests)
  GET  /v1-standin/info       version, CA hash, datastore (for tests)
  POST /v1-standin/heartbeat  {name}, same token as a join: the node's k3s is alive (agents
                              and joined servers send one every K3S_STANDIN_HEARTBEAT s, 3)
  /version, /api..., /apis... the stand-in Kubernetes API server and cluster simulator
                              (kubeapi.py, embedded by the builder), for client
                              certificates from the client CA (k3s.yaml's system:admin)
Agent: needs server + token; fetches /cacerts unverified, checks its hash against the K10
token, then verifies the server with that CA (joins, heartbeats); joins,
then listens on 10250 (kubelet-arg port=N moves it) with GET /healthz -> "ok".
Both: a node-ip that no link of the host holds is fatal (real k3s's network policy
controller exits on it; see check_node_ip); node-external-ip need not be on a link.
Flannel (see its section): flannel-backend none, vxlan (default), host-gw or
wireguard-native, else fatal "Cannot configure unknown flannel backend '<b>'";
flannel-backend and flannel-external-ip are server flags (critical config; agents get
them in the join reply); k3s's warnings for flannel-external-ip on a node without
node-external-ip and with an unencrypted backend; wireguard-native needs the WireGuard
module (/sys/module/wireguard, a modules.builtin line or a wireguard.ko* under
/lib/modules/<release>, under the sandbox root too), else after READY=1 the process logs
"flannel exited: failed to register flannel network: could not create wireguard
interface: operation not supported" and exits 1 (a crash loop under systemd). A node
whose flannel did not start never gets Ready; Nodes carry k3s's address annotations,
status.addresses from them, and flannel's lease annotations (kubeapi.py).
Both: node footprint that `down` must undo (agent/etc/containerd/config.toml in the
containerd 2 "version = 3" form, CNI `bin_dirs = [".../data/cni"]`, one
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'] block per runtime
found in /usr/local/nvidia/toolkit or $PATH; data/<hash>/bin, data/current, data/cni,
/run/k3s/containerd, /run/flannel, /etc/rancher/node/password, /var/lib/kubelet,
/var/lib/cni, /var/log/pods; cni0 + flannel.1 (VXLAN, UDP 8472) links, or flannel-wg (and
UDP 51820) for wireguard-native, /run/flannel/wgkey; FLANNEL-* and
KUBE-ROUTER-* iptables chains; a containerd-shim process that outlives `systemctl stop`
under KillMode=process, with a pod under it: processes standin-pod-pause, -workload and
-worker (the workload's child) and a tmpfs emptyDir mounted under /var/lib/kubelet/pods/,
the worker's cwd), image import log lines, sd_notify READY=1 once listening,
process name k3s-server / k3s-agent (as `ss -ltnp` shows for real k3s).

Knobs for tests (not in real k3s):
  K3S_STANDIN_ROOT=DIR      sandbox: every fixed host path (/etc/rancher, /var/lib/...,
                            /run/...) is taken under DIR; no links, iptables, shim, and
                            only explicitly configured auxiliary ports. For running the
                            stand-in on the build machine.
  K3S_STANDIN_JOIN_TIMEOUT  seconds an agent/joining server retries an unreachable
                            server before giving up (default 20; real k3s retries forever)
  K3S_STANDIN_LENIENT_CONFIG=1  `k3s server` skips unknown config-file keys with a
                            warning, as real k3s >= 1.21.7 does, instead of refusing them
  K3S_STANDIN_NO_SHIM=1     do not start the containerd-shim stand-in process
  K3S_STANDIN_HEARTBEAT     seconds between an agent's heartbeats to its server (default 3)
  The simulator's timings (K3S_STANDIN_NODE_GRACE, ..._POD_SECONDS, ...) are in kubeapi.py's
                            Simulator docstring

Differences from real k3s worth knowing are listed in the module docstring of
tests/standin_tests/test_k3s_standin.py.
"""

import base64
import ctypes
import datetime
import errno
import functools
import hashlib
import hmac
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.parse
import urllib.request
import uuid

# The builder (tests/standins/airgap.py) replaces the next line with a dict:
# {"version": "v1.33.5+k3s1", "commit": "1a2b3c4d", "go": "go1.24.6",
#  "flags": {"server": [...], "agent": [...]}}
EMBEDDED = None

# The builder also embeds tests/standins/kubeapi.py (the stand-in Kubernetes API server and
# cluster simulator) and tests/standins/k3s_pki.py (certificates and TLS) on the next lines;
# unbuilt, they are loaded from beside this file.
KUBEAPI_SOURCE = None
PKI_SOURCE = None
H2_SOURCE = None

PROGRAM = "k3s"


# =============================================================================
# Logging: logrus text format, as journald shows real k3s
# (time="..." level=info msg="..."). Nothing secret is ever passed to log().
# =============================================================================

DEBUG = False


def log(level, msg):
    if level == "debug" and not DEBUG:
        return
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    sys.stderr.write('time="%s" level=%s msg=%s\n' % (now, level, json.dumps(msg, ensure_ascii=False)))
    sys.stderr.flush()


def info(msg):
    log("info", msg)


def warn(msg):
    log("warning", msg)


def error(msg):
    log("error", msg)


class Fatal(Exception):
    """Logged as level=fatal, exit status 1 (what logrus.Fatal does)."""


def fatal(msg):
    raise Fatal(msg)


# =============================================================================
# Process name. Real k3s shows up as "k3s-server" / "k3s-agent" in ps, systemctl
# status and `ss -ltnp` (users:(("k3s-server",pid=...))). A shebang script gets
# its file name as comm already; PR_SET_NAME also covers `python3 k3s ...`.
# =============================================================================

def set_process_name(name):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)  # PR_SET_NAME
    except Exception:  # best effort: only cosmetics for ps/ss
        pass


# =============================================================================
# Paths. Everything fixed that real k3s touches goes through host(); under
# K3S_STANDIN_ROOT it lands in a sandbox so tests can run the stand-in on the
# build machine without touching its /etc, /run or network.
# =============================================================================

SANDBOX = os.environ.get("K3S_STANDIN_ROOT", "")


def host(path):
    return SANDBOX.rstrip("/") + path if SANDBOX else path


DEFAULT_DATA_DIR = "/var/lib/rancher/k3s"
DEFAULT_CONFIG = "/etc/rancher/k3s/config.yaml"
DEFAULT_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"


def mkdirs(path, mode=0o755):
    os.makedirs(path, mode=mode, exist_ok=True)


def write_file(path, data, mode=0o644):
    """Atomic write with the final mode from the start (secrets never sit world-readable)."""
    mkdirs(os.path.dirname(path))
    tmp = "%s.tmp-%d" % (path, os.getpid())
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_text(path, default=None):
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return default


_MODULES = {}


def embedded_module(filename, source):
    """A module the builder embedded (or, unbuilt, the file beside this one), loaded once."""
    if filename not in _MODULES:
        origin = "<k3s stand-in: %s>" % filename
        if source is None:
            origin = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
            source = read_text(origin)
            if source is None:
                fatal("%s not found beside %s (build the stand-in with tests/standins/airgap.py)" % (filename, __file__))
        module = types.ModuleType("k3s_standin_" + filename[:-3])
        module.__file__ = origin
        sys.modules[module.__name__] = module
        exec(compile(source, origin, "exec"), module.__dict__)
        _MODULES[filename] = module
    return _MODULES[filename]


def kubeapi():
    """The stand-in Kubernetes API module (kubeapi.py)."""
    return embedded_module("kubeapi.py", KUBEAPI_SOURCE)


def pki():
    """The stand-in's certificates and TLS (k3s_pki.py)."""
    return embedded_module("k3s_pki.py", PKI_SOURCE)


def h2serve():
    """HTTP/2 for the supervisor/API port (h2serve.py)."""
    return embedded_module("h2serve.py", H2_SOURCE)


# =============================================================================
# YAML subset. k3s reads config files with yaml.v2 into a flat mapping and turns
# every entry into --key=value. The tool writes them with PyYAML safe_dump, so
# this covers: one block mapping at column 0; values that are plain, 'single' or
# "double" quoted scalars (also folded over several lines), block lists of
# scalars ("- item", indented or not), flow lists of scalars ([a, b]), comments,
# one leading "---". Scalars resolve as yaml.v2 does (YAML 1.1: yes/no/on/off/y/n
# are booleans, 0644 is octal 420). Anything else (nested mappings, lists of
# lists, anchors, tags, block scalars | >) is refused with file:line, since it
# is not a k3s flag value either.
# =============================================================================

class YamlError(ValueError):
    pass


_BOOL_TRUE = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
_BOOL_FALSE = {"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
_NULL = {"", "~", "null", "Null", "NULL"}
_FLOAT_RE = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


def resolve_plain(text):
    """A plain scalar as yaml.v2 resolves it into an interface{}."""
    if text in _NULL:
        return None
    if text in _BOOL_TRUE:
        return True
    if text in _BOOL_FALSE:
        return False
    plain = text.replace("_", "")
    sign = 1
    body = plain
    if body and body[0] in "+-":
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body:
        try:
            if re.fullmatch(r"0[bB][01]+", body):
                return sign * int(body[2:], 2)
            if re.fullmatch(r"0[xX][0-9a-fA-F]+", body):
                return sign * int(body[2:], 16)
            if re.fullmatch(r"0[oO][0-7]+", body):
                return sign * int(body[2:], 8)
            if re.fullmatch(r"0[0-7]+", body):  # Go's base-0 ParseInt: leading 0 is octal
                return sign * int(body, 8)
            if re.fullmatch(r"[0-9]+", body):
                return sign * int(body, 10)
        except ValueError:
            pass
    if _FLOAT_RE.match(plain):
        return float(plain)
    if text.lower() in (".inf", "+.inf"):
        return float("inf")
    if text.lower() == "-.inf":
        return float("-inf")
    if text.lower() == ".nan":
        return float("nan")
    return text


def go_string(value):
    """wrangler's convert.ToString, which k3s applies to every config value."""
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


def _strip_comment(text):
    """Drop a trailing comment: '#' at the start or after whitespace, outside quotes."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if quote == "'" and c == "'" and text[i + 1:i + 2] == "'":
                i += 2
                continue
            if quote == '"' and c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"" and (i == 0 or text[i - 1] in " \t[,"):
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i]
        i += 1
    return text


_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
            "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85",
            "_": "\xa0", "L": "\u2028", "P": "\u2029"}


def _parse_quoted(text, start):
    """Parse a quoted scalar at text[start]; text may span lines ('\\n'). Returns
    (value, index after the closing quote) or raises YamlError('unterminated')."""
    quote = text[start]
    out = []
    i = start + 1
    while True:
        if i >= len(text):
            raise YamlError("unterminated quoted string")
        c = text[i]
        if c == quote:
            if quote == "'" and text[i + 1:i + 2] == "'":
                out.append("'")
                i += 2
                continue
            return "".join(out), i + 1
        if quote == '"' and c == "\\":
            if i + 1 >= len(text):
                raise YamlError("unterminated quoted string")
            nxt = text[i + 1:i + 2]
            if nxt == "\n":  # escaped line break: joins lines without a space
                i += 2
                while i < len(text) and text[i] in " \t":
                    i += 1
                continue
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            width = {"x": 2, "u": 4, "U": 8}.get(nxt)
            if width:
                digits = text[i + 2:i + 2 + width]
                if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                    raise YamlError("bad escape \\%s in a double-quoted string" % nxt)
                out.append(chr(int(digits, 16)))
                i += 2 + width
                continue
            raise YamlError("unknown escape \\%s" % nxt)
        if c == "\n":  # line folding: a single break is a space, blank lines are breaks
            while out and out[-1] in " \t":
                out.pop()
            i += 1
            blanks = 0
            while True:
                j = i
                while j < len(text) and text[j] in " \t":
                    j += 1
                if j < len(text) and text[j] == "\n":
                    blanks += 1
                    i = j + 1
                    continue
                i = j
                break
            out.append("\n" * blanks if blanks else " ")
            continue
        out.append(c)
        i += 1


def _fold(parts):
    out = parts[0]
    newlines = 0
    for part in parts[1:]:
        if part == "":
            newlines += 1
            continue
        out += ("\n" * newlines) if newlines else " "
        out += part
        newlines = 0
    return out


_MAPPING_RE = re.compile(r"""^(?:"[^"]*"|'[^']*'|[^\s'"#][^#]*?)\s*:(?:\s|$)""")


class _Lines:
    def __init__(self, text, source):
        self.source = source
        text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        self.lines = text.split("\n")

    def where(self, index):
        return "%s:%d" % (self.source, index + 1)

    def fail(self, index, why):
        raise YamlError("%s: %s" % (self.where(index), why))

    def indent(self, index):
        line = self.lines[index]
        lead = line[:len(line) - len(line.lstrip(" \t"))]
        if "\t" in lead:
            self.fail(index, "tab in indentation")
        return len(lead)

    def blank(self, index):
        stripped = self.lines[index].strip()
        return stripped == "" or stripped.startswith("#")

    def next_content(self, index):
        while index < len(self.lines) and self.blank(index):
            index += 1
        return index


def _continuation(doc, index, min_indent):
    """Lines that continue a plain scalar: more indented than min_indent (blank lines
    inside count as breaks). Returns (stripped parts, next index)."""
    parts = []
    while index < len(doc.lines):
        line = doc.lines[index]
        if line.strip() == "":
            parts.append("")
            index += 1
            continue
        if line.strip().startswith("#") or doc.indent(index) < min_indent:
            break
        parts.append(_strip_comment(line).strip())
        index += 1
    while parts and parts[-1] == "":
        parts.pop()
    return parts, index


def _scalar(doc, index, text, min_indent, what):
    """A scalar starting with `text` on line `index` (comment not yet stripped),
    possibly continued on following lines indented at least min_indent.
    Returns (value, next line index)."""
    text = text.strip()
    if text[:1] in ("'", '"'):
        chunk = text
        end = index
        while True:
            try:
                value, after = _parse_quoted(chunk, 0)
                break
            except YamlError as exc:
                if "unterminated" not in str(exc):
                    doc.fail(index, str(exc))
                end += 1
                if end >= len(doc.lines) or (doc.lines[end].strip() and doc.indent(end) < min_indent):
                    doc.fail(index, "unterminated quoted string")
                chunk += "\n" + doc.lines[end]
        rest = _strip_comment(chunk[after:]).strip()
        if rest:
            doc.fail(end, "unexpected text after a quoted string")
        return value, end + 1
    text = _strip_comment(text).strip()
    if text[:1] in ("|", ">"):
        doc.fail(index, "block scalars (| or >) are not supported by the k3s stand-in's YAML reader")
    if text[:1] in ("&", "*", "!"):
        doc.fail(index, "anchors, aliases and tags are not supported by the k3s stand-in's YAML reader")
    if text[:1] == "{":
        doc.fail(index, "%s is a mapping; k3s flags take scalars or lists of scalars" % what)
    if text[:1] == "[":
        doc.fail(index, "%s is a nested list; k3s flags take scalars or lists of scalars" % what)
    if re.search(r":(\s|$)", text):
        doc.fail(index, "mapping values are not allowed here (%s is not a flat 'key: value')" % what)
    parts, after = _continuation(doc, index + 1, min_indent)
    for offset, part in enumerate(parts):
        if re.search(r":(\s|$)", part):
            doc.fail(index + 1 + offset, "mapping values are not allowed here")
    if parts:
        return _fold([text] + parts), after
    return resolve_plain(text), after


def _flow_list(doc, index, text, key):
    """[a, 'b', "c"] possibly over several lines. Returns (list, next index)."""
    chunk = _strip_comment(text.strip())
    end = index
    while True:
        items, closed, problem = _split_flow(chunk)
        if problem:
            doc.fail(index, "%s: %s" % (key, problem))
        if closed is not None:
            rest = _strip_comment(chunk[closed:]).strip()
            if rest:
                doc.fail(end, "unexpected text after a flow list")
            return items, end + 1
        end += 1
        if end >= len(doc.lines) or (doc.lines[end].strip() and doc.indent(end) == 0):
            doc.fail(index, "unterminated flow list for %s" % key)
        chunk += "\n" + _strip_comment(doc.lines[end])


def _split_flow(chunk):
    """Items of a flow list of scalars starting at chunk[0] == '['.
    Returns (items, index after ']' or None if not closed yet, problem or None)."""
    items = []
    current = ""        # plain text of the item being read
    quoted = None       # value of a quoted item being read
    i = 1
    while i < len(chunk):
        c = chunk[i]
        if c in "'\"" and not current.strip() and quoted is None:
            try:
                quoted, i = _parse_quoted(chunk, i)
            except YamlError as exc:
                return None, None, None if "unterminated" in str(exc) else "bad quoted list item"
            continue
        if c in "[{":
            return None, None, "nested lists or mappings are not k3s flag values"
        if c in ",]":
            text = " ".join(current.split())
            if quoted is not None:
                if text:
                    return None, None, "text after a quoted list item"
                items.append(quoted)
            elif text:
                if re.search(r":(\s|$)", text):
                    return None, None, "mappings inside lists are not k3s flag values"
                items.append(resolve_plain(text))
            elif c == ",":
                return None, None, "empty list item"
            current, quoted = "", None
            if c == "]":
                return items, i + 1, None
        else:
            current += c
        i += 1
    return None, None, None


def _block_list(doc, index, key):
    """Block sequence items ('- x') starting on line index. Returns (list, next index)."""
    items = []
    item_indent = doc.indent(index)
    while True:
        index = doc.next_content(index)
        if index >= len(doc.lines):
            break
        indent = doc.indent(index)
        content = doc.lines[index].strip()
        is_item = content == "-" or content.startswith("- ")
        if indent < item_indent or (indent == item_indent and not is_item):
            break
        if indent > item_indent or not is_item:
            doc.fail(index, "unexpected indentation in the list for %s" % key)
        text = content[1:].strip()
        if text.startswith("- ") or text == "-":
            doc.fail(index, "%s: lists of lists are not k3s flag values" % key)
        if text and not text.startswith(("'", '"')) and _MAPPING_RE.match(_strip_comment(text)):
            doc.fail(index, "%s: mappings inside lists are not k3s flag values" % key)
        if not _strip_comment(text).strip():
            parts, after = _continuation(doc, index + 1, item_indent + 1)
            items.append(_fold(parts) if parts else None)
            index = after
            continue
        value, index = _scalar(doc, index, text, item_indent + 1, key)
        items.append(value)
    return items, index


def parse_config_yaml(text, source="config.yaml"):
    """Entries of a k3s config file in order, as (key, value) pairs; value is None,
    bool, int, float, str or a list of those. Duplicate keys are kept (yaml.v2's
    MapSlice keeps them too; the later one wins when k3s merges)."""
    doc = _Lines(text, source)
    entries = []
    index = 0
    started = False
    while True:
        index = doc.next_content(index)
        if index >= len(doc.lines):
            break
        line = doc.lines[index]
        if line.rstrip() == "...":
            for rest in range(index + 1, len(doc.lines)):
                if not doc.blank(rest):
                    doc.fail(rest, "more than one YAML document")
            break
        if line.startswith("---"):
            if started or _strip_comment(line[3:]).strip():
                doc.fail(index, "more than one YAML document (or content after ---)")
            started = True
            index += 1
            continue
        started = True
        if doc.indent(index) != 0:
            doc.fail(index, "unexpected indentation (a k3s config is a flat 'flag-name: value' mapping)")
        stripped = _strip_comment(line).strip()
        if not entries and stripped == "{}":  # PyYAML's dump of an empty dict
            index += 1
            continue
        if stripped.startswith(("- ", "[")) or stripped == "-":
            doc.fail(index, "the top level is a list; a k3s config is a 'flag-name: value' mapping")
        if stripped.startswith(("? ", "{", "&", "*", "!", "|", ">", "%", "@", "`")):
            doc.fail(index, "unsupported YAML at the top level (expected 'flag-name: value')")
        # the key: quoted, or plain up to the first ':' followed by a space or the end
        if line[0] in "'\"":
            try:
                key, after = _parse_quoted(line, 0)
            except YamlError as exc:
                doc.fail(index, str(exc))
            rest = line[after:].lstrip(" ")
            if not rest.startswith(":"):
                doc.fail(index, "expected ':' after the key")
            rest = rest[1:]
        else:
            match = re.search(r":(\s|$)", line)
            if not match:
                doc.fail(index, "could not find expected ':' (expected 'flag-name: value')")
            key = line[:match.start()].rstrip()
            rest = line[match.start() + 1:]
        value_text = _strip_comment(rest).strip() if not rest.strip().startswith(("'", '"')) else rest.strip()
        if value_text == "":
            nxt = doc.next_content(index + 1)
            if nxt < len(doc.lines) and (doc.lines[nxt].strip() == "-" or doc.lines[nxt].strip().startswith("- ")):
                value, index = _block_list(doc, nxt, key)
            elif nxt < len(doc.lines) and doc.indent(nxt) > 0:
                if _MAPPING_RE.match(_strip_comment(doc.lines[nxt]).strip()):
                    doc.fail(nxt, "%s is a nested mapping; k3s flags take scalars or lists of scalars" % key)
                value, index = _scalar(doc, nxt, doc.lines[nxt], 1, key)
            else:
                value, index = None, index + 1
        elif value_text.startswith("["):
            value, index = _flow_list(doc, index, value_text, key)
        else:
            value, index = _scalar(doc, index, value_text, 1, key)
        entries.append((key, value))
    return entries


# =============================================================================
# Config files -> arguments, with k3s's configfilearg semantics: the base file
# (optional unless named explicitly), then <file>.d/*.yaml|*.yml in name order;
# `key+:` appends to a list; each key becomes --key=value (one per list item),
# placed before the CLI arguments so the CLI wins (and appends to lists).
# =============================================================================

def find_config_file(argv):
    """(path, explicit): $K3S_CONFIG_FILE, else --config/-c in argv, else the default."""
    env = os.environ.get("K3S_CONFIG_FILE", "")
    if env:
        return env, True
    for i, arg in enumerate(argv):
        for name in ("--config", "-c"):
            if arg == name and i + 1 < len(argv):
                return argv[i + 1], True
            if arg.startswith(name + "="):
                return arg[len(name) + 1:], True
    return host(DEFAULT_CONFIG), False


def dropin_files(base):
    try:
        names = sorted(os.listdir(base + ".d"))
    except FileNotFoundError:
        return []
    return [os.path.join(base + ".d", n) for n in names
            if n.lower().endswith((".yaml", ".yml")) and not os.path.isdir(os.path.join(base + ".d", n))]


def _to_slice(value):
    if isinstance(value, list):
        return list(value)
    if isinstance(value, str):
        return [value]
    text = go_string(value).strip()
    return [text] if text else []


def config_args(path, explicit):
    """[(arg, source file)] from the config file and its drop-ins."""
    files = dropin_files(path)
    if os.path.exists(path):
        files.insert(0, path)
    elif explicit and not files:
        fatal("open %s: no such file or directory" % path)
    order, values, sources = [], {}, {}
    for file in files:
        try:
            with open(file, encoding="utf-8") as fh:
                entries = parse_config_yaml(fh.read(), file)
        except YamlError as exc:
            fatal("failed to parse config file: %s" % exc)
        except (OSError, UnicodeDecodeError) as exc:
            fatal("failed to read config file %s: %s" % (file, exc))
        for key, value in entries:
            key = go_string(key)
            append = key.endswith("+")
            key = key[:-1] if append else key
            if key not in values:
                order.append(key)
            if append and key in values:
                values[key] = _to_slice(values[key]) + _to_slice(value)
            else:
                values[key] = value
            sources[key] = file
    args = []
    for key in order:
        prefix = "-" if len(key) == 1 else "--"
        value = values[key]
        for item in (value if isinstance(value, list) else [value]):
            args.append(("%s%s=%s" % (prefix, key, go_string(item)), sources[key]))
    return args


# =============================================================================
# Flags. Names come from the embedded upstream list (servers take agent flags
# too, as the k3s docs say). Types are not in that list; these sets give the
# booleans (no value argument), repeatable slices, and ints.
# =============================================================================

BOOL_FLAGS = {
    "debug", "alsologtostderr", "tls-san-security", "flannel-ipv6-masq", "flannel-external-ip",
    "cluster-init", "cluster-reset", "etcd-expose-metrics", "etcd-disable-snapshots",
    "etcd-snapshot-compress", "etcd-s3", "etcd-s3-skip-ssl-verify", "etcd-s3-insecure",
    "disable-scheduler", "disable-cloud-controller", "disable-kube-proxy", "disable-network-policy",
    "disable-helm-controller", "embedded-registry", "supervisor-metrics", "with-node-id", "docker",
    "disable-default-registry-endpoint", "nonroot-devices", "protect-kernel-defaults",
    "secrets-encryption", "enable-pprof", "rootless", "prefer-bundled-bin", "selinux",
    "disable-agent", "disable-apiserver-lb", "snapshot-compress", "help",
}
SLICE_FLAGS = {
    "tls-san", "cluster-cidr", "service-cidr", "cluster-dns", "kube-apiserver-arg", "etcd-arg",
    "kube-controller-manager-arg", "kube-scheduler-arg", "kube-cloud-controller-manager-arg",
    "disable", "node-label", "node-taint", "node-ip", "node-external-ip", "node-internal-dns",
    "node-external-dns", "kubelet-arg", "kube-proxy-arg",
}
INT_FLAGS = {"v", "https-listen-port", "advertise-port", "lb-server-port", "etcd-snapshot-retention",
             "snapshot-retention"}
# Comma lists that k3s splits itself after parsing.
COMMA_SPLIT = {"disable", "tls-san", "node-ip", "node-external-ip", "cluster-cidr", "service-cidr", "cluster-dns"}
ALIASES = {"t": "token", "s": "server", "d": "data-dir", "o": "write-kubeconfig", "i": "node-ip",
           "l": "log", "c": "config", "h": "help"}
# Environment variables k3s reads for a flag that is not set otherwise.
ENV_FLAGS = {
    "token": "K3S_TOKEN", "token-file": "K3S_TOKEN_FILE", "server": "K3S_URL",
    "agent-token": "K3S_AGENT_TOKEN", "agent-token-file": "K3S_AGENT_TOKEN_FILE",
    "node-name": "K3S_NODE_NAME", "write-kubeconfig": "K3S_KUBECONFIG_OUTPUT",
    "write-kubeconfig-mode": "K3S_KUBECONFIG_MODE", "write-kubeconfig-group": "K3S_KUBECONFIG_GROUP",
    "cluster-init": "K3S_CLUSTER_INIT", "cluster-reset": "K3S_CLUSTER_RESET",
    "data-dir": "K3S_DATA_DIR", "resolv-conf": "K3S_RESOLV_CONF", "selinux": "K3S_SELINUX",
    "lb-server-port": "K3S_LB_SERVER_PORT",
}
GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
           "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


class FlagError(Exception):
    pass


def go_int(text):
    """strconv.ParseInt(text, 0, 64): 0x.., 0o.., 0b.., and a leading 0 means octal."""
    m = re.fullmatch(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)", text.strip())
    if not m:
        raise ValueError(text)
    sign, body = m.groups()
    value = int(body, 8) if re.fullmatch(r"0[0-7]+", body) else int(body, 0)
    return -value if sign == "-" else value


def valid_flags(command):
    flags = EMBEDDED["flags"]
    names = set(flags.get(command, []))
    if command == "server":
        names |= set(flags.get("agent", []))
    names |= {"help"}
    return names


def parse_flags(args, valid):
    """Go flag/urfave semantics over [(arg, source)]; returns (opts, positional)."""
    opts, positional = {}, []
    i = 0
    while i < len(args):
        arg, source = args[i]
        where = "" if source == "cli" else " (in %s)" % source
        if arg == "--":
            positional.extend(a for a, _ in args[i + 1:])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            i += 1
            continue
        given = arg.lstrip("-")
        value = None
        if "=" in given:
            given, value = given.split("=", 1)
        name = ALIASES.get(given, given)
        if name not in valid:
            raise FlagError("flag provided but not defined: -%s%s" % (given, where))
        if name in BOOL_FLAGS:
            if value is None:
                opts[name] = True
            elif value in GO_BOOL:
                opts[name] = GO_BOOL[value]
            else:
                raise FlagError('invalid boolean value "%s" for -%s: parse error%s' % (value, given, where))
        else:
            if value is None:
                if i + 1 >= len(args):
                    raise FlagError("flag needs an argument: -%s" % given)
                i += 1
                value = args[i][0]
            if name in SLICE_FLAGS:
                opts.setdefault(name, []).append(value)
            elif name in INT_FLAGS:
                try:
                    opts[name] = go_int(value)
                except ValueError:
                    raise FlagError('invalid value "%s" for flag -%s: parse error%s' % (value, given, where))
            else:
                opts[name] = value
        i += 1
    for name in COMMA_SPLIT & set(opts):
        opts[name] = [p.strip() for v in opts[name] for p in v.split(",") if p.strip()]
    return opts, positional


def load_options(command, argv):
    """Merge config files, CLI flags and K3S_* environment variables for `command`."""
    valid = valid_flags(command)
    path, explicit = find_config_file(argv)
    file_args = config_args(path, explicit)
    if command == "server" and os.environ.get("K3S_STANDIN_LENIENT_CONFIG") == "1":
        kept = []
        for arg, source in file_args:
            name = arg.lstrip("-").split("=", 1)[0]
            if ALIASES.get(name, name) in valid:
                kept.append((arg, source))
            else:
                warn("Unknown flag %s found in config.yaml, skipping" % arg.split("=", 1)[0])
        file_args = kept
    try:
        opts, positional = parse_flags(file_args + [(a, "cli") for a in argv], valid)
    except FlagError as exc:
        if "not defined" in str(exc) or "needs an argument" in str(exc):
            sys.stderr.write("Incorrect Usage: %s\n\n" % exc)
        fatal(str(exc))
    for name, env in ENV_FLAGS.items():
        if name in valid and name not in opts and os.environ.get(env):
            value = os.environ[env]
            opts[name] = GO_BOOL.get(value, False) if name in BOOL_FLAGS else value
    if positional:
        warn("ignoring %d extra command line argument(s)" % len(positional))
    opts.pop("config", None)
    return opts


# =============================================================================
# Versions. The version is embedded at build time; the data dir remembers the
# version that last ran there (server/standin-version). Like the k3s upgrade
# rules: no downgrades, no skipping a minor.
# =============================================================================

VERSION_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-(rc\d+))?\+k3s(\d+)$")


def version_key(version):
    m = VERSION_RE.match(version)
    if not m:
        return None
    major, minor, patch, rc, k3s = m.groups()
    return (int(major), int(minor), int(patch), 0 if rc else 1, int(rc[2:]) if rc else 0, int(k3s))


def check_version_history(data_dir):
    path = os.path.join(data_dir, "server", "standin-version")
    old = (read_text(path) or "").strip()
    new = EMBEDDED["version"]
    if old and old != new:
        ok, nk = version_key(old), version_key(new)
        if ok and nk:
            if ok > nk:
                fatal("refusing to start: %s last ran k3s %s, newer than this %s; downgrades are not supported"
                      % (data_dir, old, new))
            if ok[:1] == nk[:1] and nk[1] - ok[1] > 1:
                fatal("refusing to start: %s last ran k3s %s; upgrading to %s skips a minor version "
                      "(upgrade one minor at a time)" % (data_dir, old, new))
        info("Upgrading data dir from k3s %s to %s" % (old, new))
    write_file(path, new + "\n", 0o644)


# =============================================================================
# CA and tokens. The server CA (a real certificate, k3s_pki.py) is made once per data
# dir; the sha256 of server-ca.crt is the hash in the secure token format
# K10<hash>::server:<password> (k3s-io/k3s pkg/clientaccess/token.go hashes /cacerts).
# =============================================================================

def ca_hash(pem_bytes):
    return hashlib.sha256(pem_bytes).hexdigest()


def parse_token(token):
    """(ca_hash or None, password) from a short or K10 token."""
    token = token.strip()
    if token.startswith("K10"):
        m = re.fullmatch(r"K10([0-9a-f]{64})::([^:]+):(.+)", token)
        if not m:
            fatal("failed to normalize server token; must be in format K10<CA-HASH>::<USERNAME>:<PASSWORD> or <PASSWORD>")
        return m.group(1), m.group(3)
    if not token:
        return None, ""
    return None, token


def token_from(opts, name):
    """The value of --token/--agent-token, or of their *-file variants."""
    if opts.get(name):
        return str(opts[name]).strip()
    path = opts.get(name + "-file")
    if path:
        text = read_text(path)
        if text is None:
            fatal("failed to read %s file %s" % (name, path))
        return text.strip()
    return ""


def token_check(password):
    """What a snapshot stores to recognise the token without storing it."""
    return hashlib.sha256(b"k3s-standin-token:" + password.encode()).hexdigest()


# =============================================================================
# Node identity and addresses.
# =============================================================================

def node_name(opts):
    name = opts.get("node-name") or socket.gethostname().split(".")[0]
    name = name.lower()
    if opts.get("with-node-id"):
        machine_id = (read_text("/etc/machine-id") or name).strip()
        name += "-" + hashlib.sha256(machine_id.encode()).hexdigest()[:8]
    return name


def node_address(opts, toward=None):
    """node-ip, or the source address the kernel would use (UDP connect sends no
    packet). Without a route k3s fails the same way."""
    if opts.get("node-ip"):
        check_node_ip(opts, opts["node-ip"][0])
        return opts["node-ip"][0]
    target = toward or "192.0.2.1"  # TEST-NET-1: only used to ask the routing table
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return s.getsockname()[0]
    except OSError:
        fatal('unable to select an IP from default routes: no default routes found in "/proc/net/route" or "/proc/net/ipv6_route"')


def link_addresses():
    """Every address on the host's links, both families, from a netlink RTM_GETADDR dump:
    what kube-router's GetNodeSubnet walks (netlink LinkList + AddrList). IFA_LOCAL is the
    address of a point-to-point link (IFA_ADDRESS is then its peer), as netlink reads it."""
    import ipaddress
    import struct

    rtm_getaddr, rtm_newaddr, nlmsg_done, nlmsg_error = 22, 20, 3, 2
    ifa_address, ifa_local = 1, 2
    found = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
        s.bind((0, 0))
        s.send(struct.pack("=LHHLL", 24, rtm_getaddr, 0x1 | 0x300, 1, 0)  # NLM_F_REQUEST | NLM_F_DUMP
               + struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0))
        while True:
            data, off = s.recv(1 << 16), 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=LH", data, off)
                if kind == nlmsg_done:
                    return found
                if kind == nlmsg_error or length < 16:
                    raise OSError("netlink address dump failed")
                if kind == rtm_newaddr:
                    attrs, pos, end = {}, off + 24, off + length
                    while pos + 4 <= end:
                        size, attr = struct.unpack_from("=HH", data, pos)
                        if size < 4:
                            break
                        attrs[attr] = data[pos + 4:pos + size]
                        pos += (size + 3) & ~3
                    raw = attrs.get(ifa_local) or attrs.get(ifa_address)
                    if raw and len(raw) in (4, 16):
                        found.add(ipaddress.ip_address(raw))
                off += (length + 3) & ~3


def check_node_ip(opts, address):
    """A node-ip no link of the host holds: real k3s registers it as the node's InternalIP,
    then its network policy controller looks that address up among the links' addresses
    and the process exits (k3s-io/k3s pkg/agent/netpol/netpol.go at commit 0589157 wraps
    cloudnativelabs/kube-router pkg/utils/node.go GetNodeSubnet at commit 0155169); systemd
    restarts it, forever. k3s only parses node-ip (pkg/util/net.go GetHostnameAndIPs, commit
    0a3f10c). With disable-network-policy the kubelet refuses it instead on every status
    update (kubernetes/kubernetes pkg/kubelet/nodestatus/setters.go validateNodeIP, commit
    8340f5a), so the node never gets its addresses: the stand-in refuses it either way."""
    import ipaddress

    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        fatal("invalid node-ip: invalid ip format '%s'" % address)
    if wanted in link_addresses():
        return
    if opts.get("disable-network-policy"):
        fatal('Failed to set some node status fields: failed to validate nodeIP: node IP: "%s" not found in '
              "the host's network interfaces" % address)
    fatal("Failed to start networking: unable to initialize network policy controller: "
          "error getting node subnet: failed to find interface with specified node ip")


def check_external_ips(opts):
    """node-external-ip is only parsed, never looked up on a link (it is the address the
    world sees, e.g. a 1:1 NAT's): k3s-io/k3s pkg/agent/config/config.go (get, "invalid
    node-external-ip: %w" around util.ParseStringSliceToIPs), as the node's config is read."""
    import ipaddress

    for value in opts.get("node-external-ip") or []:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            fatal("failed to retrieve agent configuration: invalid node-external-ip: invalid ip format '%s'" % value)


# =============================================================================
# Flannel. flannel-backend and flannel-external-ip are server flags, critical
# configuration (the same on every server: see CRITICAL below, and k3s-io/docs
# docs/cli/server.md at commit 0243496, "Critical Configuration Values"); `k3s agent`
# does not take them (its flag list has neither) and gets them from its server, as
# real agents get the server's config (k3s-io/k3s pkg/agent/config/config.go sets
# nodeConfig.FlannelBackend from the control config). Here the join reply carries them.
# flannel-io/flannel paths below are at commit cdf760595c23292fd03ff4daf03638ac1ceef417 (the
# wireguard lease's "Port" field is there since flannel v0.26.6, March 2025).
# =============================================================================

# k3s-io/k3s pkg/agent/flannel/setup.go (commit 05f0cdf08065bcfdbbfd1e6dbc5a5bf14d2bd984),
# createFlannelConf: vxlan, host-gw, wireguard-native (and tailscale, which --vpn-auth
# selects); "none" skips flannel (NoFlannel). Anything else is "Cannot configure unknown
# flannel backend '%s'", returned by flannel.Prepare from the agent's run() and logged by
# logrus.Fatal in cmd/server/main.go (commit 0208f16): the process exits 1 and systemd
# restarts it. That covers the removed backends too: `wireguard` (gone in v1.26) and
# `ipsec` (v1.27; its code removed in v1.28, k3s-io/k3s PR #8203, which also dropped the
# `backend=option` forms such as wireguard-native=auto): k3s-io/docs
# docs/networking/basic-network-options.md (commit 72100bc), "Migrating from wireguard
# or ipsec to wireguard-native".
FLANNEL_BACKENDS = ("none", "vxlan", "host-gw", "wireguard-native")
WIREGUARD_PORT = 51820  # flannel-io/flannel pkg/backend/wireguard/wireguard.go: ListenPort default
WIREGUARD_OVERHEAD = 80  # pkg/backend/wireguard/wireguard_network.go: the device MTU is the link's minus 80


class FlannelExited(Exception):
    """flannel's goroutine failed after k3s started: k3s-io/k3s pkg/agent/flannel/setup.go
    Run wraps it as "flannel exited: ..." and the process ends with status 1."""


def flannel_config(opts):
    """What a server tells its nodes about flannel (from its own flags)."""
    return {"backend": opts.get("flannel-backend") or "vxlan", "external_ip": bool(opts.get("flannel-external-ip"))}


def check_flannel_backend(backend):
    if backend in FLANNEL_BACKENDS:
        return
    if backend == "tailscale":
        # Real k3s accepts it only to run `tailscale` commands (the --vpn-auth integration);
        # the stand-in does not imitate that, so it refuses it instead (strict).
        fatal("flannel backend 'tailscale' needs --vpn-auth and the tailscale client; the k3s stand-in does not "
              "run them")
    fatal("Cannot configure unknown flannel backend '%s'" % backend)


def flannel_warnings(flannel, opts):
    """k3s-io/k3s pkg/agent/run.go (commit 0097157bb67cd6fedcd7e73e41a7b05665220838), run():
    on every node that runs flannel, before flannel.Prepare. Warnings only: the node starts."""
    if flannel["backend"] == "none" or not flannel["external_ip"]:
        return
    if not opts.get("node-external-ip"):
        warn("Server has flannel-external-ip flag set but this node does not set node-external-ip. Flannel will use "
             "internal address when connecting to this node.")
    elif flannel["backend"] != "wireguard-native":
        warn("Flannel is using external addresses with an insecure backend: %s. Please consider using an encrypting "
             "flannel backend." % flannel["backend"])


WIREGUARD_MODULE_FILES = ("wireguard.ko", "wireguard.ko.zst", "wireguard.ko.xz", "wireguard.ko.gz")


def wireguard_module():
    """Whether this host's kernel can make a link of type wireguard: "loaded", "builtin",
    "module" or None. The same signal as the tool's facts probe: /sys/module/wireguard, a
    modules.builtin line ending in /wireguard.ko, or a wireguard.ko[.zst|.xz|.gz] under
    /lib/modules/<release> (the kernel loads it on demand: rtnetlink asks for
    rtnl-link-wireguard). Paths go through host(), so a sandbox or a test host can place a
    module file; the test machines' kernel itself has no WireGuard."""
    if os.path.isdir(host("/sys/module/wireguard")):
        return "loaded"
    base = host("/lib/modules/" + os.uname().release)
    builtin = read_text(os.path.join(base, "modules.builtin")) or ""
    if any(line.strip().endswith("/wireguard.ko") for line in builtin.splitlines()):
        return "builtin"
    for _, _, files in os.walk(base):
        if any(f in WIREGUARD_MODULE_FILES for f in files):
            return "module"
    return None


def _x25519_base(scalar):
    """X25519(scalar, 9) (RFC 7748, section 5): a WireGuard public key from its private key."""
    p = 2 ** 255 - 19
    k = int.from_bytes(scalar, "little")
    k = (k & ~7 & ~(1 << 255)) | (1 << 254)
    x1, x2, z2, x3, z3, swap = 9, 1, 0, 9, 1, 0
    for t in range(254, -1, -1):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b, c, d = (x2 + z2) % p, (x2 - z2) % p, (x3 + z3) % p, (x3 - z3) % p
        aa, bb, da, cb = a * a % p, b * b % p, d * a % p, c * b % p
        e = (aa - bb) % p
        x3, z3 = (da + cb) ** 2 % p, x1 * (da - cb) ** 2 % p
        x2, z2 = aa * bb % p, e * (aa + 121665 * e) % p
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, p - 2, p) % p).to_bytes(32, "little")


def wireguard_key():
    """The node's WireGuard key pair as flannel keeps it: flannel-io/flannel
    pkg/backend/wireguard/device.go (commit cdf760595c23292fd03ff4daf03638ac1ceef417),
    setupKeys: $WIREGUARD_KEY_FILE or /run/flannel/wgkey, made once (a clamped random private
    key, base64, mode 0400) before the device is created. Returns the public key (base64)."""
    path = os.environ.get("WIREGUARD_KEY_FILE") or host("/run/flannel/wgkey")
    text = read_text(path)
    if text is not None:  # flannel reads the file as it is (wgtypes.ParseKey: no trimming)
        try:
            private = base64.b64decode(text, validate=True)
        except ValueError:
            raise FlannelExited("failed to register flannel network: could not parse private key from file: "
                                "wgtypes: failed to parse base64-encoded key: illegal base64 data")
        if len(private) != 32:
            raise FlannelExited("failed to register flannel network: could not parse private key from file: "
                                "wgtypes: incorrect key size: %d" % len(private))
    else:
        raw = bytearray(secrets.token_bytes(32))
        raw[0] &= 248
        raw[31] = (raw[31] & 127) | 64
        private = bytes(raw)
        write_file(path, base64.b64encode(private).decode(), 0o400)
    return base64.b64encode(_x25519_base(private)).decode()


def vtep_mac(name):
    """flannel.1's MAC (the VXLAN lease's VtepMAC): the link's own where there is one, else a
    stable locally administered one."""
    text = (read_text("/sys/class/net/flannel.1/address") or "").strip() if not SANDBOX else ""
    if re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", text):
        return text
    digest = bytearray(hashlib.sha256(("vtep:" + name).encode()).digest()[:6])
    digest[0] = (digest[0] & 0xFE) | 0x02
    return ":".join("%02x" % b for b in digest)


def start_flannel(flannel, opts, name, address, subnet):
    """What flannel does once the node is up: the backend's device, /run/flannel/subnet.env, and
    the lease it records on the Node (flannel-io/flannel pkg/subnet/kube/kube.go, AcquireLease:
    annotations flannel.alpha.coreos.com/backend-type, backend-data, public-ip,
    kube-subnet-manager). Returns (lease or None, failure or None); a failure is logged after
    READY=1, as real k3s's flannel goroutine fails after the node started."""
    backend = flannel["backend"]
    if backend == "none":
        return None, None
    info("Starting flannel with backend %s" % backend)
    mtu = 1450
    try:
        if backend == "wireguard-native":
            # k3s-io/k3s pkg/agent/flannel/setup.go: wireguard-native is flannel's "wireguard"
            # backend (Type wireguard, PersistentKeepaliveInterval 25). flannel-io/flannel
            # pkg/backend/wireguard/device.go: setupKeys, then netlink.LinkAdd of a GenericLink
            # of type "wireguard"; a kernel without the module answers EOPNOTSUPP ("Unknown
            # device type"), which ensureLink returns as "could not create wireguard interface:
            # %w". k3s logs it as "flannel exited: failed to register flannel network: ..." and
            # the process exits 1 (k3s-io/k3s issue #11166: level=error, then systemd
            # "status=1/FAILURE" and a restart, for ever).
            public_key = wireguard_key()
            if wireguard_module() is None:
                raise FlannelExited("failed to register flannel network: could not create wireguard interface: "
                                    "operation not supported")
            if not SANDBOX:
                setup_wireguard_link()
                hold_udp(WIREGUARD_PORT)  # the kernel's WireGuard socket: UDP 51820 on every address
            btype, data, mtu = "wireguard", {"PublicKey": public_key, "Port": WIREGUARD_PORT}, 1500 - WIREGUARD_OVERHEAD
        elif backend == "vxlan":
            # flannel-io/flannel pkg/backend/vxlan/vxlan.go newSubnetAttrs: {"VNI":1,"VtepMAC":...}
            btype, data = "vxlan", {"VNI": 1, "VtepMAC": vtep_mac(name)}
        else:  # host-gw: no backend data (a nil json.RawMessage marshals as null)
            btype, data, mtu = "host-gw", None, 1500
    except FlannelExited as exc:
        return None, "flannel exited: %s" % exc
    # flannel-io/flannel WriteSubnetFile (k3s-io/k3s pkg/agent/flannel/flannel.go): after the
    # network registered.
    write_file(host("/run/flannel/subnet.env"),
               "FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s\nFLANNEL_MTU=%d\nFLANNEL_IPMASQ=true\n"
               % ((opts.get("cluster-cidr") or ["10.42.0.0/16"])[0], subnet, mtu), 0o644)
    info("Wrote flannel subnet file to /run/flannel/subnet.env")
    # The lease's PublicIP is the flannel interface's address (LookupExtInterface: the link
    # holding the node IP); the Node's public-ip-overwrite annotation replaces it (kube.go).
    return {"backend-type": btype, "backend-data": json.dumps(data, separators=(",", ":")),
            "public-ip": address}, None


# =============================================================================
# systemd notification (the tool's units are Type=notify, like the installer's).
# =============================================================================

def sd_notify(message):
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(path)
            s.sendall(message.encode())
    except OSError as exc:
        warn("sd_notify failed: %s" % exc)


# =============================================================================
# Node footprint: what real k3s leaves on every node (server or agent) and what
# the tool's `down` must undo. Each network step is best effort and logged.
# =============================================================================

NVIDIA_RUNTIMES = (  # name, executable; as pkg/agent/containerd/runtimes.go
    ("crun", "crun"),
    ("nvidia", "nvidia-container-runtime"),
    ("nvidia-experimental", "nvidia-container-runtime-experimental"),
    ("nvidia-cdi", "nvidia-container-runtime.cdi"),
)
# k3s puts these in front of $PATH for runtime detection (GPU Operator's toolkit dir).
RUNTIME_DIRS = ("/usr/local/nvidia/toolkit", "/opt/kwasm/bin")


def data_hash():
    return hashlib.sha256(("k3s-standin " + EMBEDDED["version"]).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def find_runtimes():
    """Looked up once, when k3s renders containerd's config at start, as k3s does: a runtime
    installed later is found only at the next start."""
    dirs = [host(d) for d in RUNTIME_DIRS] + os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").split(":")
    found = {}
    for name, exe in NVIDIA_RUNTIMES:
        for d in dirs:
            candidate = os.path.join(d, exe)
            if d and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                info("Found %s container runtime at %s" % (name, candidate))
                found[name] = candidate
                break
    return found


def runtime_facts(opts):
    """What this node's containerd runs pods with, for the API simulator: the runtime
    handlers it has (runc and the NVIDIA ones k3s found) and the default one."""
    cdi = [d for d in ("/etc/cdi", "/var/run/cdi") if os.path.isdir(host(d)) and os.listdir(host(d))]
    return {"handlers": ["runc"] + sorted(find_runtimes()), "default": opts.get("default-runtime") or "runc",
            "cdi_specs": bool(cdi)}


def containerd_config(data_dir, runtimes, opts, backend="vxlan"):
    """containerd 2 (config version 3) as k3s >= 1.31.6/1.32.2 renders it; the
    runtime blocks follow ContainerdConfigTemplateV3's ExtraRuntimes loop. `backend`: the
    cluster's flannel backend (an agent's comes from its server)."""
    agent = os.path.join(data_dir, "agent")
    lines = [
        "# File generated by k3s. DO NOT EDIT. Use config-v3.toml.tmpl instead.",
        "version = 3",
        'root = "%s/containerd"' % agent,
        'state = "%s"' % host("/run/k3s/containerd"),
        "",
        "[grpc]",
        '  address = "%s"' % host("/run/k3s/containerd/containerd.sock"),
        "",
        "[plugins.'io.containerd.internal.v1.opt']",
        '  path = "%s/containerd"' % agent,
        "",
        "[plugins.'io.containerd.grpc.v1.cri']",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "10010"',
        "",
        "[plugins.'io.containerd.cri.v1.runtime']",
        "  enable_selinux = %s" % ("true" if opts.get("selinux") else "false"),
        "  enable_unprivileged_ports = true",
        "  enable_unprivileged_icmp = true",
        "  device_ownership_from_security_context = %s" % ("true" if opts.get("nonroot-devices") else "false"),
        "",
        "[plugins.'io.containerd.cri.v1.images']",
        '  snapshotter = "%s"' % (opts.get("snapshotter") or "overlayfs"),
        "  disable_snapshot_annotations = true",
        "",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        '  sandbox = "%s"' % (opts.get("pause-image") or "rancher/mirrored-pause:3.6"),
        "",
    ]
    if backend != "none":
        lines += [
            "[plugins.'io.containerd.cri.v1.runtime'.cni]",
            '  bin_dirs = ["%s"]' % os.path.join(data_dir, "data", "cni"),
            '  conf_dir = "%s/etc/cni/net.d"' % agent,
            "",
        ]
    default_runtime = opts.get("default-runtime")
    if default_runtime:
        lines += ["[plugins.'io.containerd.cri.v1.runtime'.containerd]",
                  '  default_runtime_name = "%s"' % default_runtime, ""]
    lines += [
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        "",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
        "  SystemdCgroup = true",
        "",
        "[plugins.'io.containerd.cri.v1.images'.registry]",
        '  config_path = "%s/etc/containerd/certs.d"' % agent,
        "",
    ]
    for name in sorted(runtimes):
        lines += [
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'%s']" % name,
            '  runtime_type = "io.containerd.runc.v2"',
            "",
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'%s'.options]" % name,
            "  BinaryName = %s" % json.dumps(runtimes[name]),
            "  SystemdCgroup = true",
            "",
        ]
    return "\n".join(lines)


def run_quiet(cmd):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return proc.returncode, (proc.stderr or proc.stdout).strip()


def link_exists(name):
    return os.path.exists("/sys/class/net/" + name)


def setup_links(address, backend="vxlan"):
    """cni0 (bridge; made by flannel's CNI delegate, so not with flannel-backend none) and, for
    vxlan, flannel.1 (VXLAN on 8472 like flannel; dummy as a fallback). host-gw makes no link;
    wireguard-native's flannel-wg comes with flannel's start (setup_wireguard_link)."""
    attempts = {}
    if backend != "none":
        attempts["cni0"] = [["ip", "link", "add", "cni0", "type", "bridge"],
                            ["ip", "link", "add", "cni0", "type", "dummy"]]
    if backend == "vxlan":
        attempts["flannel.1"] = [["ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", address,
                                  "dstport", "8472", "nolearning"],
                                 ["ip", "link", "add", "flannel.1", "type", "dummy"]]
    make_links(attempts)


def setup_wireguard_link():
    """flannel-wg as flannel's wireguard backend names it (pkg/backend/wireguard/wireguard.go),
    MTU 1420; where the kernel has no WireGuard (the test machines: "Error: Unknown device
    type.") a dummy link, else a bridge, stands in, so `down` has the link to remove."""
    mtu = str(1500 - WIREGUARD_OVERHEAD)
    make_links({"flannel-wg": [["ip", "link", "add", "flannel-wg", "mtu", mtu, "type", kind]
                               for kind in ("wireguard", "dummy", "bridge")]})


def make_links(attempts):
    for name, commands in attempts.items():
        if link_exists(name):
            continue
        problems = []
        for cmd in commands:
            rc, out = run_quiet(cmd)
            if rc == 0:
                run_quiet(["ip", "link", "set", name, "up"])
                info("Created network link %s (%s)" % (name, cmd[cmd.index("type") + 1]))
                break
            problems.append(out)
        else:
            warn("Could not create network link %s (stand-in, best effort): %s" % (name, "; ".join(problems)))


IPTABLES_CHAINS = (  # table, chain, built-in chain that jumps to it
    ("nat", "FLANNEL-POSTRTG", "POSTROUTING"),
    ("filter", "FLANNEL-FWD", "FORWARD"),
    ("filter", "KUBE-ROUTER-INPUT", "INPUT"),
    ("filter", "KUBE-ROUTER-FORWARD", "FORWARD"),
)


def setup_iptables(opts, backend="vxlan"):
    if not shutil.which("iptables"):
        warn("iptables not found; skipping flannel/kube-router chains (stand-in, best effort)")
        return
    for table, chain, parent in IPTABLES_CHAINS:
        if chain.startswith("KUBE-ROUTER") and opts.get("disable-network-policy"):
            continue
        if chain.startswith("FLANNEL") and backend == "none":
            continue
        rc, out = run_quiet(["iptables", "-w", "5", "-t", table, "-N", chain])
        if rc != 0 and "exists" not in out:
            warn("Could not create iptables chain %s/%s (stand-in, best effort): %s" % (table, chain, out))
            continue
        if run_quiet(["iptables", "-w", "5", "-t", table, "-C", parent, "-j", chain])[0] != 0:
            run_quiet(["iptables", "-w", "5", "-t", table, "-A", parent, "-j", chain])
        info("iptables chain %s/%s in place" % (table, chain))


def start_shim(shim_path):
    """A containerd-shim-runc-v2 stand-in, in its own session like real shims, so it
    survives `systemctl stop` when the unit has KillMode=process (as the installer's
    units do); k3s-killall.sh finds shims by k3s/data/*/bin/containerd-shim in ps.
    It runs one pod (see shim_main) whose memory-medium emptyDir kubelet mounted first: a
    tmpfs at /var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>
    (kubernetes/kubernetes pkg/volume/emptydir/empty_dir.go, setupTmpfs)."""
    pidfile = host("/run/k3s/containerd/standin-shim.pid")
    try:
        pid = int((read_text(pidfile) or "0").strip() or 0)
        if pid and b"containerd-shim" in open("/proc/%d/cmdline" % pid, "rb").read():
            return
    except (OSError, ValueError):
        pass
    pod_id = secrets.token_hex(32)
    volume = host("/var/lib/kubelet/pods/%s/volumes/kubernetes.io~empty-dir/cache" % uuid.uuid4())
    mkdirs(volume, 0o750)
    rc, out = run_quiet(["mount", "-t", "tmpfs", "tmpfs", volume])
    if rc != 0:
        warn("Could not mount the pod's emptyDir tmpfs at %s (stand-in, best effort): %s" % (volume, out))
    try:
        proc = subprocess.Popen(
            [shim_path, "-namespace", "k8s.io", "-id", pod_id, "-address", host("/run/k3s/containerd/containerd.sock")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, cwd="/", env=dict(os.environ, STANDIN_POD_VOLUME=volume))
    except OSError as exc:
        warn("Could not start the containerd-shim stand-in: %s" % exc)
        return
    write_file(pidfile, "%d\n" % proc.pid)
    info("Started containerd-shim-runc-v2 (pid %d) for a pod sandbox" % proc.pid)


# What k3s takes from agent/images: the archive formats of rancher/wharfie pkg/tarfile
# (SupportedExtensions) and .txt image lists (k3s-io/k3s pkg/agent/containerd/watcher.go
# isFileSupported; containerd.go preloadFile: a .txt is pulled line by line).
IMAGE_SUFFIXES = (".tar", ".tar.lz4", ".tar.bz2", ".tbz", ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".txt")


# What go-containerregistry's name.ParseReference(s, WeakValidation, Insecure) takes (k3s
# checks each line of a .txt list with it): an optional registry (a first part with "." or
# ":" or "localhost"), lowercase repository parts of [a-z0-9_.-], then an optional tag of
# [A-Za-z0-9_.-] (at most 128, not starting with . or -) and/or @sha256:<64 hex>.
IMAGE_REFERENCE = re.compile(r"^(?:(?:[A-Za-z0-9.-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/)?"
                             r"[a-z0-9_.-]+(?:/[a-z0-9_.-]+)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                             r"(?:@sha256:[0-9a-f]{64})?$")


def pull_list(data_dir, path):
    """A .txt list as k3s's prePullImages takes it (k3s-io/k3s pkg/agent/containerd/containerd.go,
    v1.32+: preloadFile logs "Pulling images from PATH"; each line trimmed, blank ones skipped,
    one go-containerregistry cannot parse logged "Failed to parse image reference %q: could not
    parse reference: ..." and skipped, the others kept; one already held "has already been
    pulled"; the rest pulled one after the other through the CRI, "Pulling image NAME").
    Pulls take K3S_STANDIN_PULL_SECONDS each and are logged to standin-pulls.log as
    `crictl pull`'s are."""
    info("Pulling images from %s" % path)
    held = load_images(data_dir)
    got, errors = [], []
    for line in (read_text(path) or "").splitlines():
        name = line.strip()
        if not name:
            continue
        if not IMAGE_REFERENCE.match(name):
            error("Failed to parse image reference %s: could not parse reference: %s" % (json.dumps(name), name))
            continue
        if normalise_image(name) in held:
            info("Image %s has already been pulled" % name)
            got.append(normalise_image(name))  # found through the CRI's status: its RepoTags
            continue
        info("Pulling image %s" % name)
        time.sleep(float(os.environ.get("K3S_STANDIN_PULL_SECONDS", "0.5")))
        add_images(data_dir, [name], "pull:" + os.path.basename(path))
        with open(os.path.join(data_dir, "agent", "containerd", "standin-pulls.log"), "a") as fh:
            fh.write("%.3f %s\n" % (time.time(), normalise_image(name)))
        # then the image service's Get by the list's own text: a short name is not what the CRI
        # stored (docker.io/library/...), so that lookup fails and nothing of the list is pinned
        # (k3s-io/k3s pkg/agent/containerd/containerd.go: prePullImages, and preloadFile returns
        # its error before labelImages)
        if normalise_image(name) == name:
            got.append(name)
        else:
            errors.append('image "%s": not found' % name)
    if errors:
        return "failed to pull images from %s: %s" % (path, "; ".join(errors))
    label_images(data_dir, got)
    return None


def import_file(data_dir, path):
    """One file of agent/images, logged as k3s logs it."""
    started = time.monotonic()
    if path.endswith(".txt"):
        failed = pull_list(data_dir, path)
        if failed:
            error("Error encountered while importing %s: %s" % (path, failed))
            return None  # said already
        info("Imported images from %s in %.3fs" % (path, time.monotonic() - started))
        return True
    info("Importing images from %s" % path)
    if import_archive(data_dir, path):
        info("Imported images from %s in %.3fs" % (path, time.monotonic() - started))
        return True
    return False


def import_images(data_dir):
    """Real k3s imports every supported file in agent/images into containerd at start, before
    it goes on to the kubelet (containerd.go Run returns PreloadImages' result): a .txt list
    there makes the start wait for every pull in it."""
    images = os.path.join(data_dir, "agent", "images")
    mkdirs(images)
    clear_labels(data_dir)
    seen = {}
    for name in sorted(os.listdir(images)):
        path = os.path.join(images, name)
        if not os.path.isfile(path) or not name.endswith(IMAGE_SUFFIXES):
            continue
        seen[path] = os.stat(path)
        if import_file(data_dir, path) is False:
            error("Error encountered while importing %s: unrecognised archive contents" % path)
    return seen


def watch_images(data_dir, seen):
    """From the January 2025 releases k3s also imports what lands in agent/images while it
    runs (watcher.go: fsnotify events, handled 2 s later; a file is imported when it is new,
    or when its size changed and it is newer; "Failed to import %s: %v" otherwise). Polled
    here once a second."""
    images = os.path.join(data_dir, "agent", "images")

    def loop():
        pending = {}
        while True:
            time.sleep(1)
            try:
                names = sorted(os.listdir(images))
            except OSError:
                continue
            now = time.monotonic()
            for name in names:
                path = os.path.join(images, name)
                if not name.endswith(IMAGE_SUFFIXES) or not os.path.isfile(path):
                    continue
                st, last = os.stat(path), seen.get(path)
                if last is None or (st.st_size != last.st_size and st.st_mtime > last.st_mtime):
                    pending.setdefault(path, now + 2)
                    seen[path] = st
            for path, due in sorted(pending.items()):
                if due <= now:
                    del pending[path]
                    if import_file(data_dir, path) is False:
                        error("Failed to import %s: unrecognised archive contents" % path)

    threading.Thread(target=loop, name="image-watcher", daemon=True).start()


# =============================================================================
# The image store of k3s's containerd, as `k3s crictl images` shows it. Archives
# (air-gap tarballs) name their images in a k3s-images.txt / images.txt member
# (one reference a line); `k3s crictl pull REF` adds REF (nothing is downloaded:
# the test hosts have no registry) and logs "<unix time> <ref>" to
# agent/containerd/standin-pulls.log, so tests can see when and where pulls ran.
# The socket file holds the running k3s's pid: crictl/ctr fail when it is gone.

def image_store(data_dir):
    return os.path.join(data_dir, "agent", "containerd", "standin-images.json")


def normalise_image(ref):
    name = ref.split("@", 1)[0]
    if ":" not in name.rsplit("/", 1)[-1] and "@" not in ref:
        ref += ":latest"
    first = ref.split("/", 1)[0]
    if "/" not in ref or not re.search(r"[.:]|^localhost$", first):
        ref = "docker.io/" + (ref if "/" in ref else "library/" + ref)
    return ref


def load_images(data_dir):
    try:
        with open(image_store(data_dir)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def save_images(data_dir, images):
    mkdirs(os.path.dirname(image_store(data_dir)))
    write_file(image_store(data_dir), json.dumps(images, indent=1, sort_keys=True) + "\n", 0o600)


def add_images(data_dir, refs, source):
    images = load_images(data_dir)
    for ref in refs:
        kept = images.get(normalise_image(ref), {}).get("labels", {})
        images[normalise_image(ref)] = {"source": source, "id": hashlib.sha256(ref.encode()).hexdigest(),
                                        "labels": kept}
    save_images(data_dir, images)


# Pinned images (kubelet's image GC keeps what the CRI reports pinned: containerd's label
# io.cri-containerd.pinned=pinned). k3s pins what it imports or pulls from agent/images with
# that label and its own io.cattle.k3s.pinned beside it, and at every start first clears both
# from each image carrying its own (k3s-io/k3s pkg/agent/containerd/containerd.go, labelImages,
# clearLabels): an image stays pinned across starts only while a file in agent/images has it.
# k3s's own e2e test shows both halves: tests/e2e/autoimport/autoimport_test.go ("Verify bb.txt
# image and see if are pinned", then "Verify if bb.txt image is unpinned" after the list was
# removed and the node restarted; read on k3s-io/k3s master, December 2026).
CRI_PINNED, K3S_PINNED = "io.cri-containerd.pinned", "io.cattle.k3s.pinned"


def label_images(data_dir, names):
    images = load_images(data_dir)
    for name in names:
        if name in images:
            images[name].setdefault("labels", {}).update({CRI_PINNED: "pinned", K3S_PINNED: "pinned"})
    save_images(data_dir, images)


def clear_labels(data_dir):
    images = load_images(data_dir)
    for entry in images.values():
        labels = entry.get("labels", {})
        if labels.get(K3S_PINNED) == "pinned":
            labels.pop(K3S_PINNED, None)
            labels.pop(CRI_PINNED, None)
    if images:
        save_images(data_dir, images)


def _unzstd_raw(data):
    """The frames airgap.py writes: zstd with raw blocks only (enough for a stand-in)."""
    if not data.startswith(b"\x28\xb5\x2f\xfd"):
        return None
    fhd = data[4]
    pos = 5 + (0 if fhd & 0x20 else 1)  # window descriptor unless single-segment
    pos += {0: 0, 1: 1, 2: 2, 3: 4}[fhd & 3]  # dictionary id
    fcs = fhd >> 6
    pos += {0: 1 if fhd & 0x20 else 0, 1: 2, 2: 4, 3: 8}[fcs]
    out = b""
    while pos + 3 <= len(data):
        header = int.from_bytes(data[pos:pos + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        pos += 3
        if kind != 0:
            return None
        out += data[pos:pos + size]
        pos += size
        if last:
            return out
    return None


def import_archive(data_dir, path):
    import bz2
    import gzip
    import io
    import tarfile

    with open(path, "rb") as fh:
        data = fh.read()
    try:
        if path.endswith((".zst", ".tzst")):
            data = _unzstd_raw(data)
        elif path.endswith((".gz", ".tgz")):
            data = gzip.decompress(data)
        elif path.endswith((".bz2", ".tbz")):
            data = bz2.decompress(data)
        elif path.endswith(".lz4"):
            data = None  # not readable here; the real k3s can
        if data is None or data[257:262] != b"ustar":
            return False
        refs = []
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                if member.isfile() and os.path.basename(member.name) in ("k3s-images.txt", "images.txt"):
                    text = tar.extractfile(member).read().decode()
                    refs += [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("#")]
    except (OSError, ValueError, EOFError, tarfile.TarError):
        return False
    add_images(data_dir, refs, "import:" + os.path.basename(path))
    label_images(data_dir, [normalise_image(r) for r in refs])
    return True


def containerd_running():
    try:
        with open(host("/run/k3s/containerd/containerd.sock")) as fh:
            os.kill(int(fh.read().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def cmd_crictl(args):
    data_dir = host(DEFAULT_DATA_DIR)
    if not containerd_running():
        sys.stderr.write('time="%s" level=fatal msg="validate service connection: validate CRI v1 image API '
                         'for endpoint \\"unix:///run/k3s/containerd/containerd.sock\\": rpc error: code = '
                         'Unavailable desc = connection error: dial unix /run/k3s/containerd/containerd.sock: '
                         'connect: connection refused"\n' % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return 1
    words = [a for a in args if not a.startswith("-")]
    if words[:1] == ["images"]:
        digests = "--digests" in args
        head = ["IMAGE", "TAG"] + (["DIGEST"] if digests else []) + ["IMAGE ID", "SIZE"]
        rows = []
        for ref, entry in sorted(load_images(data_dir).items()):
            name, _, tag = ref.rpartition(":") if "@" not in ref else (ref.split("@")[0], "", "<none>")
            row = [name, tag] + ([entry["id"][:13]] if digests else []) + [entry["id"][:13], "1.0MB"]
            rows.append(row)
        print("   ".join(head))
        for row in rows:
            print("   ".join(row))
        return 0
    if words[:1] == ["inspecti"] and len(words) == 2:
        # the CRI resolves a short name as it stored it; its status says whether it is pinned
        entry = load_images(data_dir).get(normalise_image(words[1]))
        if entry is None:
            sys.stderr.write('time="%s" level=fatal msg="no such image \\"%s\\" present"\n'
                             % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), words[1]))
            return 1
        print(json.dumps({"status": {"id": "sha256:" + entry["id"], "repoTags": [normalise_image(words[1])],
                                     "pinned": entry.get("labels", {}).get(CRI_PINNED) == "pinned"}}, indent=2))
        return 0
    if words[:1] == ["pull"] and len(words) == 2:
        ref = words[1]
        add_images(data_dir, [ref], "pull")
        with open(os.path.join(data_dir, "agent", "containerd", "standin-pulls.log"), "a") as fh:
            fh.write("%.3f %s\n" % (time.time(), normalise_image(ref)))
        time.sleep(float(os.environ.get("K3S_STANDIN_PULL_SECONDS", "0.5")))
        print("Image is up to date for sha256:%s" % hashlib.sha256(ref.encode()).hexdigest())
        return 0
    sys.stderr.write("k3s crictl %s is not available in the k3s stand-in\n" % " ".join(args))
    return 1


def ctr_label(data_dir, name, pairs):
    """`ctr images label NAME k=v...` (containerd cmd/ctr/commands/images/label.go: "Set and clear labels
    for an image"; `k=` clears k). ctr takes the name as stored: no normalising."""
    images = load_images(data_dir)
    if name not in images:
        sys.stderr.write('ctr: image "%s": not found\n' % name)
        return 1
    labels = images[name].setdefault("labels", {})
    for pair in pairs:
        key, _, value = pair.partition("=")
        if value:
            labels[key] = value
        else:
            labels.pop(key, None)
    save_images(data_dir, images)
    print(",".join("%s=%s" % kv for kv in sorted(labels.items())))
    return 0


def ctr_list(data_dir):
    print("REF\tTYPE\tDIGEST\tSIZE\tPLATFORMS\tLABELS")
    for ref, entry in sorted(load_images(data_dir).items()):
        labels = ",".join("%s=%s" % kv for kv in sorted(entry.get("labels", {}).items())) or "-"
        print("%s\tapplication/vnd.oci.image.index.v1+json\tsha256:%s\t1.0 MiB\tlinux/amd64\t%s"
              % (ref, entry["id"], labels))
    return 0


def cmd_ctr(args):
    """`k3s ctr [-n k8s.io] images import FILE`: an archive into the store; `images label`,
    `images ls`."""
    data_dir = host(DEFAULT_DATA_DIR)
    words = [a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] in ("-n", "--namespace"))]
    if words[:1] in (["images"], ["image"], ["i"]) and words[1:2] in (["label"], ["ls"], ["list"]):
        if not containerd_running():
            sys.stderr.write("ctr: failed to dial \"/run/k3s/containerd/containerd.sock\": connection refused\n")
            return 1
        if words[1] == "label" and len(words) >= 3:
            return ctr_label(data_dir, words[2], words[3:])
        if words[1] in ("ls", "list"):
            return ctr_list(data_dir)
    if words[:2] in (["images", "import"], ["image", "import"]) and len(words) == 3:
        if not containerd_running():
            sys.stderr.write("ctr: failed to dial \"/run/k3s/containerd/containerd.sock\": connection refused\n")
            return 1
        if not import_archive(data_dir, words[2]):
            sys.stderr.write("ctr: unrecognized image format\n")
            return 1
        print("unpacking images from %s...done" % words[2])
        return 0
    sys.stderr.write("k3s ctr %s is not available in the k3s stand-in\n" % " ".join(args))
    return 1


def node_footprint(opts, data_dir, address, flannel):
    """Directories, files, links, chains and the shim, as real k3s leaves them. `flannel`: the
    cluster's flannel settings (flannel_config of the server)."""
    backend = flannel["backend"]
    check_flannel_backend(backend)
    flannel_warnings(flannel, opts)
    agent = os.path.join(data_dir, "agent")
    data = os.path.join(data_dir, "data")
    digest = data_hash()
    bindir = os.path.join(data, digest, "bin")
    mkdirs(bindir)
    write_file(os.path.join(data, ".lock"), "", 0o600)
    # data/<hash>/bin holds k3s's bundled binaries; data/current points at them, and an
    # upgrade moves the old target to data/previous.
    current = os.path.join(data, "current")
    if os.path.islink(current) and os.readlink(current) != os.path.join(data, digest):
        previous = os.path.join(data, "previous")
        if os.path.lexists(previous):
            os.unlink(previous)
        os.symlink(os.readlink(current), previous)
        os.unlink(current)
    if not os.path.lexists(current):
        os.symlink(os.path.join(data, digest), current)
    cni_multicall = os.path.join(bindir, "cni")
    write_file(cni_multicall, "#!/bin/sh\n# k3s stand-in: CNI plugins placeholder\nexit 0\n", 0o755)
    shim = os.path.join(bindir, "containerd-shim-runc-v2")
    if os.path.realpath(sys.argv[0]) != os.path.realpath(shim):
        shutil.copyfile(os.path.realpath(sys.argv[0]), shim + ".tmp")
        os.chmod(shim + ".tmp", 0o755)
        os.replace(shim + ".tmp", shim)
    # data/cni: the stable CNI bin dir (k3s >= 1.28.15/1.29.10/1.30.6/1.31.2), symlinks
    # into the current data dir.
    cni = os.path.join(data, "cni")
    mkdirs(cni)
    for plugin in ("bandwidth", "bridge", "cni", "firewall", "flannel", "host-local", "loopback", "portmap"):
        link = os.path.join(cni, plugin)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(cni_multicall, link)

    runtimes = find_runtimes()
    write_file(os.path.join(agent, "etc", "containerd", "config.toml"),
               containerd_config(data_dir, runtimes, opts, backend), 0o600)
    default_runtime = opts.get("default-runtime")
    if default_runtime and default_runtime != "runc" and default_runtime not in runtimes:
        # k3s renders default_runtime_name whether or not it found that runtime
        # (k3s-io/k3s pkg/agent/templates/templates_linux.go); containerd's CRI plugin then
        # refuses to load (containerd internal/cri/config/config.go, ValidateRuntimeConfig)
        # and kubelet never gets a runtime: the node does not come up. Real k3s keeps
        # logging "Waiting for containerd startup" (pkg/agent/containerd/containerd.go, Run);
        # the stand-in exits with containerd's error instead, so the failure is seen at once.
        fatal("containerd: failed to load plugin io.containerd.grpc.v1.cri: no corresponding runtime configured "
              "in `containerd.runtimes` for `containerd` `default_runtime_name = \"%s\"`" % default_runtime)
    if backend != "none":
        # k3s-io/k3s pkg/agent/flannel/setup.go Prepare: the CNI config, before flannel runs
        # (/run/flannel/subnet.env comes once flannel registered: start_flannel).
        write_file(os.path.join(agent, "etc", "cni", "net.d", "10-flannel.conflist"), json.dumps({
            "name": "cbr0", "cniVersion": "1.0.0",
            "plugins": [{"type": "flannel", "delegate": {"hairpinMode": True, "forceAddress": True,
                                                          "isDefaultGateway": True}},
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                        {"type": "bandwidth", "capabilities": {"bandwidth": True}}]}, indent=2) + "\n", 0o600)
    for d in (host("/run/k3s/containerd"), os.path.join(agent, "containerd"), host("/var/lib/kubelet/pods"),
              host("/var/lib/cni/networks/cbr0"), host("/var/log/pods"), host("/var/log/containers")):
        mkdirs(d)
    write_file(host("/run/k3s/containerd/containerd.sock"), "%d\n" % os.getpid(), 0o600)
    ensure_node_password()
    watch_images(data_dir, import_images(data_dir))
    if SANDBOX:
        info("Sandbox (K3S_STANDIN_ROOT): skipping network links, iptables and the containerd-shim")
        return
    setup_links(address, backend)
    setup_iptables(opts, backend)
    if os.environ.get("K3S_STANDIN_NO_SHIM") != "1":
        start_shim(shim)


def kubelet_port(opts):
    for arg in opts.get("kubelet-arg", []):
        key, _, value = arg.lstrip("-").partition("=")
        if key == "port" and value.isdigit():
            return int(value), True
    return 10250, False


# =============================================================================
# Listeners. The supervisor/API port speaks TLS as k3s's does (k3s_pki.py); the
# kubelet stand-in is plain HTTP. The main ones are
# IPv6 dual-stack wildcards (ss shows *:6443, as for real k3s); auxiliary ports
# that real k3s holds (apiserver 6444, kubelet healthz 10248, kube-proxy, etcd)
# accept and close, so port checks see them owned by k3s.
# =============================================================================

class DualStackServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bind, port, handler, tls=None):
        self.tls = tls
        self.address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        super().__init__((bind, port), handler, bind_and_activate=False)
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            self.server_bind()
            self.server_activate()
        except Exception:
            self.server_close()
            raise

    def server_bind(self):
        # HTTPServer.server_bind would look up the bind address's FQDN (DNS); test hosts
        # have no DNS, so skip that.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "k3s", self.server_address[1]

    def get_request(self):
        conn, addr = super().get_request()
        if self.tls is not None:  # the handshake happens in the request's thread, on first read
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def finish_request(self, request, client_address):
        """A TLS connection whose ALPN chose "h2" is served as HTTP/2 (h2serve.py), as
        kube-apiserver serves Go clients; the others as HTTP/1.1 by the handler."""
        if self.tls is not None:
            request.settimeout(self.RequestHandlerClass.timeout)
            request.do_handshake()
            if request.selected_alpn_protocol() == "h2":
                if self.RequestHandlerClass.disable_nagle_algorithm:  # as the handler's setup sets it
                    request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
                h2serve().serve_h2(request, client_address, self, self.RequestHandlerClass)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        if sys.exc_info()[0] is not None and issubclass(sys.exc_info()[0], (ssl.SSLError, ConnectionError)):
            return  # a client that gave up, or failed the handshake: Go's http server logs at debug
        super().handle_error(request, client_address)


def listen_http(bind, port, handler, what, tls=None):
    """Bind `handler` on bind:port (TLS with the `tls` context); the default bind (0.0.0.0)
    becomes [::] dual-stack when IPv6 works. Fatal if the port is taken, as for real k3s."""
    binds = ["::", "0.0.0.0"] if bind in ("", "0.0.0.0") else [bind]
    last = None
    for b in binds:
        try:
            server = DualStackServer(b, port, handler, tls)
        except OSError as exc:
            last = exc
            if exc.errno == errno.EADDRINUSE:
                break
            continue
        threading.Thread(target=server.serve_forever, name=what, daemon=True).start()
        info("%s listening on %s:%d (%s: k3s stand-in)" % (what, "*" if b in ("::", "0.0.0.0") else b, port,
                                                          "HTTPS" if tls else "plain HTTP"))
        return server
    fatal("%s: failed to listen on %s:%d: %s" % (what, bind or "0.0.0.0", port, last))


def listen_aux(bind, port):
    """Hold a port like real k3s does; connections are accepted and closed."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind((bind, port))
        s.listen(16)
    except OSError as exc:
        warn("Could not hold port %s:%d (stand-in, best effort): %s" % (bind, port, exc))
        return

    def accept_loop():
        while True:
            try:
                conn, _ = s.accept()
                conn.close()
            except OSError:
                return

    threading.Thread(target=accept_loop, daemon=True).start()


UDP_HELD = []


def hold_udp(port):
    """Bind UDP `port` on every address, as a kernel WireGuard device does (datagrams to it get
    no ICMP port-unreachable); nothing reads them. Best effort."""
    last = None
    for family, bind in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        s = None
        try:
            s = socket.socket(family, socket.SOCK_DGRAM)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind((bind, port))
        except OSError as exc:
            last = exc
            if s is not None:
                s.close()
            continue
        UDP_HELD.append(s)
        return
    warn("Could not hold UDP port %d (stand-in, best effort): %s" % (port, last))


def aux_ports(opts, role, address, etcd):
    """(bind, port) pairs real k3s holds besides the supervisor and kubelet ports.
    In the sandbox only an explicitly configured lb-server-port is held."""
    lb = opts.get("lb-server-port") or 6444
    if SANDBOX:
        return [("127.0.0.1", lb)] if opts.get("lb-server-port") else []
    ports = [("127.0.0.1", lb if role == "agent" else 6444), ("127.0.0.1", 10248), ("127.0.0.1", 10249),
             ("::", 10256)]
    if role == "server":
        ports += [("127.0.0.1", 10257), ("127.0.0.1", 10259)]
        if etcd:
            ports += [("127.0.0.1", 2379), (address, 2379), (address, 2380), ("127.0.0.1", 2381)]
    return ports


class BodyError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


# kube-apiserver's MaxRequestBodyBytes: 3 MiB (kubernetes staging/src/k8s.io/apiserver/pkg/server/config.go,
# NewConfig); a larger body is 413.
MAX_REQUEST_BODY = 3 * 1024 * 1024


def read_request_body(rfile, headers, limit=MAX_REQUEST_BODY):
    """A request's whole body: Content-Length bytes, or the chunks of Transfer-Encoding:
    chunked (Go's net/http server takes both). Raises BodyError(400 or 413)."""
    if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
        return _read_chunked(rfile, limit)
    text = (headers.get("Content-Length") or "0").strip()
    if not text.isdigit():
        raise BodyError(400, "bad Content-Length")
    if int(text) > limit:
        raise BodyError(413, "request body too large")
    body = rfile.read(int(text)) if int(text) else b""
    if len(body) != int(text):
        raise BodyError(400, "unexpected end of the request body")
    return body


def _read_chunked(rfile, limit):
    parts, total = [], 0
    while True:
        line = rfile.readline(1026)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BodyError(400, "bad chunk size")
        if size == 0:
            break
        total += size
        if total > limit:
            raise BodyError(413, "request body too large")
        data = rfile.read(size)
        if len(data) != size or rfile.read(2) != b"\r\n":
            raise BodyError(400, "unexpected end of a chunk")
        parts.append(data)
    while rfile.readline(8194) not in (b"\r\n", b"\n", b""):  # trailers
        pass
    return b"".join(parts)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 with kept-alive connections, as kube-apiserver's Go net/http server
    (kubernetes staging/src/k8s.io/apiserver/pkg/server/secure_serving.go, Serve: an
    http.Server with IdleTimeout 90 s; its TLS config offers ALPN "h2" then "http/1.1",
    tlsConfig). Clients (kubectl, Helm, the tool's urllib3 pool) send every request of a
    session over one connection: through the SSH tunnel one channel and one TLS handshake,
    not one per request. A request with `Connection: close` (or HTTP/1.0 without
    keep-alive) still ends its connection (http.server does that). A connection whose TLS
    chose "h2" runs the same handler per stream (h2serve.py), as Go clients get it."""
    server_version = "k3s-standin"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 90  # the socket's timeout: an idle kept-alive connection ends after it
    # TCP_NODELAY, as every Go TCP connection has it (golang/go go1.24 src/net/tcpsock.go,
    # newTCPConn: setNoDelay(fd, true); k3s v1.33 builds with Go 1.24). Without it the body written after the headers waited
    # for the client's delayed ACK: ~40 ms per request, on every kept-alive connection.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # requests carry tokens in headers: log nothing of them
        return

    def send_response(self, code, message=None):
        self.connection_header_sent = False
        super().send_response(code, message)

    def send_header(self, keyword, value):
        if keyword.lower() == "connection":
            self.connection_header_sent = True
        super().send_header(keyword, value)

    def end_headers(self):
        # Go's server says it closes when the request asked (net/http server.go,
        # chunkWriter.writeHeader: closeAfterReply sets "Connection: close").
        if self.close_connection and not getattr(self, "connection_header_sent", True):
            self.send_header("Connection", "close")
        super().end_headers()

    def parse_request(self):
        """The request line and headers, then the whole body (self.body): on a kept-alive
        connection a body left unread would be taken for the next request."""
        self.body = b""
        if not super().parse_request():
            return False
        try:
            self.body = read_request_body(self.rfile, self.headers)
        except BodyError as exc:
            self.send_error(exc.code, str(exc))  # with Connection: close
            return False
        return True

    def write_chunk(self, data):
        """A piece of a streamed answer (Transfer-Encoding: chunked); empty is the last."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def reply(self, status, body, content_type="application/json"):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body, indent=2) + "\n"
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class KubeletHandler(QuietHandler):
    def do_GET(self):
        if self.path in ("/healthz", "/ping"):
            self.reply(200, "ok", "text/plain")
        else:
            self.reply(404, {"error": "the kubelet stand-in only answers /healthz"})


# =============================================================================
# Cluster state on a server: nodes recorded from joins (server/standin-nodes.json,
# 0600: it holds node password hashes), the critical config that must match on
# all servers (k3s refuses a joining server whose values differ).
# =============================================================================

CRITICAL = {  # flag -> default
    "cluster-cidr": "10.42.0.0/16", "service-cidr": "10.43.0.0/16", "cluster-dns": "10.43.0.10",
    "cluster-domain": "cluster.local", "disable-cloud-controller": "false", "disable-helm-controller": "false",
    "disable-network-policy": "false", "egress-selector-mode": "agent", "embedded-registry": "false",
    "flannel-backend": "vxlan", "flannel-external-ip": "false", "flannel-ipv6-masq": "false",
    "secrets-encryption": "false",
}


def critical_config(opts):
    values = {}
    for key, default in CRITICAL.items():
        value = opts.get(key)
        if isinstance(value, list):
            value = ",".join(value)
        values[key] = default if value in (None, "", []) else go_string(value)
    values["disable=servicelb"] = go_string("servicelb" in opts.get("disable", []))
    agent_token = token_from(opts, "agent-token")
    values["agent-token"] = hashlib.sha256(parse_token(agent_token)[1].encode()).hexdigest() if agent_token else ""
    return values


class Cluster:
    def __init__(self, data_dir):
        self.server_dir = os.path.join(data_dir, "server")
        self.path = os.path.join(self.server_dir, "standin-nodes.json")
        self.lock = threading.Lock()

    def load(self):
        text = read_text(self.path)
        return json.loads(text) if text else {"nodes": {}}

    def save(self, state):
        write_file(self.path, json.dumps(state, indent=2, sort_keys=True) + "\n", 0o600)

    def record(self, node):
        with self.lock:
            state = self.load()
            nodes = state.setdefault("nodes", {})
            old = nodes.get(node["name"])
            if old and old.get("pod_cidr"):
                node["pod_cidr"] = old["pod_cidr"]
            else:
                used = {n.get("pod_cidr") for n in nodes.values()}
                index = 0
                while "10.42.%d.0/24" % index in used:
                    index += 1
                node["pod_cidr"] = "10.42.%d.0/24" % index
            node["joined_at"] = old.get("joined_at") if old else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            nodes[node["name"]] = node
            self.save(state)
            return node

    def public(self):
        nodes = self.load().get("nodes", {})
        return [{k: v for k, v in n.items() if k != "password_sha256"} for _, n in sorted(nodes.items())]


def duplicate_member(cluster, body):
    """A joining server that is another etcd member than the one its node name has now (a
    new machine, or the same one with its etcd data gone): refused until that member is
    removed (the removal annotation, or deleting the Node: see kubeapi.py)."""
    old = cluster.load().get("nodes", {}).get(body.get("name"))
    return bool(old and old.get("etcd") and old.get("member") and body.get("member")
                and old["member"] != body["member"])


def removed_member(cluster, body):
    """A server starting on its old etcd data whose member the cluster removed since."""
    old = cluster.load().get("nodes", {}).get(body.get("name"))
    return bool(body.get("existing_etcd") and old and old.get("removed_from_etcd")
                and old.get("member") and old["member"] == body.get("member"))


def etcd_member_name(db, name):
    """k3s names its etcd member <node name>-<8 random hex> once per data dir and keeps it
    in db/etcd/name (k3s-io/k3s pkg/etcd/etcd.go, setName / nameFile)."""
    path = os.path.join(db, "etcd", "name")
    member = (read_text(path) or "").strip()
    if not member.startswith(name + "-"):
        member = "%s-%s" % (name, secrets.token_hex(4))
        mkdirs(os.path.dirname(path), 0o700)
        write_file(path, member + "\n", 0o600)
    return member


def ensure_node_password():
    """/etc/rancher/node/password: each node's secret for its node object (k3s makes it
    on first start; the server keeps its hash)."""
    path = host("/etc/rancher/node/password")
    if not os.path.exists(path):
        write_file(path, secrets.token_hex(16) + "\n", 0o600)


def node_record(opts, role, name, address, etcd):
    password = (read_text(host("/etc/rancher/node/password")) or "").strip()
    return {
        "name": name, "role": role, "address": address, "etcd": bool(etcd),
        "roles": (["control-plane", "etcd", "master"] if etcd else ["control-plane", "master"]) if role == "server" else [],
        "labels": list(opts.get("node-label", [])), "taints": list(opts.get("node-taint", [])),
        "external_ip": (opts.get("node-external-ip") or [None])[0], "version": EMBEDDED["version"],
        # every node-ip and node-external-ip: k3s records them comma-joined in the Node's
        # k3s.io/internal-ip and k3s.io/external-ip annotations (kubeapi.py)
        "node_ips": list(opts.get("node-ip") or [address]), "external_ips": list(opts.get("node-external-ip") or []),
        "password_sha256": hashlib.sha256(password.encode()).hexdigest() if password else None,
        # a server's API address as k3s advertises it (the `kubernetes` Endpoints, the agents'
        # server list: see apiservers)
        "advertise": "%s:%d" % (bracketed(advertise_address(opts, address)), opts.get("https-listen-port") or 6443)
        if role == "server" else None,
        # for the API simulator: host facts (CPUs, memory, GPUs, RDMA) and this start's stamp
        "hardware": dict(kubeapi().probe_hardware(host), runtimes=runtime_facts(opts)),
        "registered_at": "%.6f" % time.time(),
    }


def bracketed(address):
    return "[%s]" % address if address and ":" in address else address


def apiservers(cluster):
    """What /v1-k3s/apiservers answers: the `kubernetes` Endpoints' addresses, i.e. each
    server's advertise address (k3s-io/k3s pkg/server/handlers/handlers.go, APIServers;
    kube-apiserver publishes its --advertise-address there, which k3s sets from
    advertise-address, else node-external-ip, else node-ip: pkg/cli/server/server.go,
    pkg/daemons/control/server.go). An agent's load balancer takes this list as its servers
    (pkg/agent/tunnel/tunnel.go, which watches those Endpoints): an address the agent cannot
    reach (a public address behind a NAT without hairpin) leaves it with no API (k3s-io/k3s#8813)."""
    nodes = cluster.load().get("nodes", {})
    return sorted({n["advertise"] for n in nodes.values() if n.get("role") == "server" and n.get("advertise")})


def make_supervisor_handler(state):
    """The server's HTTP endpoints; `state` carries the CA, passwords, cluster."""

    class SupervisorHandler(QuietHandler):
        def api(self, method):
            """Serve a Kubernetes API request (True), or leave it to the stand-in's own paths."""
            api = state.get("api")
            if api is None or not api.handles(self.path):
                return False
            api.serve(self, method)
            return True

        def do_PUT(self):
            if not self.api("PUT"):
                self.reply(404, {"error": "not found"})

        def do_PATCH(self):
            if not self.api("PATCH"):
                self.reply(404, {"error": "not found"})

        def do_DELETE(self):
            if not self.api("DELETE"):
                self.reply(404, {"error": "not found"})

        def authorized(self, role):
            """(ok, peer): the join token check (CA hash, then password; agent token for agents)."""
            peer = "%s:%d" % self.client_address[:2]
            auth = self.headers.get("Authorization", "")
            token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
            m = re.fullmatch(r"K10([0-9a-f]{64})::([^:]+):(.+)", token.strip())
            hash_given, password = (m.group(1), m.group(3)) if m else (None, token.strip())
            if hash_given and hash_given != state["ca_hash"]:
                error("Failed to authenticate request from %s: token CA hash does not match the Cluster CA certificate hash" % peer)
                self.reply(401, {"error": "token CA hash does not match the Cluster CA certificate hash"})
                return False
            # The supervisor's users (k3s-io/k3s pkg/daemons/control/deps/deps.go, genUsers,
            # commit 09ac65a6): "server" with the server token, "node" with the agent token
            # (the server token's password while no agent-token is set). An agent always
            # authenticates as "node" (pkg/agent/run.go: clientaccess.WithUser("node")), a
            # joining server as "server" (pkg/cluster/bootstrap.go: WithUser("server")), and
            # the password file checks the password of that user only
            # (pkg/authenticator/passwordfile/passwordfile.go). So once agent-token is set,
            # an agent holding only the server token is refused too.
            if role == "agent":
                allowed = state["agent_password"] or state["password"]
            else:
                allowed = state["password"]
            if not password or not hmac.compare_digest(password, allowed):
                error("Failed to authenticate request from %s: invalid username/password combination" % peer)
                self.reply(401, {"error": "invalid username/password combination"})
                return False
            return True

        def do_GET(self):
            if self.api("GET"):
                return
            path = urllib.parse.urlparse(self.path).path
            if path == "/ping":
                self.reply(200, "pong", "text/plain")
            elif path == "/cacerts":
                self.reply(200, state["ca"], "text/plain")
            elif path == "/v1-standin/nodes":
                self.reply(200, {"nodes": state["cluster"].public()})
            elif path == "/v1-standin/info":
                self.reply(200, {"version": EMBEDDED["version"], "ca_hash": state["ca_hash"],
                                 "datastore": "etcd" if state["etcd"] else "sqlite", "node": state["name"]})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            if self.api("POST"):
                return
            path = urllib.parse.urlparse(self.path).path
            if path not in ("/v1-standin/join", "/v1-standin/heartbeat"):
                self.reply(404, {"error": "not found"})
                return
            try:
                body = json.loads(self.body or b"{}")
            except (ValueError, json.JSONDecodeError):
                self.reply(400, {"error": "bad join request"})
                return
            role = body.get("role")
            if not self.authorized(role):
                return
            if path == "/v1-standin/heartbeat":
                if state.get("api") is not None and body.get("name"):
                    state["api"].sim.heartbeat(body["name"], body.get("flannel"))
                self.reply(200, {"ok": True})
                return
            if role not in ("agent", "server") or not body.get("name"):
                self.reply(400, {"error": "join request needs name and role"})
                return
            if role == "server":
                if not state["etcd"]:
                    self.reply(409, {"error": "this server does not run embedded etcd (start the first server with "
                                              "cluster-init); other servers cannot join it"})
                    return
                theirs = body.get("critical", {})
                mine = state["critical"]
                diff = sorted(k for k in mine if theirs.get(k) != mine[k])
                if diff:
                    error("Critical configuration mismatched for joining server %s: %s" % (body["name"], ", ".join(diff)))
                    self.reply(400, {"error": "critical configuration value mismatch between servers: %s" % ", ".join(diff)})
                    return
            if role == "server" and removed_member(state["cluster"], body):
                self.reply(409, {"error": "the member has been permanently removed from the cluster"})
                return
            if role == "server" and duplicate_member(state["cluster"], body):
                # k3s-io/k3s pkg/etcd/etcd.go, join: a member whose name (node name plus a
                # random suffix, kept in db/etcd/name) is not ours but carries our node name.
                error("etcd cluster join failed for %s: duplicate node name found" % body["name"])
                self.reply(409, {"error": "etcd cluster join failed: duplicate node name found, please use a unique "
                                          "name for this node"})
                return
            if role == "agent" and state.get("api") is not None and \
                    not state["api"].sim.node_password(body["name"].lower(), body.get("password_sha256")):
                # k3s-io/k3s pkg/nodepassword/validate.go: ErrVerifyFailed -> 403, while the
                # <node>.node-password.k3s secret of another machine's password exists.
                error("Failed to validate node password for %s: unable to verify password for node %s: hash does not "
                      "match" % (body["name"], body["name"]))
                self.reply(403, {"error": "unable to verify password for node %s" % body["name"]})
                return
            node = {k: body.get(k) for k in ("name", "role", "address", "labels", "taints", "etcd", "roles",
                                              "external_ip", "node_ips", "external_ips", "version", "advertise",
                                              "password_sha256", "hardware", "registered_at", "member")}
            node = state["cluster"].record(node)
            if state.get("api") is not None:
                state["api"].sim.joined(node)
            info("Node %s joined as %s from %s" % (node["name"], role, node.get("address")))
            reply = {"node": {k: v for k, v in node.items() if k != "password_sha256"},
                     "client_ca": read_text(os.path.join(state["tls"], "client-ca.crt")),
                     "flannel": state["flannel"],  # what real agents read from /v1-k3s/config
                     "apiservers": apiservers(state["cluster"])}  # and from /v1-k3s/apiservers
            if role == "server":
                reply["nodes"] = state["cluster"].load().get("nodes", {})
                # k3s-io/k3s pkg/cluster/bootstrap.go: a joining server takes the cluster's CA
                # certificates and keys from the bootstrap data its server token unlocks.
                reply["bootstrap"] = pki().bundle(state["tls"])
            self.reply(200, reply)

    return SupervisorHandler


# =============================================================================
# Joining (agents, and servers with `server:`). The stand-in protocol runs over
# HTTPS on the host:port of the https:// URL: /cacerts unverified, everything else
# verified with the cluster CA once it is known (k3s-io/k3s pkg/clientaccess/token.go).
# =============================================================================

SUPERVISOR_CA = []  # the cluster CA (PEM), once known: later calls verify the server with it


def trust_supervisor(ca_pem):
    SUPERVISOR_CA[:] = [ca_pem]

class NotReady(Exception):
    pass


def _dial_error(exc, hostport):
    """Go's net/http wording for a failed connection, so logs read like real k3s."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, socket.gaierror):
        return "dial tcp: lookup %s: no such host" % hostport.rsplit(":", 1)[0]
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "dial tcp %s: i/o timeout" % hostport
    text = {errno.ECONNREFUSED: "connection refused", errno.EHOSTUNREACH: "no route to host",
            errno.ENETUNREACH: "network is unreachable", errno.ECONNRESET: "connection reset by peer"}
    if isinstance(reason, OSError) and reason.errno in text:
        return "dial tcp %s: connect: %s" % (hostport, text[reason.errno])
    return str(reason)


def http_call(base, path, shown, data=None, headers=None, timeout=5):
    """GET (or POST data) https://<host:port of base>+path; `shown` is the https URL the
    user configured. Only /cacerts goes without verifying the server."""
    if path != "/cacerts" and not SUPERVISOR_CA:
        raise NotReady("%s%s: the cluster CA is not known yet" % (shown, path))
    context = pki().client_context(SUPERVISOR_CA[0] if path != "/cacerts" else None)
    request = urllib.request.Request("https://" + base.split("://", 1)[-1] + path, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise NotReady('Get "%s%s": tls: failed to verify certificate: %s' % (shown, path, exc.reason.verify_message))
        raise NotReady('Get "%s%s": %s' % (shown, path, _dial_error(exc, urllib.parse.urlparse(base).netloc)))
    except OSError as exc:
        raise NotReady('Get "%s%s": %s' % (shown, path, _dial_error(exc, urllib.parse.urlparse(base).netloc)))


def join_cluster(server_url, token, body):
    """Check the CA hash, then join; returns the server's JSON reply. Retries an
    unreachable server for K3S_STANDIN_JOIN_TIMEOUT seconds (real k3s: forever)."""
    parsed = urllib.parse.urlparse(server_url)
    if parsed.scheme != "https" or not parsed.hostname:
        fatal("server url must begin with https:// (got %s)" % server_url)
    hostpart = "[%s]" % parsed.hostname if ":" in parsed.hostname else parsed.hostname
    base = "https://%s:%d" % (hostpart, parsed.port or 443)
    shown = server_url.rstrip("/")
    want_hash, _ = parse_token(token)
    deadline = time.monotonic() + float(os.environ.get("K3S_STANDIN_JOIN_TIMEOUT", "20"))
    while True:
        try:
            status, ca = http_call(base, "/cacerts", shown)
            if status != 200:
                raise NotReady("%s/cacerts: %d" % (shown, status))
            if want_hash and ca_hash(ca) != want_hash:
                # k3s-io/k3s pkg/clientaccess/token.go (commit 0566d457), validateCAHash: the
                # token's hash first, then the server's; nothing is sent to that server. A
                # joining server returns the error and exits (pkg/cluster/bootstrap.go); an
                # agent logs it and asks again every 2 s (pkg/agent/run.go,
                # createProxyAndValidateToken, commit 9977f0e6), here until the join timeout.
                mismatch = "token CA hash does not match the Cluster CA certificate hash: %s != %s" % (
                    want_hash, ca_hash(ca))
                if body.get("role") != "agent":
                    fatal("starting kubernetes: preparing server: failed to validate token: %s" % mismatch)
                error(mismatch)
                if time.monotonic() > deadline:
                    fatal("%s (the k3s stand-in gives up after K3S_STANDIN_JOIN_TIMEOUT seconds; real k3s keeps "
                          "retrying)" % mismatch)
                time.sleep(2)
                continue
            trust_supervisor(ca)
            status, reply = http_call(base, "/v1-standin/join", shown, json.dumps(body).encode(),
                                      {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
            if status == 200:
                result = json.loads(reply)
                result["ca"] = ca
                return result
            try:
                message = json.loads(reply).get("error", "")
            except (ValueError, AttributeError):
                message = reply.decode(errors="replace")[:200]
            if status == 401:
                fatal("Failed to validate connection to cluster at %s: %s/v1-standin/join: 401 Unauthorized (%s)"
                      % (shown, shown, message))
            if status == 403:
                # k3s-io/k3s pkg/agent/config/config.go, getNodeNamedCrt: a 403 on the kubelet
                # certificate is this error, and config.Get retries it every 5 s, for ever.
                raise NotReady("Node password rejected, duplicate hostname or contents of '/etc/rancher/node/password' "
                               "may not match server node-passwd entry, try enabling a unique node name with the "
                               "--with-node-id flag")
            if 400 <= status < 500:
                fatal("Failed to join the cluster at %s: %s" % (shown, message))
            raise NotReady("%s/v1-standin/join: %d %s" % (shown, status, message))
        except NotReady as exc:
            if time.monotonic() > deadline:
                fatal("Failed to retrieve agent configuration from %s: %s (the k3s stand-in gives up after "
                      "K3S_STANDIN_JOIN_TIMEOUT seconds; real k3s keeps retrying)" % (shown, exc))
            info("Waiting to retrieve agent configuration; server is not ready: %s" % exc)
            time.sleep(1)


def rejoin_once(server_url, token, body):
    """One try at telling the server this member runs again: "ok", "removed", or None
    (no answer: the background retries go on)."""
    parsed = urllib.parse.urlparse(server_url)
    hostpart = "[%s]" % parsed.hostname if ":" in (parsed.hostname or "") else parsed.hostname
    try:
        status, reply = http_call("https://%s:%d" % (hostpart, parsed.port or 443), "/v1-standin/join",
                                  server_url.rstrip("/"), json.dumps(body).encode(),
                                  {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    except NotReady:
        return None
    if status == 200:
        return "ok"
    return "removed" if status == 409 and b"permanently removed" in reply else None


def rejoin_quietly(server_url, token, body):
    for _ in range(30):
        if rejoin_once(server_url, token, body) is not None:
            return
        time.sleep(1)


def start_heartbeats(server_url, token, name, role, lease=None):
    """Tell the server every K3S_STANDIN_HEARTBEAT seconds (3) that this node's k3s runs; its
    API simulator marks a node without heartbeats NotReady (Unknown), as the node controller
    does for a kubelet that stopped posting status. `lease`: the flannel lease this node's
    flannel holds (start_flannel), which the simulator records on the Node."""
    parsed = urllib.parse.urlparse(server_url)
    hostpart = "[%s]" % parsed.hostname if ":" in (parsed.hostname or "") else parsed.hostname
    base = "https://%s:%d" % (hostpart, parsed.port or 443)
    interval = float(os.environ.get("K3S_STANDIN_HEARTBEAT", "3"))
    body = json.dumps({"name": name, "role": role, "flannel": lease}).encode()
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}

    def loop():
        while True:
            try:
                http_call(base, "/v1-standin/heartbeat", server_url, body, headers, timeout=5)
            except NotReady as exc:
                log("debug", "heartbeat: %s" % exc)
            time.sleep(interval)

    threading.Thread(target=loop, name="heartbeat", daemon=True).start()


class ClusterView:
    """What the API simulator reads of the join records (and the one thing it changes)."""

    def __init__(self, cluster):
        self.cluster = cluster

    def records(self):
        with self.cluster.lock:
            return self.cluster.load().get("nodes", {})

    def etcd_removed(self, name):
        """The etcd member controller removing the node's member, with the line real k3s
        logs first (k3s-io/k3s pkg/etcd/etcd.go, RemovePeer): the moment it left."""
        with self.cluster.lock:
            state = self.cluster.load()
            node = state.get("nodes", {}).get(name)
            if node and node.get("etcd"):
                member = node.get("member") or name
                info("Removing name=%s id=%d address=%s from etcd"
                     % (member, int(hashlib.sha256(member.encode()).hexdigest()[:15], 16), node.get("address")))
                node["etcd"] = False
                node["removed_from_etcd"] = True
                self.cluster.save(state)


# =============================================================================
# Kubeconfig and packaged manifests (server).
# =============================================================================

def write_kubeconfig(opts, port, tls_dir):
    path = opts.get("write-kubeconfig") or host(DEFAULT_KUBECONFIG)
    mode_text = opts.get("write-kubeconfig-mode")
    mode = 0o600
    if mode_text not in (None, ""):
        try:
            mode = int(str(mode_text), 8)
        except ValueError:
            fatal("failed to parse write-kubeconfig-mode %r: not an octal file mode" % mode_text)
    # k3s-io/k3s pkg/server/server.go writeKubeConfig: the server CA and the system:admin
    # client certificate (pkg/daemons/control/deps/deps.go genClientCerts) embedded.
    chain, key = pki().ensure_admin(tls_dir)
    text = pki().kubeconfig(port, read_text(os.path.join(tls_dir, "server-ca.crt")).encode(), chain, key)
    write_file(path, text, mode)
    group = opts.get("write-kubeconfig-group")
    if group:
        try:
            shutil.chown(path, group=group)
        except (LookupError, OSError) as exc:
            warn("Could not set group %s on %s: %s" % (group, path, exc))
    info("Wrote kubeconfig %s" % path)


PACKAGED_MANIFESTS = {  # disable item -> files under server/manifests
    None: ["ccm.yaml", "rolebindings.yaml"],
    "coredns": ["coredns.yaml"], "local-storage": ["local-storage.yaml"], "runtimes": ["runtimes.yaml"],
    "traefik": ["traefik.yaml"], "metrics-server": ["metrics-server/metrics-server-deployment.yaml"],
}


def packaged_manifests(server_dir, disabled):
    manifests = os.path.join(server_dir, "manifests")
    mkdirs(manifests)
    for component, files in PACKAGED_MANIFESTS.items():
        for name in files:
            path = os.path.join(manifests, name)
            if component in disabled:
                if os.path.exists(path):
                    os.unlink(path)
            else:
                write_file(path, "# k3s stand-in: placeholder for the packaged %s manifest\n" % (component or name), 0o600)
    for name in sorted(os.listdir(manifests)):
        if not any(name == f.split("/")[0] for fs in PACKAGED_MANIFESTS.values() for f in fs):
            info("Found additional manifest %s (the stand-in does not apply manifests)" % name)


# =============================================================================
# k3s server
# =============================================================================

def ensure_ca(server_dir, given=None):
    """The server CA certificate (PEM bytes): the cluster's CAs from `given` (the bootstrap
    files of a join or a snapshot), else those already here, else new ones."""
    tls = os.path.join(server_dir, "tls")
    mkdirs(tls, 0o700)
    try:
        if given:
            pki().install(tls, given)
        ca = pki().ensure_cas(tls)
    except pki().PkiError as exc:
        fatal("starting kubernetes: preparing server: failed to generate certificates: %s" % exc)
    trust_supervisor(ca)
    return ca


def advertise_address(opts, address):
    """k3s-io/k3s pkg/cli/server/server.go (commit 005499a): advertise-address, else the first
    node-external-ip, else the first node-ip (util.GetFirstValidIPString); it is added to the
    SANs, and etcd's PrivateIP stays the node-ip."""
    for value in [opts.get("advertise-address")] + list(opts.get("node-external-ip") or []) + \
            list(opts.get("node-ip") or []) + [address]:
        if value:
            return value
    return None


def serving_tls(opts, tls_dir, name, address):
    """The supervisor port's certificate (k3s's SANs: the node IPs and the advertise address,
    which is node-external-ip unless advertise-address is set) and the TLS context that serves it."""
    sans = pki().san_list(opts.get("tls-san") or [], name, (opts.get("node-ip") or []) + [address],
                          (), advertise_address(opts, address))
    try:
        chain, key = pki().issue_serving(tls_dir, sans)
        return pki().server_context(tls_dir, chain, key, h2serve().ALPN)
    except (pki().PkiError, ssl.SSLError) as exc:
        fatal("starting kubernetes: preparing server: failed to create the serving certificate: %s" % exc)


def write_tokens(server_dir, ca_digest, password, agent_password):
    token = "K10%s::server:%s\n" % (ca_digest, password)
    write_file(os.path.join(server_dir, "token"), token, 0o600)
    write_file(os.path.join(server_dir, "node-token"), token, 0o600)
    agent = "K10%s::node:%s\n" % (ca_digest, agent_password) if agent_password else token
    write_file(os.path.join(server_dir, "agent-token"), agent, 0o600)


def passwd_text(server_password, node_password):
    """The supervisor's users file (k3s's server/cred/passwd: password,user,uid,group)."""
    return "%s,node,node,k3s:agent\n%s,server,server,k3s:server\n" % (node_password, server_password)


def reconcile_bootstrap_passwd(server_dir, db, server_password, node_password):
    """k3s keeps its bootstrap files (CAs, keys, server/cred/passwd) in the datastore too, and
    the datastore wins. At start it compares them with disk first: a file that differs and is
    newer on disk is fatal (k3s-io/k3s pkg/cluster/bootstrap.go, ReconcileBootstrapData:
    "... newer than datastore and could cause a cluster outage. Remove the file(s) from disk
    and restart to be recreated from datastore."), one missing on disk is written from the
    datastore. Then genUsers writes passwd with the users' passwords from this start's config,
    "node" being the agent token, else the server token (pkg/daemons/control/deps/deps.go,
    genUsers/getNodePass, commit 09ac65a6); and the save after start keeps what the datastore
    already has (pkg/cluster/storage.go, Save without override: "bootstrap key already
    exists"). So an agent-token added to (or changed on) a running cluster's server is
    accepted once, and the server's next start is fatal (rancher/rke2#5785, k3s-io/k3s#4910).
    Modelled on the server that owns its datastore (no `server:`); the datastore's copy lives
    in the etcd data dir, so a restore or a deleted db starts afresh."""
    disk = os.path.join(server_dir, "cred", "passwd")
    stored = os.path.join(db, "etcd", "standin-bootstrap-passwd")
    on_disk, in_store = read_text(disk), read_text(stored)
    if in_store is not None:
        if on_disk is None:
            warn("Updating bootstrap data on disk from datastore")
            write_file(disk, in_store, 0o600)
        elif on_disk != in_store:
            fatal("%s newer than datastore and could cause a cluster outage. Remove the file(s) from disk and restart "
                  "to be recreated from datastore." % disk)
    wanted = passwd_text(server_password, node_password)
    if read_text(disk) != wanted:
        mkdirs(os.path.dirname(disk), 0o700)
        write_file(disk, wanted, 0o600)
    if in_store is None:
        write_file(stored, wanted, 0o600)
    elif in_store != wanted:
        warn("bootstrap key already exists")


def stored_password(server_dir):
    text = read_text(os.path.join(server_dir, "token"))
    return parse_token(text)[1] if text and text.strip() else None


def cmd_server(argv):
    opts = load_options("server", argv)
    setup_logging(opts)
    set_process_name("k3s-server")
    info("Starting k3s %s (%s)" % (EMBEDDED["version"], EMBEDDED["commit"]))
    data_dir = opts.get("data-dir") or host(DEFAULT_DATA_DIR)
    server_dir = os.path.join(data_dir, "server")
    mkdirs(server_dir, 0o700)
    if opts.get("cluster-reset"):
        return cluster_reset(opts, data_dir)
    flannel = flannel_config(opts)
    check_external_ips(opts)
    if not opts.get("disable-agent"):
        # Real k3s refuses a backend in its agent part (flannel.Prepare), after its control
        # plane started; the stand-in refuses it first. Either way the node never comes up.
        check_flannel_backend(flannel["backend"])
    check_version_history(data_dir)
    tls_dir = os.path.join(server_dir, "tls")
    if os.path.exists(os.path.join(tls_dir, "server-ca.crt")):  # a restart: the cluster CA is known
        trust_supervisor(read_text(os.path.join(tls_dir, "server-ca.crt")).encode())

    cluster = Cluster(data_dir)
    db = os.path.join(server_dir, "db")
    etcd_member = os.path.join(db, "etcd", "member")
    initialized = os.path.exists(cluster.path)
    etcd = os.path.isdir(etcd_member)
    reset_flag = os.path.join(db, "reset-flag")
    if os.path.exists(reset_flag):
        os.unlink(reset_flag)
        info("Managed etcd cluster membership was reset; starting as the only member")
    existing_etcd = etcd
    if etcd and (opts.get("server") or opts.get("cluster-init")):
        info("Managed etcd cluster bootstrap already complete and initialized")

    token = token_from(opts, "token")
    token_hash, password = parse_token(token) if token else (None, "")
    agent_token = token_from(opts, "agent-token")
    agent_password = parse_token(agent_token)[1] if agent_token else ""
    name = node_name(opts)
    if not opts.get("disable-agent"):
        ensure_node_password()
    joined = None
    member = etcd_member_name(db, name) if (opts.get("server") or opts.get("cluster-init") or etcd) else None
    # A server with `server:` and no etcd data joins (again, after its db was deleted, as
    # k3s's restore procedure asks of the other servers): k3s decides by its etcd data dir
    # (k3s-io/k3s pkg/etcd/etcd.go, IsInitialized).
    if opts.get("server") and not existing_etcd:
        # A server joining a cluster: validate and join like an agent, take the CA.
        if not password:
            fatal("starting kubernetes: preparing server: token is required to join a cluster")
        address = node_address(opts, urllib.parse.urlparse(opts["server"]).hostname)
        body = node_record(opts, "server", name, address, True)
        body["critical"] = critical_config(opts)
        body["member"] = member
        joined = join_cluster(opts["server"], token, body)
        ca = ensure_ca(server_dir, joined.get("bootstrap"))
        etcd = True
    elif opts.get("server") and password:
        # A joined server starting again (a restart, an upgrade): like a kubelet updating
        # its Node, it tells the cluster what runs here now (its version). Best effort, in
        # the background: its datastore is local, and the server it names may be down.
        address = node_address(opts, urllib.parse.urlparse(opts["server"]).hostname)
        body = node_record(opts, "server", name, address, True)
        body["critical"] = critical_config(opts)
        body["member"], body["existing_etcd"] = member, True
        told = rejoin_once(opts["server"], token, body)
        if told == "removed":
            # etcd's ErrMemberRemoved: the cluster removed this member (a cluster reset or
            # restore elsewhere, or the removal annotation); with its old data it never
            # rejoins (k3s-io/docs docs/cli/etcd-snapshot.md: delete server/db first).
            fatal("starting kubernetes: preparing server: start managed database: the member has been permanently "
                  "removed from the cluster (delete %s and start again to rejoin)" % db)
        if told is None:
            threading.Thread(target=rejoin_quietly, args=(opts["server"], token, body), daemon=True).start()
        ca = ensure_ca(server_dir)
    else:
        address = node_address(opts)
        ca = ensure_ca(server_dir)
    digest = ca_hash(ca)
    if token_hash and token_hash != digest:
        fatal("starting kubernetes: preparing server: token CA hash does not match the Cluster CA certificate hash: "
              "%s != %s" % (digest, token_hash))
    old_password = stored_password(server_dir)
    if password and old_password and not hmac.compare_digest(password, old_password):
        fatal("starting kubernetes: preparing server: bootstrap data already found and encrypted with different token")
    if not password:
        password = old_password or secrets.token_hex(16)
    write_tokens(server_dir, digest, password, agent_password)

    # Datastore: etcd with cluster-init (or when joining / already on disk), else sqlite.
    if opts.get("cluster-init") and not etcd:
        if os.path.exists(os.path.join(db, "state.db")):
            info("Migrating content from sqlite to etcd")
        etcd = True
    if etcd:
        mkdirs(os.path.join(etcd_member, "snap"), 0o700)
        mkdirs(os.path.join(etcd_member, "wal"), 0o700)
        write_file(os.path.join(db, "etcd", "config"), "name: %s-%s\n" % (name, digest[:8]), 0o600)
        if not existing_etcd:
            info("Managed etcd cluster %s" % ("membership added (joined %s)" % opts["server"] if joined else "initializing"))
    else:
        write_file(os.path.join(db, "state.db"), b"SQLite format 3\x00k3s-standin", 0o600)
        info("Database: sqlite (%s)" % os.path.join(db, "state.db"))
    if etcd and not opts.get("server"):
        reconcile_bootstrap_passwd(server_dir, db, password, agent_password or password)
    if joined:
        cluster.save({"nodes": joined.get("nodes", {})})
    elif not initialized:
        cluster.save({"nodes": {}})

    disabled = set(opts.get("disable", []))
    packaged_manifests(server_dir, disabled)
    port = opts.get("https-listen-port") or 6443
    write_kubeconfig(opts, port, tls_dir)
    registries = opts.get("private-registry") or host("/etc/rancher/k3s/registries.yaml")
    if os.path.exists(registries):  # real k3s reads it; the stand-in only notes it
        info("Using private registry config file at %s" % registries)

    run_agent_part = not opts.get("disable-agent")
    pod_cidr = "10.42.0.0/24"
    if run_agent_part:
        record = node_record(opts, "server", name, address, etcd)
        if etcd and member:
            record["member"] = member
        mine = cluster.record(record)
        pod_cidr = mine["pod_cidr"]
    api = kubeapi().KubeAPI(server_dir, EMBEDDED["version"], name if run_agent_part else None,
                            cluster=ClusterView(cluster),
                            options={"disable": sorted(disabled), "ca": ca.decode(), "ca_hash": digest,
                                     "flannel": flannel}).start()
    if run_agent_part:
        # The server's own node: its password is verified locally, the secret only later.
        api.sim.deferred_node_password(name, mine.get("password_sha256"))
    state = {"ca": ca, "ca_hash": digest, "password": password, "agent_password": agent_password,
             "cluster": cluster, "etcd": etcd, "critical": critical_config(opts), "name": name, "api": api,
             "tls": tls_dir, "flannel": flannel}
    try:
        bind = opts.get("bind-address") or ""
        listen_http(bind, port, make_supervisor_handler(state), "Supervisor (k3s stand-in API)",
                    serving_tls(opts, tls_dir, name, address))
        lease = failure = None
        if run_agent_part:
            node_footprint(opts, data_dir, address, flannel)
            kport, explicit = kubelet_port(opts)
            if explicit or not SANDBOX:
                listen_http(bind, kport, KubeletHandler, "Kubelet")
            lease, failure = start_flannel(flannel, opts, name, address, pod_cidr.replace(".0/24", ".1/24"))
        for aux_bind, aux_port in aux_ports(opts, "server", address, etcd):
            listen_aux(aux_bind, aux_port)
        info("k3s is up and running")
        sd_notify("READY=1\nSTATUS=k3s stand-in server running")
        if failure:
            error(failure)
            return 1
        if run_agent_part:
            api.sim.heartbeat(name, lease)  # its own node: flannel's lease, straight to its API
        if opts.get("server"):  # a server that joined another one reports to it, as agents do
            start_heartbeats(opts["server"], token, name, "server", lease)
        return wait_for_signal()
    finally:
        api.stop()


# =============================================================================
# k3s agent
# =============================================================================

def cmd_agent(argv):
    opts = load_options("agent", argv)
    setup_logging(opts)
    set_process_name("k3s-agent")
    info("Starting k3s agent %s (%s)" % (EMBEDDED["version"], EMBEDDED["commit"]))
    server_url = opts.get("server")
    if not server_url:
        fatal("--server is required")
    token = token_from(opts, "token")
    if not token:
        fatal("--token is required")
    parse_token(token)  # format check
    data_dir = opts.get("data-dir") or host(DEFAULT_DATA_DIR)
    name = node_name(opts)
    address = node_address(opts, urllib.parse.urlparse(server_url).hostname)
    check_external_ips(opts)
    mkdirs(os.path.join(data_dir, "agent"))
    ensure_node_password()
    joined = join_cluster(server_url, token, node_record(opts, "agent", name, address, False))
    agent = os.path.join(data_dir, "agent")
    write_file(os.path.join(agent, "server-ca.crt"), joined["ca"], 0o644)
    write_file(os.path.join(agent, "client-ca.crt"), joined.get("client_ca") or "", 0o644)
    lb = opts.get("lb-server-port") or 6444
    write_file(os.path.join(agent, "kubelet.kubeconfig"),
               "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://127.0.0.1:%d\n"
               "    certificate-authority: %s/server-ca.crt\n  name: local\n" % (lb, agent), 0o600)
    write_file(os.path.join(agent, "etc", "k3s-agent-load-balancer.json"),
               json.dumps({"ServerURL": server_url,
                           "ServerAddresses": joined.get("apiservers") or [urllib.parse.urlparse(server_url).netloc]},
                          indent=2) + "\n", 0o600)
    pod_cidr = joined.get("node", {}).get("pod_cidr", "10.42.1.0/24")
    info("Joined the cluster at %s as %s" % (server_url, name))
    flannel = joined.get("flannel") or flannel_config({})  # the server's flannel settings
    node_footprint(opts, data_dir, address, flannel)
    kport, explicit = kubelet_port(opts)
    bind = opts.get("bind-address") or ""
    if explicit or not SANDBOX:
        listen_http(bind, kport, KubeletHandler, "Kubelet")
    for aux_bind, aux_port in aux_ports(opts, "agent", address, False):
        listen_aux(aux_bind, aux_port)
    lease, failure = start_flannel(flannel, opts, name, address, pod_cidr.replace(".0/24", ".1/24"))
    info("k3s agent is up and running")
    sd_notify("READY=1\nSTATUS=k3s stand-in agent running")
    if failure:
        error(failure)
        return 1
    start_heartbeats(server_url, token, name, "agent", lease)
    return wait_for_signal()


def setup_logging(opts):
    global DEBUG
    DEBUG = bool(opts.get("debug"))


def wait_for_signal():
    done = threading.Event()
    got = []

    def handler(signum, frame):
        got.append(signum)
        done.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not done.wait(3600):
        pass
    sd_notify("STOPPING=1")
    info("Received %s; shutting down" % signal.Signals(got[0]).name)
    return 0


# =============================================================================
# etcd snapshots and cluster reset (server data dir, etcd mode). A snapshot is
# JSON: the recorded nodes, the API's objects (kubeapi.py's state file, as etcd
# holds them for real k3s), the CA (so a restore onto a new host keeps the token
# hash) and a hash that recognises the token (k3s encrypts bootstrap data with
# it, so a restore needs the same token).
# =============================================================================

SNAPSHOT_FLAGS = {"name", "dir", "etcd-snapshot-dir", "data-dir", "node-name", "snapshot-compress",
                  "etcd-snapshot-compress", "snapshot-retention", "etcd-snapshot-retention", "config", "debug",
                  "help", "etcd-s3"}


def snapshot_options(argv):
    """Like real `k3s etcd-snapshot`: config-file keys that are not snapshot flags are
    skipped; CLI flags must be known."""
    path, explicit = find_config_file(argv)
    kept = []
    for arg, source in config_args(path, explicit):
        name = arg.lstrip("-").split("=", 1)[0]
        if ALIASES.get(name, name) in SNAPSHOT_FLAGS:
            kept.append((arg, source))
    try:
        opts, positional = parse_flags(kept + [(a, "cli") for a in argv], SNAPSHOT_FLAGS)
    except FlagError as exc:
        fatal(str(exc))
    if opts.get("etcd-s3"):
        fatal("S3 snapshots are not supported by the k3s stand-in")
    return opts, positional


def snapshot_dir(opts, data_dir):
    return opts.get("dir") or opts.get("etcd-snapshot-dir") or os.path.join(data_dir, "server", "db", "snapshots")


def cmd_etcd_snapshot(argv):
    action = "save"
    if argv and not argv[0].startswith("-"):
        action, argv = argv[0], argv[1:]
    opts, positional = snapshot_options(argv)
    setup_logging(opts)
    data_dir = opts.get("data-dir") or host(DEFAULT_DATA_DIR)
    server_dir = os.path.join(data_dir, "server")
    directory = snapshot_dir(opts, data_dir)
    if not os.path.isdir(os.path.join(server_dir, "db", "etcd", "member")):
        fatal("etcd database not found in %s" % server_dir)
    if action == "save":
        name = "%s-%s-%d" % (opts.get("name") or "on-demand", node_name(opts), int(time.time()))
        cluster = Cluster(data_dir)
        ca = read_text(os.path.join(server_dir, "tls", "server-ca.crt"), "")
        snapshot = {"kind": "k3s-standin-etcd-snapshot", "version": EMBEDDED["version"], "ca": ca,
                    "ca_hash": ca_hash(ca.encode()), "token_check": token_check(stored_password(server_dir) or ""),
                    "nodes": cluster.load().get("nodes", {}), "created": int(time.time()),
                    "api": kubeapi().read_state(server_dir), "tls": pki().bundle(os.path.join(server_dir, "tls"))}
        mkdirs(directory, 0o700)
        write_file(os.path.join(directory, name), json.dumps(snapshot, indent=2) + "\n", 0o600)
        info("Snapshot %s saved." % name)
        return 0
    if action in ("ls", "list"):
        print("%-60s %-90s %-8s %s" % ("Name", "Location", "Size", "Created"))
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            path = os.path.join(directory, name)
            created = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
            print("%-60s %-90s %-8d %s" % (name, "file://" + path, os.path.getsize(path),
                                           created.strftime("%Y-%m-%dT%H:%M:%SZ")))
        return 0
    if action == "delete":
        for name in positional:
            path = os.path.join(directory, os.path.basename(name))
            if os.path.exists(path):
                os.unlink(path)
                info("Snapshot %s deleted." % name)
            else:
                warn("Snapshot %s not found" % name)
        return 0
    if action == "prune":
        keep = opts.get("snapshot-retention") or opts.get("etcd-snapshot-retention") or 5
        prefix = (opts.get("name") or "on-demand") + "-"
        names = sorted((n for n in os.listdir(directory) if n.startswith(prefix)),
                       key=lambda n: os.path.getmtime(os.path.join(directory, n))) if os.path.isdir(directory) else []
        for name in names[:max(0, len(names) - keep)]:
            os.unlink(os.path.join(directory, name))
            info("Removing local snapshot %s" % os.path.join(directory, name))
        return 0
    fatal("unknown etcd-snapshot subcommand %r (save, ls, delete, prune)" % action)


def cluster_reset(opts, data_dir):
    server_dir = os.path.join(data_dir, "server")
    db = os.path.join(server_dir, "db")
    cluster = Cluster(data_dir)
    token = token_from(opts, "token")
    token_hash, password = parse_token(token) if token else (None, "")
    restore = opts.get("cluster-reset-restore-path")
    if restore and opts.get("etcd-s3"):
        # k3s-io/k3s pkg/etcd/etcd.go, Reset: with etcd-s3 set the restore path is an object
        # in the bucket, downloaded first ("Retrieving etcd snapshot %s from S3"); a local
        # path is not found there. k3s-io/docs docs/cli/etcd-snapshot.md: "To restore from a
        # local snapshot file, where an etcd-s3 backup configuration is present, add the
        # argument --etcd-s3=false". The stand-in has no S3 at all: it always refuses.
        info("Retrieving etcd snapshot %s from S3" % restore)
        fatal("starting kubernetes: preparing server: failed to download snapshot from S3: %s is not an object in "
              "the bucket (the k3s stand-in has no S3; with etcd-s3 set the restore path names an S3 object, "
              "--etcd-s3=false restores a local file)" % restore)
    if restore:
        text = read_text(restore)
        if text is None:
            fatal("starting kubernetes: preparing server: failed to restore etcd: snapshot %s not found" % restore)
        try:
            snapshot = json.loads(text)
        except json.JSONDecodeError:
            fatal("starting kubernetes: preparing server: failed to restore etcd: %s is not a snapshot" % restore)
        password = password or stored_password(server_dir) or ""
        if not password:
            fatal("starting kubernetes: preparing server: --token is required to restore a snapshot on a new host")
        if token_check(password) != snapshot.get("token_check") or (token_hash and token_hash != snapshot.get("ca_hash")):
            fatal("starting kubernetes: preparing server: failed to restore etcd: bootstrap data already found and "
                  "encrypted with different token (the token does not match the snapshot)")
        if os.path.isdir(os.path.join(db, "etcd")):
            os.rename(os.path.join(db, "etcd"), os.path.join(db, "etcd-old-%d" % int(time.time())))
        ca = ensure_ca(server_dir, snapshot.get("tls"))
        write_tokens(server_dir, ca_hash(ca), password, parse_token(token_from(opts, "agent-token"))[1])
        # "Etcd is started, and all etcd cluster members except the current node are removed
        # from the cluster" (k3s-io/docs docs/cli/etcd-snapshot.md, Restoring Snapshots).
        nodes = snapshot.get("nodes", {})
        for other, node in nodes.items():
            if node.get("etcd") and other != node_name(opts):
                node["etcd"] = False
                node["removed_from_etcd"] = True
        cluster.save({"nodes": nodes})
        if snapshot.get("api"):  # the Kubernetes objects, as etcd holds them
            kubeapi().write_state(server_dir, snapshot["api"])
        elif os.path.exists(os.path.join(server_dir, kubeapi().STATE_FILE)):
            os.unlink(os.path.join(server_dir, kubeapi().STATE_FILE))
        info("Restored the cluster state from %s" % restore)
    else:
        if not os.path.isdir(os.path.join(db, "etcd", "member")):
            fatal("starting kubernetes: preparing server: etcd database not found in %s" % server_dir)
        name = node_name(opts)
        state = cluster.load()
        for other, node in list(state.get("nodes", {}).items()):
            if node.get("etcd") and other != name:
                node["etcd"] = False
                node["removed_from_etcd"] = True
        cluster.save(state)
    mkdirs(os.path.join(db, "etcd", "member", "snap"), 0o700)
    mkdirs(os.path.join(db, "etcd", "member", "wal"), 0o700)
    write_file(os.path.join(db, "reset-flag"), "", 0o600)
    check_version_history(data_dir)
    info("Managed etcd cluster membership has been reset, restart without --cluster-reset flag now. "
         "Backup and delete ${datadir}/server/db on each peer etcd server and rejoin the nodes")
    return 0


# =============================================================================
# containerd-shim stand-in: the same file, started as
# data/<hash>/bin/containerd-shim-runc-v2. Like a real shim it is its pod's subreaper
# (containerd/containerd pkg/shim/shim_linux.go at da5680ad: reaper.SetSubreaper(1)), so
# the pod's processes are its descendants: the sandbox's pause process, and a workload with
# a worker of its own (a training job and its data loader, say) working in the pod's
# emptyDir. They are plain processes with their own command lines (standin-pod-*), so only
# a teardown that kills the shim's whole process tree ends them, as for real pods.
# =============================================================================

PR_SET_CHILD_SUBREAPER = 36


def pod_process(argv0, cwd, worker=None):
    """Fork a pod process that sleeps under `argv0`; `worker`: (argv0, cwd) of its child."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.chdir(cwd)
        if worker:
            pod_process(*worker)
        os.execv(shutil.which("sleep") or "/bin/sleep", [argv0, "infinity"])
    finally:
        os._exit(127)


def shim_main():
    set_process_name("containerd-shim")
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except Exception:
        pass
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    volume = os.environ.get("STANDIN_POD_VOLUME") or "/"
    pod_process("standin-pod-pause", "/")
    pod_process("standin-pod-workload", volume, ("standin-pod-worker", volume))
    while True:
        try:
            os.waitpid(-1, 0)  # reap what exits (orphans of the pod come to the subreaper)
        except ChildProcessError:
            time.sleep(3600)


# =============================================================================
# Command line
# =============================================================================

def print_version():
    print("%s version %s (%s)" % (PROGRAM, EMBEDDED["version"], EMBEDDED["commit"]))
    print("go version %s" % EMBEDDED["go"])


def print_help(command=None):
    if command in ("server", "agent"):
        print("NAME:\n   k3s %s - Run management %s\n\nUSAGE:\n   k3s %s [OPTIONS]\n\nOPTIONS:" % (
            command, command, command))
        for name in sorted(valid_flags(command) - {"help"}):
            print("   --%s%s" % (name, "" if name in BOOL_FLAGS else " value"))
        return
    print("NAME:\n   k3s - Kubernetes, but small and simple (k3s stand-in for tests)\n\nUSAGE:\n"
          "   k3s [global options] command [command options]\n\nVERSION:\n   %s (%s)\n\nCOMMANDS:\n"
          "   server         Run management server\n   agent          Run node agent\n"
          "   etcd-snapshot  Manage etcd snapshots (stand-in: save, ls, delete, prune)\n\n"
          "GLOBAL OPTIONS:\n   --version, -v  print the version" % (EMBEDDED["version"], EMBEDDED["commit"]))


def main(argv):
    prog = os.path.basename(argv[0])
    if prog.startswith("containerd-shim"):
        return shim_main()
    if EMBEDDED is None:
        sys.stderr.write("k3s_standin.py is the stand-in's source; build the binary with "
                         "tests/standins/airgap.py (build_airgap) first\n")
        return 2
    args = argv[1:]
    if prog in ("kubectl", "crictl", "ctr"):
        args = [prog] + args
    if not args:
        print_help()
        return 0
    command = args[0]
    try:
        if command in ("--version", "-v", "version"):
            print_version()
            return 0
        if command in ("--help", "-h", "help"):
            print_help(args[1] if len(args) > 1 else None)
            return 0
        if command in ("server", "agent") and ("--help" in args[1:] or "-h" in args[1:]):
            print_help(command)
            return 0
        if command == "server":
            return cmd_server(args[1:])
        if command == "agent":
            return cmd_agent(args[1:])
        if command == "etcd-snapshot":
            return cmd_etcd_snapshot(args[1:])
        if command == "crictl":
            return cmd_crictl(args[1:])
        if command == "ctr":
            return cmd_ctr(args[1:])
        if command in ("kubectl", "check-config", "token", "certificate", "secrets-encrypt",
                       "completion"):
            sys.stderr.write("k3s %s is not available in the k3s stand-in (tests reach a stand-in Kubernetes "
                             "API over HTTP instead)\n" % command)
            return 1
        sys.stderr.write("No help topic for '%s'\n" % command)
        return 3
    except Fatal as exc:
        log("fatal", str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
