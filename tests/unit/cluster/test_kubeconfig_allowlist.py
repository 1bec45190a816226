"""The kubeconfig is built by the tool from an allow-list, never copied from a server.

A rented server's operator writes its k3s.yaml. Before this, `rewrite` kept every field of
`users[].user`: an `exec` plugin there ran a program on the operator's machine (kubernetes
client, Helm, kubectl after `--merge`). Each test here fails on that code.
"""

import stat

import pytest
import yaml
from fakes import FakeSession
from kubeconfigs import CA, CLIENT_CERT, CLIENT_KEY, K3S_YAML, b64, k3s_yaml, pem

from bootstrap.cluster import kubeconfig_file as kc
from bootstrap.errors import BootstrapError
from bootstrap.flows.host_phase import fetch_kubeconfig
from bootstrap.inventory.loader import load_inventory
from bootstrap.state.folder import StateDir

EXEC = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh",
                 "args": ["-c", "touch /tmp/pwned"]}}


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "lab", "state_dir": "state", "nodes": [
        {"name": "cp-1", "address": "203.0.113.10", "role": "server"},
        {"name": "gpu-1", "address": "203.0.113.20"}]}))
    return load_inventory(path)


@pytest.mark.parametrize("user_field", [
    EXEC,
    {"auth-provider": {"name": "oidc", "config": {"client-id": "x"}}},
    {"token": "abc"}, {"tokenFile": "/home/me/.token"},
    {"username": "admin"}, {"password": "hunter2"},
    {"client-certificate": "/home/me/.ssh/id_ed25519"}, {"client-key": "/home/me/.ssh/id_ed25519"},
], ids=lambda f: next(iter(f)))
def test_a_user_field_that_could_run_code_or_read_local_files_refuses_the_file(inventory, user_field):
    with pytest.raises(BootstrapError) as caught:
        kc.rewrite(k3s_yaml(user=user_field), inventory, "0123456789abcdef")
    field = next(iter(user_field))
    assert "cp-1" in caught.value.message and repr(field) in caught.value.message


@pytest.mark.parametrize("cluster_field", [
    {"proxy-url": "socks5://198.51.100.7:1080"}, {"insecure-skip-tls-verify": True},
    {"certificate-authority": "/etc/ssl/certs/ca-certificates.crt"},
], ids=lambda f: next(iter(f)))
def test_a_cluster_field_that_sends_traffic_elsewhere_refuses_the_file(inventory, cluster_field):
    with pytest.raises(BootstrapError) as caught:
        kc.rewrite(k3s_yaml(cluster=cluster_field), inventory, "0123456789abcdef")
    assert "cp-1" in caught.value.message and repr(next(iter(cluster_field))) in caught.value.message


def test_a_dangerous_field_in_an_extra_user_refuses_the_file_too(inventory):
    text = yaml.safe_load(K3S_YAML)
    text["users"].append({"name": "spare", "user": EXEC})
    with pytest.raises(BootstrapError, match="'exec'"):
        kc.rewrite(yaml.safe_dump(text), inventory, "0123456789abcdef")


def test_only_the_allow_listed_fields_are_written_and_harmless_noise_is_dropped(inventory):
    config = yaml.safe_load(k3s_yaml(cluster={"tls-server-name": "evil.example", "extensions": [
        {"name": "x", "extension": {"a": 1}}]}, user={"disable-compression": True},
        preferences={"colors": True}))
    config["clusters"].append({"name": "other", "cluster": {"server": "https://198.51.100.7:6443"}})
    config["contexts"].append({"name": "other", "context": {"cluster": "other", "user": "default"}})
    written = yaml.safe_load(kc.rewrite(yaml.safe_dump(config), inventory, "0123456789abcdef"))
    assert [c["name"] for c in written["clusters"]] == ["bootstrap-lab"]
    assert written["clusters"][0]["cluster"] == {
        "server": "https://203.0.113.10:6443", "certificate-authority-data": CA,
        "extensions": [{"name": "bootstrap", "extension": {"cluster-id": "0123456789abcdef"}}]}
    assert written["users"] == [{"name": "bootstrap-lab", "user": {"client-certificate-data": CLIENT_CERT,
                                                                     "client-key-data": CLIENT_KEY}}]
    assert written["contexts"] == [{"name": "bootstrap-lab", "context": {"cluster": "bootstrap-lab",
                                                                         "user": "bootstrap-lab"}}]
    assert set(written) == {"apiVersion", "kind", "preferences", "clusters", "users", "contexts", "current-context"}
    assert written["preferences"] == {}


def test_the_server_url_is_the_tools_whatever_the_file_says(inventory):
    text = k3s_yaml(cluster={"server": "http://198.51.100.7:80"})
    written = yaml.safe_load(kc.rewrite(text, inventory, "0123456789abcdef"))
    assert written["clusters"][0]["cluster"]["server"] == "https://203.0.113.10:6443"


