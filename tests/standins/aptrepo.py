"""A stand-in for NVIDIA's apt repository: stand-in ``nvidia-container-toolkit`` .debs and
a flat apt repository serving them over HTTP to the test hosts.

The tool installs the toolkit with apt from the source line the inventory gives
(``gpu.container_toolkit.apt_source``); tests point that at an ``AptRepo``::

    deb = build_toolkit_deb(tmp_path)
    with AptRepo([deb]) as repo:          # after lab.start(...): 10.200.0.1 is the lab bridge
        inventory["gpu"]["container_toolkit"]["apt_source"] = repo.source_line
        ...
        assert repo.fetched(deb.name)     # repo.requests: ["/./Release", "/./Packages.gz", "/./<deb>", ...]

Nothing here needs dpkg-dev: the ``Packages`` stanzas are written in Python from each
deb's control fields (``dpkg-deb -f``); only ``dpkg-deb`` (package ``dpkg``) is used.

The repository is "flat" (no ``dists/``): its source line ends in ``./`` instead of a
suite and components. It has an unsigned ``Release`` file listing the hashes of
``Packages`` and ``Packages.gz``, so apt fetches just those two names (without it apt
also probes ``Packages.xz``, ``.bz2``, ... and warns); ``[trusted=yes]`` is what makes
apt accept an unsigned repository.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import time
from email.utils import formatdate
from pathlib import Path

# Not dates the tests care about; fixed so the same inputs build the same .deb bytes.
EPOCH = 1735689600  # 2025-01-01T00:00:00Z
MAINTAINER = "bootstrap tests <bootstrap-tests@localhost>"
HOMEPAGE = "https://github.com/NVIDIA/nvidia-container-toolkit"
STANDIN_LOG = "/run/nvidia-container-toolkit-standin.log"  # /run: tmpfs, not in a host's upper dir
# A made-up commit id for the --version output (the real one prints the git commit).
FAKE_COMMIT = "5tand1n0" * 5
# Packages fields copied from a deb's control, in this order (then Filename, Size, MD5sum,
# SHA256, Description).
STANZA_FIELDS = ("Package", "Version", "Architecture", "Maintainer", "Installed-Size", "Depends", "Breaks",
                 "Replaces", "Section", "Priority", "Homepage")


def upstream_version(version: str) -> str:
    """'1.17.8-1' -> '1.17.8' (what the binaries print)."""
    return version.rsplit("-", 1)[0] if "-" in version else version


def _script(prog: str, version_text: str) -> str:
    """A small sh script: ``--version`` prints what the real binary prints (first lines),
    anything else is logged to STANDIN_LOG and exits 0."""
    return (
        "#!/bin/sh\n"
        f"# {prog}: test stand-in from nvidia-container-toolkit (bootstrap tests), not the real one.\n"
        'case "$1" in\n'
        "  --version|-v|version)\n"
        f"    cat <<'EOF'\n{version_text}EOF\n"
        "    exit 0 ;;\n"
        "esac\n"
        f'echo "{prog} $*" >>{STANDIN_LOG} 2>/dev/null || true\n'
        "exit 0\n"
    )


def _ctk(version: str) -> str:
    return _script("nvidia-ctk", f"NVIDIA Container Toolkit CLI version {upstream_version(version)}\n"
                                 f"commit: {FAKE_COMMIT}\n")


def _runtime(version: str) -> str:
    return _script("nvidia-container-runtime", f"NVIDIA Container Runtime version {upstream_version(version)}\n"
                                               f"commit: {FAKE_COMMIT}\n"
                                               "spec: 1.2.1\n")


def _hook(version: str) -> str:
    return _script("nvidia-container-runtime-hook", f"NVIDIA Container Runtime Hook version {upstream_version(version)}\n"
                                                    f"commit: {FAKE_COMMIT}\n")


def _cli(version: str) -> str:
    v = upstream_version(version)
    return _script("nvidia-container-cli", f"cli-version: {v}\nlib-version: {v}\n"
                                           "build date: 2025-01-01T00:00+00:00\n")


def _standin_note(package: str, version: str) -> str:
    return (f"{package} {version}: a test stand-in built by the bootstrap tests (tests/standins/aptrepo.py).\n"
            "It is not NVIDIA's package: its programs are small shell scripts that print a version\n"
            "and otherwise do nothing.\n")


def build_deb(out_dir: Path, package: str, version: str, arch: str, files: dict[str, tuple[str | bytes, int]],
              depends: str | None = None, description: str | None = None,
              relations: dict[str, str] | None = None) -> Path:
    """Build ``<out_dir>/<package>_<version>_<arch>.deb`` with ``dpkg-deb --build
    --root-owner-group`` from ``files`` (absolute path -> (content, mode)). Every package
    also gets ``/usr/share/doc/<package>/STANDIN``. ``relations`` adds control fields such
    as Breaks and Replaces. Same inputs, same bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = dict(files)
    files.setdefault(f"/usr/share/doc/{package}/STANDIN", (_standin_note(package, version), 0o644))
    with tempfile.TemporaryDirectory(prefix=f"deb-{package}-") as tmp:
        root = Path(tmp) / "root"
        size = 0
        for remote, (content, mode) in sorted(files.items()):
            target = root / remote.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
            target.chmod(mode)
            size += (len(data) + 1023) // 1024
        summary = f"NVIDIA container toolkit ({package}), test stand-in"
        control = {
            "Package": package,
            "Version": version,
            "Architecture": arch,
            "Maintainer": MAINTAINER,
            "Installed-Size": str(max(size, 1)),
            "Depends": depends,
            **(relations or {}),
            "Section": "utils",
            "Priority": "optional",
            "Homepage": HOMEPAGE,
            "Description": summary + "\n " + (description or
                                               "Test stand-in for the bootstrap tool's tests; not NVIDIA's package."),
        }
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            "".join(f"{k}: {v}\n" for k, v in control.items() if v is not None))
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
            os.utime(path, (EPOCH, EPOCH), follow_symlinks=False)
        deb = out_dir / f"{package}_{version}_{arch}.deb"
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)}
        proc = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"dpkg-deb --build {package} failed ({proc.returncode}): {proc.stderr.strip()}")
    return deb


