"""Secrets out of text that leaves the operator's machine (a support bundle): pure.

Two nets, both always on:
- by value: every secret the tool knows (the join tokens and kubeconfig keys in the state
  folder, the registry, S3 and SSH credentials the inventory names), wherever it appears,
  in any form it is commonly written in (as is, escaped in a JSON, TOML or YAML string or a
  URL, base64 of it, the password part of a k3s `K10<hash>::server:<password>` token);
- by name: the value after a name that holds a secret (`token:`, `"password": ...`,
  `etcd-s3-secret-key=...`, `--agent-token x`, `PrivateKey = ...`, `apikey=...`,
  `{"auth":"..."}`, `Authorization: Bearer ...`), each line of a YAML block under such a name
  (`password: |`, `private_key: |-`), and anything shaped like a bearer token, a
  URL's `user:password@`, a k3s secure token or a PEM private key, whether the tool knows the
  value or not (a host's file may hold a secret the tool never saw).

A host writes what it likes into its journal and files, so every net is linear in the text
(see the patterns' comment) and a line longer than MAX_LINE_CHARS is cut (`_cut`).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from urllib.parse import quote

MARK = "<redacted>"
# Shorter values would turn ordinary words into holes; no secret the tool writes is this short.
MIN_KNOWN_LENGTH = 6
# A line longer than this (a journal line is at most 48 KiB: journald's LineMax) keeps its
# first MAX_LINE_CHARS characters back to the last separator, so no value is kept in part,
# and the rest becomes a count: the bundle stays readable and a host's one-line flood is cut.
MAX_LINE_CHARS = 64 * 1024
_SEPARATORS = " \t\r\"',;:=&@/<>"

# Every pattern below is linear in its text under Python's backtracking engine, and cheap per
# character (2 MiB of any shape in a fraction of a second): each starts with a literal or a
# character class (so the engine skips ahead in C) and can match only where a name or a marker
# starts; no two of its quantifiers can take the same characters (possessive `*+` where they
# could); where a name must hold a secret word, a lookahead reads the name once. (Before:
# `[\w.-]*(?:token|...)[\w.-]*` tried every split of a long word; a 16 KiB line of `-` took
# 8 s, a 2 MiB one hours.)
#
# The words that make a name a secret's, anywhere in it: the inventory's SECRET_WORDS, k3s's
# flag names (token, agent-token, etcd-s3-access-key, etcd-s3-secret-key,
# etcd-s3-session-token), containerd's and registries.yaml's (password, auth, identitytoken),
# kubeconfig's (client-key-data, client-certificate-data, token), WireGuard's (PrivateKey,
# PresharedKey), API keys (apikey, api_key, x-api-key). As one tree of first letters: at each
# character of a name the engine tries five letters, not twelve words.
_WORD_TREE = (r"t(?:oken)|p(?:ass(?:word|wd|phrase)|rivate[-_]?key|reshared[-_]?key)|s(?:ecret)|"
              r"c(?:redential|lient-(?:key|certificate)-data)|a(?:ccess[-_]?key|pi[-_]?key)")
# A whole name (not the tail of one) that holds a secret word, or one of the exact names of a
# credential: a registry's `auth`, an HTTP `Authorization` header. `dash`: a flag (--token x).
# Its first character is read first, the class the engine skips ahead by (a lookbehind first
# would make it try every position); the word is then looked for from that character on
# (a lookahead inside a one-character lookbehind).
_SECRET_NAME = (r"[\w.-](?<![\w.-].)(?:(?<=(?P<dash>-)))?+"
                r"(?:(?<=(?=[\w.-]*?(?:" + _WORD_TREE + r"))[\w.-])[\w.-]*+"
                r"|(?<=a)uth(?:orization)?(?![\w.-])|(?<=p)roxy-authorization(?![\w.-]))")
# An HTTP authorization scheme before the credentials it names (`Authorization: Bearer x`).
_SCHEME_WORD = r"(?:bearer|basic|digest|token)[ \t]+"
_SCHEME = "(?:" + _SCHEME_WORD + ")?"
# A YAML block scalar's indicator: `|` or `>`, then an indentation (1-9) and a chomping
# indicator (+ or -) in either order, each optional (YAML 1.2, 8.1.1: `|2-`, `>+1`).
# Before it, a tag or an anchor or both (`!!binary |`); a tag read only to a `:`, `=` or `,`,
# so no name that _INLINE tries after it (`!token:!token: |`) reads the same run again.
_BLOCK_START = r"(?:[!&][^\s:=,]*+[ \t]++){0,2}+[|>](?:[1-9][-+]?|[-+][1-9]?)?"
# `name: value`, `"name": value`, `name = value`, `name=value` wherever the name starts (YAML,
# JSON compact or not, TOML, env files, WireGuard's INI, a query string: apikey=x), and a
# flag's `--name value`; the value one word or one quoted string, never one that only opens a
# mapping or a block (its indicator ends the line: `password: | x` is a value), a null or a mark
# already put.
_INLINE = re.compile(
    r"(?P<head>" + _SECRET_NAME + r"(?:[\"']?[ \t]*+[:=][ \t]*+|(?(dash)[ \t]++|(?!)))" + _SCHEME + r")"
    r"(?P<value>\"(?:[^\"\\\n]|\\.)+\"?|'[^'\n]+'?|"
    r"(?!" + _BLOCK_START + r"(?:[ \t]++#|[ \t\r]*+(?:\n|\Z))|(?:\{\}?|\[\]?|null|~)(?![^\s\"',])|<redacted|<cut|"
    + _SCHEME_WORD + r"<redacted)"
    r"[^\s\"',]+)", re.IGNORECASE)
# At the start of a line (YAML's list dash allowed) a plain value is the whole rest of the line
# (a YAML plain scalar may hold spaces): `password: two words` redacted as `password: <redacted>`.
# It follows _INLINE, whose mark shows the name held a secret: so this name is read once, plainly.
_LINE_REST = re.compile(r"^(?P<head>[ \t]*+(?:-[ \t]+)?[\"']?[\w.-]++[\"']?[ \t]*+[:=][ \t]*+" + _SCHEME + r")"
                        r"(?P<value>[\"']?<redacted>[^\n]*)", re.IGNORECASE | re.MULTILINE)
# A YAML block scalar under a secret's name (`password: |`, `token: >-`, `private_key: |2`),
# whose value is the lines after it: the head alone on its line (after a list's dash; a quoted
# key, a tag or an anchor, a comment allowed), then its body, each line blank or indented past
# the key (YAML 1.2, 8.1.1.1): the head's own indentation, then one space more than the key's
# column (`- key`: a space for the dash, the blanks after it, one more). Under two dashes or
# more (`- - key: |`) the body is every line indented past the first dash: more than the value,
# never less. Back-references, not a pattern per column: the text is read once, in C; a head
# with no body is left as it is (no call into Python for it). A line without `|` or `>` is
# passed over before its name is read.
_BLOCK = re.compile(r"^(?=[^\n|>]*+[|>])"
                    r"(?P<head>(?P<indent>[ \t]*+)(?:-(?P<after_dash>[ \t]++)(?P<dashes>(?:-[ \t]++)++)?)?[\"']?"
                    + _SECRET_NAME + r"[\"']?[ \t]*+:[ \t]++" + _BLOCK_START + r"[ \t\r]*+(?:#[^\n]*+)?)$"
                    r"(?P<body>(?:\n(?:[ \t\r]*+(?=\n|\Z)|(?P=indent)(?(after_dash)(?(dashes)| (?P=after_dash)))"
                    r" [^\n]*+))++)", re.IGNORECASE | re.MULTILINE)
# A body line's text: from its first character that is not blank to its end, a CR before the
# newline kept (the first match on a line takes the rest of it, so its indentation stays).
_BLOCK_TEXT = re.compile(r"[^ \t\n\r](?:[^\n\r]++|\r(?!\n|\Z))*+")
_ONLY_THE_MARK = ("<redacted>", '"<redacted>"', "'<redacted>'")
# A bearer token wherever it is (a curl line's header, a client's debug log). Letter by letter,
# not IGNORECASE: the engine skips ahead only by a class it need not fold.
_BEARER = re.compile(r"(?P<head>[Bb][Ee][Aa][Rr][Ee][Rr](?<![\w.-].{6})[ \t]+)(?P<value>[\w.~+/=-]{8,})")
# The password of a URL's user info, `scheme://user:password@host` (up to the authority's
# last `@`, as curl reads it).
_URL_PASSWORD = re.compile(r"(?P<head>://[^\s/@:\"'<>]*:)(?P<value>[^\s/?#\"'<>]+)(?=@)")
# k3s's secure token format, K10<sha256 of the CA>::<user>:<password> (k3s-io/k3s pkg/clientaccess/token.go).
_K3S_TOKEN = re.compile(r"K10[0-9a-fA-F]{64}::[^\s:\"']+:[^\s\"',]+")
_PEM_KEY = re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|\Z)", re.DOTALL)
_LONG_LINE = re.compile(r"^(?P<kept>[^\n]{%d})(?P<rest>[^\n]+)" % MAX_LINE_CHARS, re.MULTILINE)


@dataclass
class Redactor:
    """`known`: {value: what it is}; `apply(text)` returns the text with every net applied."""

    known: dict[str, str] = field(default_factory=dict)

    def add(self, value: str | None, what: str) -> None:
        if not value or len(value.strip()) < MIN_KNOWN_LENGTH:
            return
        value = value.strip()
        for form in variants(value):
            if len(form) >= MIN_KNOWN_LENGTH:
                self.known.setdefault(form, what)

    def apply(self, text: str) -> str:
        # Longest first: a token that contains another known value goes whole. Known values
        # go before lines are cut, so one that a cut would split is gone already.
        for value in sorted(self.known, key=len, reverse=True):
            if value in text:
                text = text.replace(value, f"<redacted:{self.known[value]}>")
        text = _LONG_LINE.sub(_cut, text)
        # Blocks before the nets of one line: `password: |2` keeps its indicator, and a PEM key
        # in a block keeps its lines' shape.
        text = _BLOCK.sub(_block_gone, text)
        text = _PEM_KEY.sub(f"{MARK} private key", text)
        text = _K3S_TOKEN.sub(MARK, text)
        text = _URL_PASSWORD.sub(_value_gone, text)
        # Bearer first: in Go's header map, `Authorization:[Bearer x]`, the next net's value is `[Bearer`.
        text = _BEARER.sub(_value_gone, text)
        text = _INLINE.sub(_value_gone, text)
        return _LINE_REST.sub(_rest_of_line, text)


def _block_gone(match: re.Match) -> str:
    """A secret's YAML block: its head kept, each line of its body the mark, its indentation kept."""
    return match["head"] + _BLOCK_TEXT.sub(MARK, match["body"])


