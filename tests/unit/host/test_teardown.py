"""What `down` runs on a host to stop k3s (bootstrap.host.parts.k3s_service.teardown_stop): its
awk and shell pieces run here on made-up `ps` listings, mount tables and folders, with the
system's awk (mawk on Debian and Ubuntu, as on the hosts). Nothing here kills, unmounts or
removes anything of this machine's."""

import re
import shutil
import subprocess

import pytest

from bootstrap.host.parts import k3s_service
from bootstrap.host.teardown import teardown_script

AWK = shutil.which("mawk") or shutil.which("awk")
pytestmark = pytest.mark.skipif(AWK is None, reason="no awk on this machine")
LINES = k3s_service.teardown_stop()

# pid ppid comm args, as `ps -e -o pid= -o ppid= -o comm= -o args=` prints them. 201 runs the
# teardown (sudo 200 -> sh 201): both command lines carry the shim path, neither is k3s's.
PS = """\
    1     0 systemd         /sbin/init
  100     1 sshd            sshd: ubuntu [priv]
  200   100 sudo            sudo -H -n sh -c pids=$(ps | awk /var/lib/rancher/k3s/data/abc/bin/containerd-shim-runc-v2
  201   200 sh              sh -c pids=$(ps | awk /var/lib/rancher/k3s/data/abc/bin/containerd-shim-runc-v2
  202   201 sh              sh -c pids=$(ps | awk
  203   202 awk             awk -v self=201 -v names=^(k3s|k3s-server|k3s-agent)$
  300     1 k3s-server      /usr/local/bin/k3s server
  301   300 containerd      /var/lib/rancher/k3s/data/abc/bin/containerd -c config.toml
  400     1 containerd-shim /var/lib/rancher/k3s/data/abc/bin/containerd-shim-runc-v2 -namespace k8s.io -id 1
  401   400 pause           /pause
  402   400 python3         python3 train.py
  403   402 python3         python3 -m torch.distributed.run
  404   403 nvidia-smi      nvidia-smi dmon
  500     1 python3         /usr/bin/python3 /var/lib/rancher/k3s/data/abc/bin/containerd-shim-runc-v2 -id 2
  501   500 sleep           standin-pod-worker infinity
  600     1 k3s             /usr/local/bin/k3s etcd-snapshot save
  700     1 cron            /usr/sbin/cron
  701   700 sh              sh -c /usr/local/bin/backup /var/lib/rancher/k3s/server/db/snapshots
  800     1 containerd      /usr/bin/containerd
"""


def line(prefix: str) -> str:
    (found,) = [x for x in LINES if x.startswith(prefix)]
    return found


def awk(program: str, text: str, **variables) -> list[str]:
    args = [AWK] + [a for k, v in variables.items() for a in ("-v", f"{k}={v}")] + [program]
    return subprocess.run(args, input=text, capture_output=True, text=True, check=True).stdout.split()


def test_every_k3s_process_and_shim_goes_with_its_whole_tree_never_the_script_itself():
    pids = line("pids=$(ps ")
    found = re.search(r"awk -v self=\$\$ -v names='([^']*)' -v shims='([^']*)' '(.*?)'; ", pids, re.S)
    names, shims, program = found.groups()
    killed = sorted(map(int, awk(program, PS, self="201", names=names, shims=shims)))
    # k3s (server and a stray CLI call), containerd, both shims and every process under them;
    # not the teardown's own sudo/sh (their command lines match), cron's job, or a host containerd.
    assert killed == [300, 301, 400, 401, 402, 403, 404, 500, 501, 600]
    # the pods a dead shim left to PID 1 are found by their kubepods cgroups
    assert "find /sys/fs/cgroup -path '*kubepods*' -name cgroup.procs" in pids


