"""k3s.yaml as a server writes it, for tests of what the tool keeps of it.

The PEM blocks are shaped like the real ones (a base64 DER SEQUENCE under the right label)
without being real certificates: the tool checks the shape, TLS checks the rest.
"""

import base64

import yaml


def pem(label: str, der: bytes = b"\x30\x03\x02\x01\x01") -> str:
    body = base64.b64encode(der).decode()
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


CA = b64(pem("CERTIFICATE"))
CLIENT_CERT = b64(pem("CERTIFICATE") + pem("CERTIFICATE"))  # k3s: the client cert and its CA
CLIENT_KEY = b64(pem("EC PRIVATE KEY"))


def k3s_yaml(cluster: dict | None = None, user: dict | None = None, **top) -> str:
    """k3s's file: one cluster, user and context, all `default`; `cluster`/`user` add fields."""
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "default", "cluster": {"server": "https://127.0.0.1:6443",
                                                     "certificate-authority-data": CA, **(cluster or {})}}],
        "users": [{"name": "default", "user": {"client-certificate-data": CLIENT_CERT,
                                               "client-key-data": CLIENT_KEY, **(user or {})}}],
        "contexts": [{"name": "default", "context": {"cluster": "default", "user": "default"}}],
        "current-context": "default",
        **top,
    }
    return yaml.safe_dump(config)


K3S_YAML = k3s_yaml()