def _cut(match: re.Match) -> str:
    """A long line: its start back to the last separator (the value it cuts is not kept in
    part: `token=abc` cut inside `abc` keeps `token=`), then how much was left out."""
    kept = match["kept"]
    end = max(map(kept.rfind, _SEPARATORS)) + 1
    return f"{kept[:end]}<cut: {len(kept) - end + len(match['rest'])} characters of a long line>"


def _rest_of_line(match: re.Match) -> str:
    """A line's value redacted whole, its trailing comma (JSON) and blanks kept."""
    value = match["value"]
    core = value.rstrip(" \t\r")
    if core.endswith(","):
        core = core[:-1].rstrip(" \t")
    if core in _ONLY_THE_MARK:
        return match.group(0)
    return match["head"] + MARK + value[len(core):]


def _value_gone(match: re.Match) -> str:
    """The head kept, the value redacted; a quoted value keeps its quotes (compact JSON stays JSON)."""
    value = match["value"]
    quote_char = value[0] if value[0] in "\"'" else ""
    closed = quote_char if len(value) > 1 and value.endswith(quote_char) else ""
    return match["head"] + quote_char + MARK + closed


def variants(value: str) -> list[str]:
    """The forms a secret is written in: as is, escaped in a quoted string (JSON, TOML, YAML,
    a URL), base64 (kubeconfig *-data, registry auth), each line of a multi-line value (a PEM
    body), the password part of a k3s token."""
    forms = [value, *escaped(value)]
    encoded = value.encode()
    forms.append(base64.b64encode(encoded).decode())
    forms += [line.strip() for line in value.splitlines() if len(line.strip()) >= 16]
    if "::" in value and ":" in value.split("::", 1)[1]:
        forms.append(value.rsplit(":", 1)[1])
    decoded = _base64_text(value)
    if decoded:
        forms.append(decoded)
        forms += [line.strip() for line in decoded.splitlines()
                  if len(line.strip()) >= 16 and not line.startswith("-----")]
    return forms


