"""The ports validate's NCCL job uses between the GPU nodes it measures. Pure data: the job
(bootstrap.cluster.checks) pins them, the reachability check (bootstrap.checks.reachability)
probes them before any host changes, the README and inventories/multi-provider.yaml name them.

The workers run in the host's network, so every one of these is node-ip to node-ip:
- the workers' sshd, which mpirun's launcher reaches (the host's own sshd holds 22);
- Open MPI's out-of-band (mpirun and its orted daemons, `oob_tcp_dynamic_ipv4_ports`) and its
  TCP transport between the ranks (`btl_tcp_port_min_v4`, `btl_tcp_port_range_v4`), pinned
  to one block next to sshd's port (open-mpi/ompi v4.1.7 orte/mca/oob/tcp/oob_tcp_component.c,
  opal/mca/btl/tcp/btl_tcp_component.c: the Open MPI 4.1 of the image's HPC-X);
- NCCL's own sockets (bootstrap, proxy, socket transport), which NCCL cannot pin: it binds
  port 0 (NVIDIA/nccl v2.21.5-1 src/misc/socket.cc, ncclSocketListen: "addr port should be 0
  (Any port)"), so the kernel picks from its ephemeral range, net.ipv4.ip_local_port_range,
  32768-60999 unless changed (Linux net/ipv4/af_inet.c, inet_init_net). A host-network pod
  cannot set that sysctl for itself (the kubelet refuses net.* sysctls with hostNetwork).
"""

from __future__ import annotations

SSH_PORT = 12022
OOB_PORTS = (12030, 12061)  # first, last: mpirun takes them all in its own pod, an orted one
BTL_PORT_MIN, BTL_PORT_RANGE = 12070, 64  # one port per rank and node: up to 64 ranks a node
PINNED = (SSH_PORT, BTL_PORT_MIN + BTL_PORT_RANGE - 1)  # one block to open: 12022-12133
EPHEMERAL = (32768, 60999)  # the kernel's default ip_local_port_range, where NCCL's sockets land


def span(ports: tuple[int, int]) -> str:
    return f"{ports[0]}-{ports[1]}"
