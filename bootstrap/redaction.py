"""Secrets out of text that leaves the operator's machine (a support bundle): pure.

Two nets, both always on:
- by value: every secret the tool knows (the join tokens and kubeconfig keys in the state
  folder, the registry, S3 and SSH credentials the inventory names), wherever it appears,
  in any form it is commonly written in (as is, base64 of it, the password part of a k3s
  `K10<hash>::server:<password>` token);
- by name: the value after a key that names a secret (`token:`, `"password": ...`,
  `etcd-s3-secret-key=...`, `client-key-data:`, `auth = ...`), and anything shaped like a k3s
  secure token or a PEM private key, whether the tool knows the value or not (a host's file
  may hold a secret the tool never saw).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

MARK = "<redacted>"
# Shorter values would turn ordinary words into holes; no secret the tool writes is this short.
MIN_KNOWN_LENGTH = 6

# A key that names a secret: the inventory's SECRET_WORDS, k3s's flag names (token,
# agent-token, etcd-s3-access-key, etcd-s3-secret-key, etcd-s3-session-token), containerd's
# and registries.yaml's (password, auth, identitytoken), kubeconfig's (client-key-data,
# client-certificate-data, token).
_SECRET_KEY = (r"[\w.-]*(?:token|password|passwd|passphrase|secret|access[-_]?key|credential|"
               r"client-key-data|client-certificate-data)[\w.-]*|auth")
# `key: value`, `"key": value`, `key = value`, `key=value` at the start of a line (YAML,
# pretty-printed JSON, TOML, env files), the list dash of YAML allowed.
_KEY_VALUE = re.compile(r"^(?P<head>[ \t]*(?:-[ \t]+)?[\"']?(?:" + _SECRET_KEY + r")[\"']?[ \t]*[:=][ \t]*)"
                        r"(?P<value>\S.*?)(?P<tail>[ \t]*,?[ \t]*)$", re.IGNORECASE | re.MULTILINE)
# A flag or variable on a command line or in a log line: --token=x, --token x, K3S_TOKEN=x.
_INLINE = re.compile(r"(?P<head>(?:--?(?:[\w-]*-)?(?:token|password|secret-key|access-key)[= ]|"
                     r"\b[A-Z0-9_]*(?:TOKEN|PASSWORD|SECRET|ACCESS_KEY)[A-Z0-9_]*=)[\"']?)(?P<value>[^\s\"',]+)")
# k3s's secure token format, K10<sha256 of the CA>::<user>:<password> (k3s-io/k3s pkg/clientaccess/token.go).
_K3S_TOKEN = re.compile(r"K10[0-9a-fA-F]{64}::[^\s:\"']+:[^\s\"',]+")
_PEM_KEY = re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(-----END \1PRIVATE KEY-----|\Z)", re.DOTALL)
# Values that only open a mapping or are plainly not a secret.
_NOT_A_VALUE = re.compile(r"[|>][-+]?|\{\}|\[\]|null|~|\"\"|''|<redacted[^>]*>|\{|\[", re.IGNORECASE)


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
        # Longest first: a token that contains another known value goes whole.
        for value in sorted(self.known, key=len, reverse=True):
            if value in text:
                text = text.replace(value, f"<redacted:{self.known[value]}>")
        text = _PEM_KEY.sub(f"{MARK} private key", text)
        text = _K3S_TOKEN.sub(MARK, text)
        text = _INLINE.sub(lambda m: m["head"] + MARK, text)
        return _KEY_VALUE.sub(_by_name, text)


def _by_name(match: re.Match) -> str:
    value = match["value"]
    if _NOT_A_VALUE.fullmatch(value.strip()):
        return match.group(0)
    return match["head"] + MARK + match["tail"]


def variants(value: str) -> list[str]:
    """The forms a secret is written in: as is, base64 (kubeconfig *-data, registry auth),
    each line of a multi-line value (a PEM body), the password part of a k3s token."""
    forms = [value]
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
