"""Images on the test hosts: the embedded mirror's config, pre-pulls on GPU nodes in
parallel, air-gap image archives imported on every node without restarting k3s."""

import gzip
import io
import re
import tarfile
import time

import pytest
import yaml
from clirun import run_bootstrap
from labinv import write_inventory

pytestmark = pytest.mark.hosts


def image_archive(path, refs):
    """An image archive as the stand-in reads it: a tar naming its images in images.txt."""
    listing = ("\n".join(refs) + "\n").encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("images.txt")
        info.size = len(listing)
        tar.addfile(info, io.BytesIO(listing))
    return path


def gzipped_image_archive(path, refs):
    plain = image_archive(path.with_suffix(".tar"), refs)
    path.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return path


def images_on(host):
    lines = host.ssh("sudo k3s crictl images").stdout.splitlines()[1:]
    return {f"{line.split()[0]}:{line.split()[1]}" for line in lines}


def pulls_on(host):
    out = host.ssh("sudo cat /var/lib/rancher/k3s/agent/containerd/standin-pulls.log 2>/dev/null", check=False).stdout
    return [(float(t), ref) for t, ref in (line.split() for line in out.splitlines())]


def test_gpu_nodes_prepull_in_parallel_share_images_and_import_air_gap_archives(lab, tmp_path, airgap):
    from standins.aptrepo import AptRepo, build_toolkit_deb

    image_archive(airgap / "workload-images.tar", ["nvcr.io/nvidia/pytorch:25.01-py3"])
    hosts = lab.start(["im-cp", "im-g1", "im-g2"], gpu=["im-g1", "im-g2"])
    with AptRepo([build_toolkit_deb(tmp_path / "debs")]) as repo:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
            "k3s": {"airgap": str(airgap)},
            "gpu": {"driver": "preinstalled", "cuda": "12.4", "container_toolkit": {"apt_source": repo.source_line}},
            "images": {"prepull": ["ghcr.io/example/train:1.0"]}})
        first = run_bootstrap("up", inventory, "--hosts-only")
    check_images(hosts, inventory, first, airgap)


