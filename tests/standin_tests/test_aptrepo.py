"""The stand-in nvidia-container-toolkit .debs and the flat apt repository that serves them
(the tool's apt commands against it on a test host: tests/hosts/test_aptrepo_hosts.py)."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from standins.aptrepo import AptRepo, build_toolkit_deb, build_toolkit_debs, deb_control, write_flat_repo

LIST = "/etc/apt/sources.list.d/bootstrap-nvidia-container-toolkit.list"
# The tool's commands, verbatim (see the brief for bootstrap's container-toolkit step).
APT_UPDATE = ("apt-get update -o Dir::Etc::sourcelist=sources.list.d/bootstrap-nvidia-container-toolkit.list "
              "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
APT_INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nvidia-container-toolkit"
APT_HOLD = "apt-mark hold nvidia-container-toolkit"


def stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields, key = {}, None
        for line in block.splitlines():
            if line.startswith(" "):
                fields[key] += "\n" + line
            else:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        out.append(fields)
    return out


def extract(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    return into


# --------------------------------------------------------------------------- fast


def test_toolkit_deb_control_and_contents(tmp_path):
    deb = build_toolkit_deb(tmp_path)
    assert deb.name == "nvidia-container-toolkit_1.17.8-1_amd64.deb"
    info = subprocess.run(["dpkg-deb", "-I", str(deb)], capture_output=True, text=True, check=True).stdout
    assert "Package: nvidia-container-toolkit\n" in info
    assert "Version: 1.17.8-1\n" in info and "Architecture: amd64\n" in info
    assert "test stand-in" in info and "Depends:" not in info
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    entries = {line.split()[-1]: line.split()[:2] for line in listing.splitlines()}
    for prog in ("nvidia-container-runtime", "nvidia-ctk"):
        assert entries[f"./usr/bin/{prog}"] == ["-rwxr-xr-x", "root/root"]
    assert entries["./usr/share/doc/nvidia-container-toolkit/STANDIN"] == ["-rw-r--r--", "root/root"]
    assert all(owner == "root/root" for _, owner in entries.values())

    root = extract(deb, tmp_path / "x")
    assert "test stand-in" in (root / "usr/share/doc/nvidia-container-toolkit/STANDIN").read_text()
    run = lambda prog, *a: subprocess.run([str(root / "usr/bin" / prog), *a], capture_output=True, text=True)
    assert run("nvidia-ctk", "--version").stdout.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.17.8"
    assert run("nvidia-container-runtime", "--version").stdout.splitlines()[0] == \
        "NVIDIA Container Runtime version 1.17.8"
    other = run("nvidia-ctk", "runtime", "configure", "--runtime=containerd")
    assert (other.returncode, other.stdout) == (0, "")


def test_other_version_and_reproducible(tmp_path):
    a = build_toolkit_deb(tmp_path / "a", version="1.16.2-1", arch="arm64")
    b = build_toolkit_deb(tmp_path / "b", version="1.16.2-1", arch="arm64")
    assert a.name == "nvidia-container-toolkit_1.16.2-1_arm64.deb"
    assert a.read_bytes() == b.read_bytes()
    assert deb_control(a)["Architecture"] == "arm64"
    root = extract(a, tmp_path / "x")
    out = subprocess.run([str(root / "usr/bin/nvidia-ctk"), "--version"], capture_output=True, text=True).stdout
    assert out.startswith("NVIDIA Container Toolkit CLI version 1.16.2\n")


def test_split_packages_have_the_real_dependency_shape(tmp_path):
    toolkit, base, tools = build_toolkit_debs(tmp_path, version="1.17.9-1")
    assert [d.name for d in (toolkit, base, tools)] == [
        "nvidia-container-toolkit_1.17.9-1_amd64.deb", "nvidia-container-toolkit-base_1.17.9-1_amd64.deb",
        "libnvidia-container-tools_1.17.9-1_amd64.deb"]
    assert deb_control(toolkit)["Depends"] == ("nvidia-container-toolkit-base (= 1.17.9-1), "
                                               "libnvidia-container-tools (>= 1.17.9-1), "
                                               "libnvidia-container-tools (<< 2.0.0)")
    assert deb_control(base)["Replaces"] == "nvidia-container-toolkit (<< 1.17.9-1)"
    listing = subprocess.run(["dpkg-deb", "-c", str(base)], capture_output=True, text=True, check=True).stdout
    assert "./usr/bin/nvidia-ctk" in listing and "./usr/bin/nvidia-container-runtime" in listing


def test_packages_release_and_checksums(tmp_path):
    debs = [build_toolkit_deb(tmp_path / "one")] + build_toolkit_debs(tmp_path / "split", version="1.17.9-1")
    repo = tmp_path / "repo"
    write_flat_repo(repo, debs)
    text = (repo / "Packages").read_text()
    assert gzip.decompress((repo / "Packages.gz").read_bytes()).decode() == text
    by_file = {s["Filename"]: s for s in stanzas(text)}
    assert len(by_file) == 4
    for deb in debs:
        s = by_file[f"./{deb.name}"]
        data = (repo / deb.name).read_bytes()
        assert data == deb.read_bytes()
        control = deb_control(deb)
        for field in ("Package", "Version", "Architecture", "Maintainer", "Installed-Size", "Description"):
            assert s[field] == control[field]
        assert s.get("Depends") == control.get("Depends")
        assert s["Size"] == str(len(data))
        assert s["MD5sum"] == hashlib.md5(data).hexdigest()
        assert s["SHA256"] == hashlib.sha256(data).hexdigest()
        assert "test stand-in" in s["Description"]
    assert list(by_file["./nvidia-container-toolkit_1.17.8-1_amd64.deb"])[:11] == [
        "Package", "Version", "Architecture", "Maintainer", "Installed-Size", "Section", "Priority", "Homepage",
        "Filename", "Size", "MD5sum"]

    release = (repo / "Release").read_text()
    assert "Architectures: amd64\n" in release
    sha = release.split("SHA256:\n", 1)[1].splitlines()
    listed = {line.split()[2]: (line.split()[0], int(line.split()[1])) for line in sha}
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        assert listed[name] == (hashlib.sha256(data).hexdigest(), len(data))


def test_repo_serves_over_http_and_records_requests(tmp_path):
    deb = build_toolkit_deb(tmp_path)
    with AptRepo([deb], bind="127.0.0.1") as repo, AptRepo([deb], bind="127.0.0.1") as other:
        assert repo.port != other.port and repo.port > 0
        assert repo.url == f"http://127.0.0.1:{repo.port}/"
        assert repo.source_line == f"deb [trusted=yes] http://127.0.0.1:{repo.port}/ ./"
        # apt asks for "./<name>" under the URL, as in a flat source line
        assert urllib.request.urlopen(repo.url + "./" + deb.name).read() == deb.read_bytes()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(repo.url + "./InRelease")
        assert err.value.code == 404
        assert repo.requests == [f"/./{deb.name}", "/./InRelease"]
        assert repo.responses == [(f"/./{deb.name}", 200), ("/./InRelease", 404)]
        assert repo.fetched(deb.name) and not repo.fetched("InRelease")
        assert other.requests == []
        served = repo.dir
    assert not served.exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(repo.url + "Packages", timeout=2)


def test_bind_error_says_to_start_hosts(tmp_path):
    deb = build_toolkit_deb(tmp_path)
    with pytest.raises(OSError, match="cannot serve an apt repository on 192.0.2.1"):
        AptRepo([deb], bind="192.0.2.1")  # TEST-NET-1: not an address of this machine