def escaped(value: str) -> list[str]:
    r"""`value` as writers put it inside a quoted string, each form that differs from it:
    JSON (Python's json, ASCII-only or not, `\/` for `/`, upper-case `\uXXXX`; Go's
    encoding/json, which also writes <, > and & as \u003c, \u003e, \u0026 (golang/go
    src/encoding/json/encode.go, appendString)), Go's %q (strconv.Quote), which is how k3s
    writes registry passwords into containerd's TOML (k3s-io/k3s
    pkg/agent/templates/templates_linux.go: `password = {{ printf "%q" ... }}`), YAML's
    single-quoted form ('' for '), and URL percent-encoding (user info, a query)."""
    ascii_json = json.dumps(value)[1:-1]
    unicode_json = json.dumps(value, ensure_ascii=False)[1:-1]
    go_json = unicode_json
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        go_json = go_json.replace(char, escape)
    forms = [ascii_json, unicode_json, go_json, ascii_json.replace("/", "\\/"),
             re.sub(r"\\u[0-9a-f]{4}", lambda m: m.group().upper().replace("\\U", "\\u"), ascii_json),
             go_quoted(value), value.replace("'", "''"), quote(value, safe="")]
    return list(dict.fromkeys(form for form in forms if form != value))


_GO_SHORT_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                     "\v": "\\v", "\\": "\\\\", '"': '\\"'}


