"""The k3s stand-in's certificates and TLS, made as k3s makes them (embedded by the builder).

What real k3s does, and this file imitates (k3s-io/k3s at commit 09ac65a):
  pkg/daemons/control/deps/deps.go  createSigningCertKey: self-signed CAs server/tls/
        server-ca.{crt,key} and client-ca.{crt,key}, CN "k3s-server-ca@<unix time>" and
        "k3s-client-ca@<unix time>"; genClientCerts: client-admin.{crt,key}, CN system:admin,
        O system:masters, ExtKeyUsage clientAuth, signed by the client CA; createClientCertKey
        writes the leaf followed by its CA (util.EncodeCertsPEM(cert, caCerts)) and keeps an
        existing key (LoadOrGenerateKeyFile). Keys are ECDSA P-256 (dynamiclistener's
        certutil.NewPrivateKey), PEM "EC PRIVATE KEY".
  pkg/cli/server/server.go          the SAN list shared by the supervisor and apiserver
        certificates: tls-san, then 127.0.0.1, ::1, localhost, the node name, the node IPs,
        node-external-ip and the advertise address.
  pkg/cluster/https.go              newListener: the supervisor/API port (6443) serves a
        certificate signed by the server CA with CN "k3s", O "k3s", those SANs plus
        kubernetes, kubernetes.default, kubernetes.default.svc, kubernetes.default.svc.
        <cluster-domain>, kept in server/tls/dynamic-cert.json; ClientAuth RequestClientCert;
        ALPN h2, http/1.1.
  pkg/daemons/control/server.go     kube-apiserver runs with client-ca-file=client-ca.crt and
        anonymous-auth=false: a request is a client certificate signed by the client CA, or 401.
  pkg/server/server.go              writeKubeConfig -> clientaccess.WriteClientKubeConfig:
        k3s.yaml with https://127.0.0.1:<https-listen-port>, the server CA and the admin
        certificate and key embedded (certificate-authority-data, client-certificate-data,
        client-key-data), cluster, user and context all named "default".
  pkg/clientaccess/token.go         a joining node first fetches /cacerts without verifying
        the server, checks its sha256 against the K10 token's hash, then verifies the server
        with that CA from then on.

Differences: the stand-in makes its certificates with the `openssl` command (Debian's
ca-certificates package depends on it; the test hosts and this machine have it), Python's
ssl module verifies a client certificate during the handshake (a certificate from another
CA fails the handshake; Go's RequestClientCert takes it and the apiserver answers 401), it
offers h2 only where the `h2` module is installed (h2serve.py; HTTP/1.1 otherwise, from which
Go clients fall back), and the serving certificate is issued
again at every start (dynamiclistener adds SANs while it runs; clients verify through the
CA either way).
"""

import base64
import ipaddress
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time

CLUSTER_DOMAIN = "cluster.local"
CA_FILES = ("server-ca.crt", "server-ca.key", "client-ca.crt", "client-ca.key")
ADMIN_CN, ADMIN_ORG = "system:admin", "system:masters"


class PkiError(Exception):
    pass