MOUNTS = """\
/dev/vda1 / ext4 rw 0 0
/dev/vdb /var/lib/rancher/k3s ext4 rw 0 0
overlay /run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs overlay rw 0 0
tmpfs /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache tmpfs rw 0 0
10.0.0.5:/share /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount nfs4 rw 0 0
tmpfs /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount/sub tmpfs rw 0 0
nsfs /run/netns/cni-1234 nsfs rw 0 0
nsfs /run/netns/other nsfs rw 0 0
tmpfs /var/lib/kubeletfoo tmpfs rw 0 0
/dev/vdc /data ext4 rw 0 0
"""


def mounts_program(text: str) -> tuple[str, str]:
    found = re.search(r"awk -v below='([^']*)' '([^']*)' /proc/self/mounts", text)
    return found[1], found[2]


def test_what_k3s_mounted_is_unmounted_deepest_first_but_not_a_disk_mounted_at_its_folder():
    unmount = line("for m in $(awk ")
    below, program = mounts_program(unmount)
    chosen = awk(program, MOUNTS, below=below)
    assert sorted(chosen, reverse=True) == [
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache",
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount/sub",
        "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount",
        "/run/netns/cni-1234",
        "/run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs"]
    assert "| sort -r); do umount -f \"$m\" 2>/dev/null || umount -l \"$m\"" in unmount


def test_a_mount_left_below_k3s_folders_stops_the_script_before_anything_is_removed(tmp_path):
    check = [x for x in LINES if x.startswith(("left=$(awk", "if [ -n \"$left\" ]"))]
    assert len(check) == 2
    script = "\n".join(check).replace("/proc/self/mounts", str(tmp_path / "mounts")) + "\necho went on\n"
    (tmp_path / "mounts").write_text(MOUNTS)
    stuck = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert stuck.returncode == 1 and "went on" not in stuck.stdout
    assert "still mounted, so nothing was removed: /run/k3s/containerd/" in stuck.stderr
    (tmp_path / "mounts").write_text("/dev/vda1 / ext4 rw 0 0\n/dev/vdb /var/lib/rancher/k3s ext4 rw 0 0\n")
    clear = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert clear.returncode == 0 and clear.stdout == "went on\n"


def test_a_folder_that_is_a_mount_point_is_emptied_and_kept_the_others_removed(tmp_path):
    remove = line("for d in ")
    disk, plain = tmp_path / "disk", tmp_path / "plain"
    for folder in (disk, plain):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "file").write_text("x")
        (folder / ".hidden").write_text("x")
    (tmp_path / "mounts").write_text(f"/dev/vdb {disk} ext4 rw 0 0\n")
    folders = " ".join(k3s_service.DATA_DIRS)
    assert remove.startswith(f"for d in {folders}; do ")
    script = remove.replace(folders, f"{disk} {plain}", 1).replace("/proc/self/mounts", str(tmp_path / "mounts"))
    subprocess.run(["sh", "-c", script], check=True)
    assert disk.is_dir() and list(disk.iterdir()) == []
    assert not plain.exists()


def test_the_order_is_k3s_killall_then_k3s_uninstall():
    script = teardown_script({}, purge_drivers=False)

    def at(text):
        assert text in script, text
        return script.index(text)

    steps = ["systemctl stop $u", "kill -9 $pids", "umount -f", "still mounted", "ip netns delete",
             "ip -o link show master cni0", "ip link delete $l", "$t-save", "rm -rf \"$d\"",
             "rm -f ", "systemctl daemon-reload", "systemctl reset-failed k3s.service k3s-agent.service"]
    assert [at(s) for s in steps] == sorted(at(s) for s in steps)
    # killed processes are waited for before their mounts are touched
    assert at("[ -d /proc/$p ]") < at("umount -f")


def test_scale_down_stops_and_disables_k3s_and_fails_when_it_still_runs():
    plain, checked = k3s_service.stop_service(), k3s_service.stop_service(check=True)
    assert checked[0] == plain[0] and "systemctl disable $u" in plain[0]
    assert checked[1].startswith("if systemctl is-active --quiet k3s.service k3s-agent.service; then")
    assert "exit 1" in checked[1]
