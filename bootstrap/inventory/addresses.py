"""Host names, IP addresses and `[user@]host[:port]` endpoints, as the inventory accepts them.

Pure. These strings end up in ssh_config files, certificates, mount units and URLs, so
only plain forms pass: an IP address in its ordinary notation or an ASCII DNS name. No
IPv6 zone (`fe80::1%eth0`: the zone is free text, and an ssh_config line break hides in
it), no whitespace, nothing an option parser could read as a flag.
Callers (the Str spec) have already refused control and non-ASCII characters.
"""

from __future__ import annotations

import ipaddress
import re

DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
DNS_NAME = rf"{DNS_LABEL}(\.{DNS_LABEL})*"
SSH_USER = r"[a-z_][a-z0-9_.-]{0,31}"  # useradd's rule, less the trailing '$' of machine accounts
# inet_aton (and so ssh and getaddrinfo) reads `0x7f000001` or `127.1` as an IPv4 address.
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+", re.ASCII)
_ENDPOINT = re.compile(r"(?:([^@]*)@)?(\[[^\]]*\]|[^:\[\]@]*)(?::([^:]*))?", re.ASCII)


def ip_error(value: str) -> str | None:
    if "%" in value:
        return f"{value!a} has an IPv6 zone (%...): zones are not accepted; write the address without it"
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!a} is not a valid IP address"
    return None


def host_error(value: str) -> str | None:
    """An IP address or a DNS name; something that looks like a broken IP is neither."""
    if re.fullmatch(r"[0-9.]+", value) or ":" in value or "%" in value:
        return ip_error(value)
    name = value.lower()
    if len(name) > 253 or not re.fullmatch(DNS_NAME, name):
        return f"{value!a} is neither an IP address nor a host name"
    if all(_NUMERIC_LABEL.fullmatch(label) for label in name.split(".")):
        return f"{value!a} is an IP address in an unusual notation; write it as a.b.c.d"
    return None


def normal_host(value: str) -> str:
    """One spelling per host: 2001:DB8:0::1 and 2001:db8::1 are one address, Box.example.com
    and box.example.com one name."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return value.lower().rstrip(".")
    # ::ffff:203.0.113.10 reaches the same host as 203.0.113.10.
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def endpoint_parts(value: str) -> tuple[str | None, str, str | None] | None:
    """(user, host, port) of `[user@]host[:port]`, the host without its [brackets]; None when
    it is not of that shape."""
    match = _ENDPOINT.fullmatch(value)
    if not match:
        return None
    user, host, port = match.groups()
    if host.startswith("["):
        host = host[1:-1]
    return user, host, port


def endpoint_error(value: str, *, user_ok: bool) -> str | None:
    """`host[:port]` (or `user@host[:port]` with `user_ok`); an IPv6 host in [brackets]."""
    parts = endpoint_parts(value)
    if parts is None:
        return f"{value!a} is not {'[user@]' if user_ok else ''}host[:port] (an IPv6 address goes in [brackets])"
    user, host, port = parts
    if user is not None and not (user_ok and re.fullmatch(SSH_USER, user)):
        return f"{value!a}: {user!a} is not a user name" if user_ok else f"{value!a} may not name a user"
    if ":" in host and not value.split("@")[-1].startswith("["):
        return f"{value!a}: write an IPv6 address in [brackets]"
    if value.split("@")[-1].startswith("[") and ":" not in host:
        return f"{value!a}: only an IPv6 address goes in [brackets]"
    error = host_error(host)
    if error:
        return error
    if port is not None and not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        return f"{value!a}: the port must be a number from 1 to 65535"
    return None


def jump_error(value: str) -> str | None:
    return endpoint_error(value, user_ok=True)


def normal_endpoint(value: str, default_port: int = 22) -> tuple:
    """A bastion's (user, host, port) with the host in its one spelling, for comparing."""
    parts = endpoint_parts(value) or (None, value, None)
    user, host, port = parts
    return user, normal_host(host), int(port) if port and port.isdigit() else default_port


def url_error(value: str) -> str | None:
    """An http(s) URL of a registry mirror: scheme, host[:port] and a plain path."""
    match = re.fullmatch(r"(https?)://([^/]*)(/[A-Za-z0-9._~/+-]*)?", value, re.ASCII)
    if not match:
        return f"{value!a} is not an http:// or https:// URL with a plain path"
    return endpoint_error(match.group(2), user_ok=False)
