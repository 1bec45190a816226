"""Data a host or the cluster sent back: untrusted bytes, read with caps, one error type.

A rented host's operator may control every byte it returns. What the tool reads back is
therefore decoded here, never trusted to be UTF-8 (invalid bytes become U+FFFD), refused
when it is larger than the tool ever writes or expects, and JSON is refused when it nests
deeper than a cap, checked by a linear scan before the decoder runs (json's decoder recurses,
and a 10 000-deep list would raise RecursionError past any ValueError handler).

Every refusal is a RemoteDataError whose message is the reason, in the tool's own words:
it never quotes the hostile bytes. Callers turn it into that one host's failure (a
HostFailure, a preflight Finding), so one host's answer never stops another host.
"""

from __future__ import annotations

import json
import re
from typing import Any

# JSON the tool itself writes on a host (the host manifest) is a few KiB and 3 levels deep.
MAX_JSON_CHARS = 1024 * 1024
MAX_JSON_DEPTH = 32


class RemoteDataError(ValueError):
    """What a host or the cluster returned is refused; str(exc) says why (never the data)."""


def decode(data: bytes | str, *, limit: int, what: str) -> str:
    """Bytes from a host as text: invalid UTF-8 becomes U+FFFD; longer than `limit`
    characters (or bytes) is refused."""
    if len(data) > limit:
        raise RemoteDataError(f"{what} is {len(data)} bytes, more than the {limit} the tool accepts")
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


# One token at a time: a whole JSON string (escapes included, so brackets inside strings do
# not count), or a bracket. A string that is never closed runs to the end of the text (json
# refuses it there, before recursing any deeper): so the match always succeeds where its scan
# stops and the engine never backtracks into the loop, and each character is read once. (With
# the closing quote required, each opening quote of `"\` repeated scanned to the end and gave
# up: quadratic, 26 s for 64 KiB.)
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in `text`, without recursion. For text json would
    accept this is its exact depth; for anything else an upper bound of how far the decoder
    could recurse before it fails, which is all the cap needs."""
    depth = deepest = 0
    for token in _JSON_TOKEN.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str, *, what: str, max_chars: int = MAX_JSON_CHARS,
          max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON from a host or the cluster: size and depth capped before decoding,
    NaN/Infinity refused; RemoteDataError(reason) for anything else than JSON."""
    text = decode(data, limit=max_chars, what=what)
    if json_depth(text) > max_depth:
        raise RemoteDataError(f"{what} nests deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:  # unreachable after the depth scan; kept as a per-host failure all the same
        raise RemoteDataError(f"{what} nests too deep") from None
    except ValueError as exc:
        # JSONDecodeError's message names a position, never the data.
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise RemoteDataError(f"{what} is not valid JSON ({reason})") from None


def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` when it is of `kind` (a bool is never taken for an int), else RemoteDataError."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        wanted = " or ".join(_json_type(k) for k in kinds)
        raise RemoteDataError(f"{where} is {_json_type(type(value))}, not {wanted}")
    return value


def _json_type(kind: type) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true/false", type(None): "null"}.get(kind, kind.__name__)