@pytest.mark.parametrize("text", [
    "{{{ not yaml", "- a\n- list\n", "just a string", "", "clusters: nope\nusers: []\n",
    "clusters: [1, 2]\nusers: []\n", "[" * 5000 + "]" * 5000, "a: " + "x" * (300 * 1024),
    k3s_yaml(user={"client-key-data": "not base64 at all!"}),
    k3s_yaml(user={"client-key-data": b64("plain text, not PEM")}),
    k3s_yaml(user={"client-key-data": CA}),  # a certificate where the key goes
    k3s_yaml(cluster={"certificate-authority-data": CLIENT_KEY}),  # a key where the CA goes
    k3s_yaml(user={"client-key-data": b64(pem("EC PRIVATE KEY") + pem("EC PRIVATE KEY"))}),
    k3s_yaml(cluster={"certificate-authority-data": b64(pem("CERTIFICATE") + "trailing junk\n")}),
    k3s_yaml(cluster={"certificate-authority-data": b64(pem("CERTIFICATE", b"\x01\x02"))}),
    k3s_yaml(cluster={"certificate-authority-data": "QUFB" * 20000}),
    k3s_yaml(cluster={"certificate-authority-data": 42}),
    k3s_yaml(user={"client-certificate-data": None}),
    k3s_yaml(**{"current-context": "missing"}, contexts=[{"name": "a", "context": {"cluster": "x", "user": "y"}},
                                                         {"name": "b", "context": "y"}]),
], ids=range(19))
def test_a_malformed_file_is_a_clear_error_never_a_traceback(inventory, text):
    with pytest.raises(BootstrapError) as caught:
        kc.rewrite(text, inventory, "0123456789abcdef")
    assert "cp-1" in caught.value.message and "it was not used" in caught.value.message


def test_the_saved_file_is_checked_again_when_it_is_read(inventory, tmp_path):
    """A kubeconfig saved by an older version may carry the server's exec plugin."""
    old = yaml.safe_load(K3S_YAML)
    old["clusters"][0]["name"] = old["users"][0]["name"] = "bootstrap-lab"
    old["contexts"][0] = {"name": "bootstrap-lab", "context": {"cluster": "bootstrap-lab", "user": "bootstrap-lab"}}
    old["current-context"] = "bootstrap-lab"
    old["users"][0]["user"].update(EXEC)
    saved = tmp_path / "kubeconfig"
    saved.write_text(yaml.safe_dump(old))
    with pytest.raises(BootstrapError, match="'exec'"):
        kc.with_server(saved, "127.0.0.1:40000")
    target = tmp_path / "kube" / "config"
    with pytest.raises(BootstrapError, match="'exec'"):
        kc.merge_into(target, old)
    assert not target.exists()


def test_with_server_rebuilds_the_saved_file_for_the_tunnel(inventory, tmp_path):
    saved = tmp_path / "kubeconfig"
    saved.write_text(kc.rewrite(K3S_YAML, inventory, "0123456789abcdef"))
    tunneled = yaml.safe_load(kc.with_server(saved, "127.0.0.1:40000"))
    assert tunneled["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:40000"
    assert kc.cluster_id_of(tunneled["clusters"][0]) == "0123456789abcdef"
    assert set(tunneled["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}


def test_merge_keeps_the_users_own_entries_and_writes_only_ours_from_the_allow_list(inventory, tmp_path):
    target = tmp_path / "kube" / "config"
    target.parent.mkdir()
    mine = {"apiVersion": "v1", "kind": "Config", "current-context": "work",
            "clusters": [{"name": "work", "cluster": {"server": "https://10.1.1.1:6443"}}],
            "users": [{"name": "work", "user": {"exec": {"command": "aws", "args": ["eks", "get-token"]}}}],
            "contexts": [{"name": "work", "context": {"cluster": "work", "user": "work"}}]}
    target.write_text(yaml.safe_dump(mine))
    kc.merge_into(target, kc.rewrite(K3S_YAML, inventory, "0123456789abcdef"))
    merged = yaml.safe_load(target.read_text())
    assert merged["users"][0] == mine["users"][0]  # the user's own exec plugin: theirs, kept
    assert merged["current-context"] == "work"
    assert merged["users"][1] == {"name": "bootstrap-lab", "user": {"client-certificate-data": CLIENT_CERT,
                                                                     "client-key-data": CLIENT_KEY}}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["config"]  # no temp file left


@pytest.mark.parametrize("local", ["{{{ broken", "- a list\n", "clusters: 5\n"])
def test_merge_into_a_local_file_kubectl_could_not_read_changes_nothing(inventory, tmp_path, local):
    target = tmp_path / "config"
    target.write_text(local)
    with pytest.raises(BootstrapError, match="it was not changed"):
        kc.merge_into(target, kc.rewrite(K3S_YAML, inventory, "0123456789abcdef"))
    assert target.read_text() == local


def test_up_fails_the_server_whose_kubeconfig_carries_an_exec_plugin_and_saves_nothing(inventory):
    class Session(FakeSession):
        def read_root_file(self, name, path):
            return k3s_yaml(user=EXEC)

    state = StateDir(inventory)
    session = Session(inventory, {})
    fetch_kubeconfig(session, inventory, state)
    assert "'exec'" in session.failures["cp-1"].message
    assert not (state.path / "kubeconfig").exists()


def test_a_real_k3s_yaml_passes_and_the_kubernetes_client_loads_what_is_written(inventory, tmp_path):
    """PEMs as k3s writes them (the stand-in's PKI, openssl): an EC key, a two-certificate
    client chain, the server CA."""
    from kubernetes import client, config

    from standins import k3s_pki

    tls = tmp_path / "tls"
    tls.mkdir()
    ca = k3s_pki.ensure_cas(str(tls))
    chain, key = k3s_pki.ensure_admin(str(tls))
    written = tmp_path / "kubeconfig"
    written.write_text(kc.rewrite(k3s_pki.kubeconfig(6443, ca, chain, key), inventory, "0123456789abcdef"))
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(written), client_configuration=configuration)
    assert configuration.host == "https://203.0.113.10:6443"
    assert configuration.cert_file and configuration.key_file and configuration.ssl_ca_cert