def go_quoted(value: str) -> str:
    """The inside of Go's strconv.Quote(value): short escapes, \\xXX below 0x80, \\uXXXX and
    \\UXXXXXXXX for other characters that are not printable (lower-case hex), the rest as is."""
    out = []
    for char in value:
        code = ord(char)
        if char in _GO_SHORT_ESCAPES:
            out.append(_GO_SHORT_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def _base64_text(value: str) -> str | None:
    """`value` decoded when it is base64 of text (a kubeconfig's *-data field), else None."""
    if len(value) < 16 or not re.fullmatch(r"[A-Za-z0-9+/=\s]+", value):
        return None
    try:
        return base64.b64decode(value, validate=False).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None


def kubeconfig_secrets(config) -> list[tuple[str, str]]:
    """(value, what) of every credential in a parsed kubeconfig: users' keys, certificates,
    tokens and passwords (the CA is public, and kept)."""
    found = []
    users = config.get("users") if isinstance(config, dict) else None
    for entry in users if isinstance(users, list) else []:
        user = entry.get("user") if isinstance(entry, dict) else None
        for key, value in (user.items() if isinstance(user, dict) else ()):
            if isinstance(value, str) and key in ("client-key-data", "client-certificate-data", "token", "password"):
                found.append((value, f"kubeconfig {key}"))
    return found