def build_toolkit_deb(out_dir: Path, version: str = "1.17.8-1", arch: str = "amd64") -> Path:
    """One self-contained stand-in ``nvidia-container-toolkit`` (no Depends), named like the
    real one (``nvidia-container-toolkit_1.17.8-1_amd64.deb``). It installs
    ``/usr/bin/nvidia-ctk``, ``/usr/bin/nvidia-container-runtime``,
    ``/usr/bin/nvidia-container-runtime-hook`` and ``/usr/share/doc/nvidia-container-toolkit/STANDIN``."""
    return build_deb(out_dir, "nvidia-container-toolkit", version, arch, {
        "/usr/bin/nvidia-ctk": (_ctk(version), 0o755),
        "/usr/bin/nvidia-container-runtime": (_runtime(version), 0o755),
        "/usr/bin/nvidia-container-runtime-hook": (_hook(version), 0o755),
    })


def build_toolkit_debs(out_dir: Path, version: str = "1.17.8-1", arch: str = "amd64") -> list[Path]:
    """The real package split, as stand-ins: ``nvidia-container-toolkit`` (the hook) depends on
    ``nvidia-container-toolkit-base (= version)`` (nvidia-ctk, nvidia-container-runtime) and
    ``libnvidia-container-tools (>= version), (<< 2.0.0)`` (nvidia-container-cli), as NVIDIA's
    1.17 packages do. toolkit-base also Breaks/Replaces ``nvidia-container-toolkit (<< version)``
    (NVIDIA's does for the pre-split 1.10), so a host with the all-in-one stand-in of
    ``build_toolkit_deb`` upgrades to this set without a file conflict.
    Returns [toolkit, toolkit-base, libnvidia-container-tools]."""
    major = int(version.split(".", 1)[0])
    return [
        build_deb(out_dir, "nvidia-container-toolkit", version, arch,
                  {"/usr/bin/nvidia-container-runtime-hook": (_hook(version), 0o755)},
                  depends=(f"nvidia-container-toolkit-base (= {version}), libnvidia-container-tools (>= {version}), "
                           f"libnvidia-container-tools (<< {major + 1}.0.0)")),
        build_deb(out_dir, "nvidia-container-toolkit-base", version, arch, {
            "/usr/bin/nvidia-ctk": (_ctk(version), 0o755),
            "/usr/bin/nvidia-container-runtime": (_runtime(version), 0o755),
        }, relations={"Breaks": f"nvidia-container-toolkit (<< {version})",
                      "Replaces": f"nvidia-container-toolkit (<< {version})"}),
        build_deb(out_dir, "libnvidia-container-tools", version, arch,
                  {"/usr/bin/nvidia-container-cli": (_cli(version), 0o755)}),
    ]