def check_images(hosts, inventory, first, airgap):
    cp, g1, g2 = hosts
    assert first.returncode == 0, first.stdout + first.stderr

    # The embedded mirror: a server flag, and every node lists the registries it shares.
    assert yaml.safe_load(cp.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout)["embedded-registry"] is True
    assert "embedded-registry" not in g1.ssh("sudo cat /etc/rancher/k3s/config.yaml").stdout
    for host in hosts:
        mirrors = yaml.safe_load(host.ssh("sudo cat /etc/rancher/k3s/registries.yaml").stdout)["mirrors"]
        assert {"docker.io", "nvcr.io", "registry.k8s.io"} <= set(mirrors)

    # Pulls: the validation images, the inventory's and the GPU Operator's, on the GPU nodes
    # only, at once; k3s pulls them from an image list in agent/images written once it runs
    # (the start did not wait for them), in the background: `up` was done before they were.
    from bootstrap.host.images import normalise, prepull_images
    from bootstrap.inventory.loader import load_inventory

    wanted = {normalise(i) for i in prepull_images(load_inventory(inventory))}
    assert {"nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", "docker.io/library/busybox:1.36",
            "ghcr.io/example/train:1.0", "nvcr.io/nvidia/gpu-operator:v26.7.0"} <= wanted
    for gpu in (g1, g2):
        # what was asked (the list itself goes once its pulls are done: it would hold every start)
        listed = gpu.ssh("sudo cat /var/lib/bootstrap/image-pulls.txt").stdout.split()
        assert {normalise(i) for i in listed} == wanted
        deadline = time.monotonic() + 90
        while {ref for _, ref in pulls_on(gpu)} != wanted:
            assert time.monotonic() < deadline, pulls_on(gpu)
            time.sleep(1)
        # pulled: pinned with the CRI's label alone (k3s clears its own pins at every start), and
        # the list removed, so a later start of k3s does not wait on it
        while gpu.ssh("ls /var/lib/rancher/k3s/agent/images/bootstrap-pull-*.txt", check=False).returncode == 0:
            assert time.monotonic() < deadline + 30, "the image list outlived its pulls"
            time.sleep(1)
        labels = {line.split("\t")[0]: line.split("\t")[-1]
                  for line in gpu.ssh("sudo k3s ctr -n k8s.io images ls").stdout.splitlines()[1:]}
        for ref in wanted:
            assert "io.cri-containerd.pinned=pinned" in labels[ref] and "io.cattle.k3s.pinned" not in labels[ref], ref
        active = float(gpu.ssh("date -d \"$(systemctl show -p ActiveEnterTimestamp --value k3s-agent)\" +%s").stdout)
        assert min(t for t, _ in pulls_on(gpu)) >= active - 1  # after k3s was up, not before
        assert wanted | {"nvcr.io/nvidia/pytorch:25.01-py3", "docker.io/rancher/mirrored-pause:3.6"} <= images_on(gpu)
    assert pulls_on(cp) == []
    assert "nvcr.io/nvidia/pytorch:25.01-py3" in images_on(cp)  # the air-gap archive, on every node
    first_pull = {gpu.name: min(t for t, _ in pulls_on(gpu)) for gpu in (g1, g2)}
    last_pull = {gpu.name: max(t for t, _ in pulls_on(gpu)) for gpu in (g1, g2)}
    assert max(first_pull.values()) < min(last_pull.values()), (first_pull, last_pull)  # overlapping: parallel

    again = run_bootstrap("up", inventory, "--hosts-only")
    assert again.returncode == 0 and "hosts: no change, 3 hosts already converged" in again.stdout, again.stdout

    # A new archive (.tgz, as k3s reads it) and an image list (.txt) in the air-gap folder:
    # k3s imports them itself while it runs (its watcher), the tool waits for it to say so;
    # k3s is not restarted and no `ctr images import` runs next to it.
    pid = {h.name: h.ssh("systemctl show -p MainPID --value k3s k3s-agent").stdout.split() for h in hosts}
    gzipped_image_archive(airgap / "more-images.tgz", ["docker.io/example/extra:2"])
    (airgap / "pull-list.txt").write_text("docker.io/example/listed:3\n")
    plan = run_bootstrap("plan", inventory)
    assert re.search(r"im-g1:\n(  - .*\n)*  - k3s imports images from more-images\.tgz, pull-list\.txt",
                     plan.stdout), plan.stdout
    added = run_bootstrap("up", inventory, "--hosts-only")
    assert added.returncode == 0, added.stdout + added.stderr
    for host in hosts:
        assert {"docker.io/example/extra:2", "docker.io/example/listed:3"} <= images_on(host)
        log = host.ssh("sudo journalctl -u k3s -u k3s-agent -o cat --no-pager").stdout
        assert "Imported images from /var/lib/rancher/k3s/agent/images/more-images.tgz in" in log
    assert pid == {h.name: h.ssh("systemctl show -p MainPID --value k3s k3s-agent").stdout.split() for h in hosts}


def test_a_second_up_on_gpu_nodes_with_the_labs_settings_changes_nothing(lab, tmp_path, airgap):
    """The lab's GPU settings (inventories/lab.yaml): a preinstalled driver, time-slicing, the
    toolkit from an apt repository that serves NVIDIA's 1.17 split (toolkit, -base,
    libnvidia-container-tools, as `testhosts.py up` serves it). The second `up` used to hold
    the two packages the first one's install brought: both GPU nodes "changed", every time."""
    from standins.aptrepo import AptRepo, build_toolkit_debs

    hosts = lab.start(["nc-cp", "nc-g1"], gpu=["nc-g1"])
    with AptRepo(build_toolkit_debs(tmp_path / "debs")) as repo:
        inventory = write_inventory(tmp_path / "inv.yaml", hosts, extra={
            "k3s": {"airgap": str(airgap)},
            "gpu": {"driver": "preinstalled", "cuda": "12.4", "sharing": {"time_slicing": {"replicas": 4}},
                    "container_toolkit": {"apt_source": repo.source_line}}})
        first = run_bootstrap("up", inventory, "--hosts-only")
        assert first.returncode == 0, first.stdout + first.stderr
        second = run_bootstrap("up", inventory, "--hosts-only")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "hosts: no change, 2 hosts already converged" in second.stdout, second.stdout
    held = hosts[1].ssh("apt-mark showhold", user="root").stdout.split()
    assert {"nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools"} <= set(held)