def _write(path, data, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data if isinstance(data, bytes) else data.encode())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def openssl(*args):
    binary = shutil.which("openssl") or "/usr/bin/openssl"
    try:
        proc = subprocess.run([binary] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise PkiError("cannot run openssl (the k3s stand-in makes its certificates with it): %s" % exc)
    if proc.returncode != 0:
        raise PkiError("openssl %s failed: %s" % (args[0], proc.stderr.decode(errors="replace").strip()[-400:]))
    return proc.stdout


def _config(cn, orgs, extensions):
    lines = ["[req]", "distinguished_name = dn", "prompt = no", "[dn]"]
    lines += ["%d.O = %s" % (i, org) for i, org in enumerate(orgs)]
    lines += ["CN = %s" % cn, "[ext]"] + ["%s = %s" % kv for kv in extensions]
    return "\n".join(lines) + "\n"


def load_or_make_key(path):
    """The key at `path`, or a new ECDSA P-256 key written there (0600)."""
    if os.path.exists(path):
        return _read(path)
    key = openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout")
    _write(path, key, 0o600)
    return key


def _sign(workdir, cn, orgs, extensions, key_path, ca_cert=None, ca_key=None, days=365):
    cfg = os.path.join(workdir, "req.cnf")
    _write(cfg, _config(cn, orgs, extensions), 0o600)
    serial = "0x" + secrets.token_hex(8)
    if ca_cert is None:  # self-signed CA
        return openssl("req", "-x509", "-new", "-key", key_path, "-config", cfg, "-extensions", "ext",
                       "-days", str(days), "-sha256", "-set_serial", serial)
    csr = os.path.join(workdir, "req.csr")
    openssl("req", "-new", "-key", key_path, "-config", cfg, "-out", csr)
    return openssl("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial", serial,
                   "-days", str(days), "-sha256", "-extfile", cfg, "-extensions", "ext")


def ensure_cas(tls_dir):
    """The server and client CAs (created once per data dir, or installed from a join)."""
    for prefix in ("server", "client"):
        cert, key = (os.path.join(tls_dir, "%s-ca.%s" % (prefix, ext)) for ext in ("crt", "key"))
        if os.path.exists(cert) and os.path.exists(key):
            continue
        load_or_make_key(key)
        with tempfile.TemporaryDirectory(dir=tls_dir) as work:
            pem = _sign(work, "k3s-%s-ca@%d" % (prefix, int(time.time())), [],
                        [("basicConstraints", "critical,CA:TRUE"),
                         ("keyUsage", "critical,digitalSignature,keyEncipherment,keyCertSign"),
                         ("subjectKeyIdentifier", "hash")], key, days=3650)
        _write(cert, pem, 0o644)
    return _read(os.path.join(tls_dir, "server-ca.crt"))


def bundle(tls_dir):
    """The CA certificates and keys, as k3s's bootstrap data carries them to joining servers
    and etcd snapshots carry them to a restore."""
    return {name: _read(os.path.join(tls_dir, name)).decode() for name in CA_FILES
            if os.path.exists(os.path.join(tls_dir, name))}


def install(tls_dir, files):
    """Put another server's CAs in place (a joining server, a restore). Certificates they
    signed before are issued again."""
    for name in CA_FILES:
        if name in files:
            _write(os.path.join(tls_dir, name), files[name], 0o600 if name.endswith(".key") else 0o644)
    for stale in ("client-admin.crt", "dynamic-cert.json"):
        if os.path.exists(os.path.join(tls_dir, stale)):
            os.unlink(os.path.join(tls_dir, stale))


def _leaf(tls_dir, ca, cn, orgs, usage, sans, key_path):
    ca_cert, ca_key = os.path.join(tls_dir, ca + ".crt"), os.path.join(tls_dir, ca + ".key")
    load_or_make_key(key_path)
    ext = [("basicConstraints", "critical,CA:FALSE"), ("keyUsage", "critical,digitalSignature,keyEncipherment"),
           ("extendedKeyUsage", usage), ("authorityKeyIdentifier", "keyid")]
    if sans:
        ext.append(("subjectAltName", ",".join(("IP:%s" if _is_ip(s) else "DNS:%s") % s for s in sans)))
    with tempfile.TemporaryDirectory(dir=tls_dir) as work:
        leaf = _sign(work, cn, orgs, ext, key_path, ca_cert, ca_key)
    return leaf + _read(ca_cert)  # the leaf, then its CA (deps.go createClientCertKey)


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def ensure_admin(tls_dir):
    """client-admin.crt/.key (CN system:admin, O system:masters); (cert chain, key)."""
    cert, key = os.path.join(tls_dir, "client-admin.crt"), os.path.join(tls_dir, "client-admin.key")
    if not os.path.exists(cert):
        _write(cert, _leaf(tls_dir, "client-ca", ADMIN_CN, [ADMIN_ORG], "clientAuth", [], key), 0o644)
    return _read(cert), _read(key)


def san_list(tls_san, node_name, node_ips, external_ips=(), advertise=None):
    """k3s-io/k3s pkg/cli/server/server.go, then pkg/cluster/https.go's in-cluster names."""
    out = []
    for san in list(tls_san) + ["127.0.0.1", "::1", "localhost", node_name] + list(node_ips) + \
            list(external_ips) + ([advertise] if advertise else []) + \
            ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + CLUSTER_DOMAIN]:
        if san and san not in out:
            out.append(san)
    return out


def issue_serving(tls_dir, sans):
    """The supervisor/API listener's certificate (CN k3s, O k3s), kept as k3s keeps it in
    tls/dynamic-cert.json (a Secret's data: tls.crt, tls.key)."""
    key_path = os.path.join(tls_dir, "dynamic-cert.key")
    chain = _leaf(tls_dir, "server-ca", "k3s", ["k3s"], "serverAuth", sans, key_path)
    key = _read(key_path)
    os.unlink(key_path)
    _write(os.path.join(tls_dir, "dynamic-cert.json"), json.dumps({
        "kind": "Secret", "apiVersion": "v1", "type": "kubernetes.io/tls",
        "metadata": {"name": "k3s-serving", "namespace": "kube-system"},
        "data": {"tls.crt": base64.b64encode(chain).decode(), "tls.key": base64.b64encode(key).decode()}}), 0o600)
    return chain, key


def server_context(tls_dir, chain, key, alpn=("http/1.1",)):
    """TLS for the supervisor port: the serving chain, client certificates optional and
    verified against the client CA; ALPN offers `alpn` (h2serve.ALPN: "h2" first where the
    stand-in can serve it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(dir=tls_dir) as work:
        cert_file, key_file = os.path.join(work, "tls.crt"), os.path.join(work, "tls.key")
        _write(cert_file, chain, 0o600)
        _write(key_file, key, 0o600)
        ctx.load_cert_chain(cert_file, key_file)
    ctx.load_verify_locations(cafile=os.path.join(tls_dir, "client-ca.crt"))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    # kube-apiserver offers "h2" then "http/1.1" (kubernetes staging/src/k8s.io/apiserver/pkg/server/
    # secure_serving.go, tlsConfig); Go clients take the first they speak.
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def client_context(ca_pem=None):
    """For a joining node: verify the server with `ca_pem`; None only to fetch /cacerts,
    whose hash the token then checks (pkg/clientaccess/token.go)."""
    if ca_pem is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cadata=ca_pem.decode() if isinstance(ca_pem, bytes) else ca_pem)


def kubeconfig(port, ca_pem, admin_chain, admin_key):
    """k3s.yaml as clientaccess.WriteClientKubeConfig writes it."""
    def b64(data):
        return base64.b64encode(data).decode()
    return (
        "apiVersion: v1\n"
        "clusters:\n"
        "- cluster:\n"
        "    certificate-authority-data: %s\n"
        "    server: https://127.0.0.1:%d\n"
        "  name: default\n"
        "contexts:\n"
        "- context:\n"
        "    cluster: default\n"
        "    user: default\n"
        "  name: default\n"
        "current-context: default\n"
        "kind: Config\n"
        "preferences: {}\n"
        "users:\n"
        "- name: default\n"
        "  user:\n"
        "    client-certificate-data: %s\n"
        "    client-key-data: %s\n"
    ) % (b64(ca_pem), port, b64(admin_chain), b64(admin_key))