def deb_control(deb: Path) -> dict[str, str]:
    """The control fields of a .deb (``dpkg-deb -f``), in file order; a multi-line field
    keeps its continuation lines (" ...")."""
    out = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    fields: dict[str, str] = {}
    key = None
    for line in out.splitlines():
        if line[:1] in (" ", "\t") and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def packages_stanza(deb: Path, filename: str | None = None) -> str:
    """The ``Packages`` stanza for ``deb`` (as dpkg-scanpackages would write it, less the
    fields apt does not need), with a trailing blank line."""
    control = deb_control(deb)
    data = Path(deb).read_bytes()
    fields = {k: control[k] for k in STANZA_FIELDS if k in control}
    fields.update({
        "Filename": filename or f"./{Path(deb).name}",
        "Size": str(len(data)),
        "MD5sum": hashlib.md5(data).hexdigest(),
        "SHA256": hashlib.sha256(data).hexdigest(),
        "Description": control.get("Description", ""),
    })
    return "".join(f"{k}: {v}\n" for k, v in fields.items()) + "\n"


def write_flat_repo(directory: Path, debs: list[Path]) -> None:
    """Copy ``debs`` into ``directory`` and write ``Packages``, ``Packages.gz`` and an
    unsigned ``Release`` (with their hashes) next to them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [Path(d).name for d in debs]
    if len(set(names)) != len(names):
        raise ValueError(f"two debs with the same file name: {names}")
    stanzas = []
    for deb in debs:
        shutil.copyfile(deb, directory / Path(deb).name)
        stanzas.append(packages_stanza(directory / Path(deb).name))
    packages = "".join(stanzas).encode()
    (directory / "Packages").write_bytes(packages)
    (directory / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    archs = sorted({deb_control(d)["Architecture"] for d in debs}) or ["all"]
    index = {n: (directory / n).read_bytes() for n in ("Packages", "Packages.gz")}

    def hashes(algo: str) -> str:
        return "".join(f" {hashlib.new(algo, b).hexdigest()} {len(b):>8} {n}\n" for n, b in index.items())

    (directory / "Release").write_text(
        "Origin: bootstrap-tests\n"
        "Label: nvidia-container-toolkit stand-in\n"
        f"Architectures: {' '.join(archs)}\n"
        f"Date: {formatdate(time.time(), usegmt=True)}\n"
        "Description: test stand-in for NVIDIA's libnvidia-container apt repository\n"
        f"MD5Sum:\n{hashes('md5')}"
        f"SHA256:\n{hashes('sha256')}"
    )


class AptRepo:
    """A flat apt repository of ``debs``, served over HTTP on ``bind:port`` (0 = a free port)
    from a background thread until ``close()`` (or the end of a ``with`` block).

    ``bind`` defaults to the lab bridge address, which exists only while test hosts are up:
    create the repo after ``lab.start(...)``. ``requests`` lists the path of every request
    in order (``responses`` the same with the status code), to assert apt really fetched.
    """

    def __init__(self, debs: list[Path], bind: str = "10.200.0.1", port: int = 0):
        self.dir = Path(tempfile.mkdtemp(prefix="aptrepo-"))
        self.requests: list[str] = []
        self.responses: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        try:
            write_flat_repo(self.dir, list(debs))
            repo = self

            class Handler(http.server.SimpleHTTPRequestHandler):
                def __init__(self, *args, **kwargs):
                    super().__init__(*args, directory=str(repo.dir), **kwargs)

                def log_request(self, code="-", size="-"):
                    path = self.path.split("?", 1)[0]
                    with repo._lock:
                        repo.requests.append(path)
                        repo.responses.append((path, int(code) if str(code).isdigit() else 0))

                def log_message(self, format, *args):  # quiet
                    pass

            class Server(http.server.ThreadingHTTPServer):
                daemon_threads = True
                allow_reuse_address = False

            try:
                self._server = Server((bind, port), Handler)
            except OSError as exc:
                hint = " (the lab bridge is up only while test hosts run: start hosts first)" \
                    if bind.startswith("10.200.0.") else ""
                raise OSError(exc.errno, f"cannot serve an apt repository on {bind}:{port}: {exc.strerror}{hint}") from exc
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"aptrepo:{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def source_line(self) -> str:
        return f"deb [trusted=yes] {self.url} ./"

    def fetched(self, name: str) -> bool:
        """Whether a request for ``name`` (e.g. a .deb file name) was answered 200."""
        with self._lock:
            return any(p.rsplit("/", 1)[-1] == name and code == 200 for p, code in self.responses)

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "AptRepo":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
