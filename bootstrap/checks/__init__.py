"""What must hold before anything changes, as pure rules over the inventory and the facts.

`preflight` runs the host checks (OS, disks, ports, GPUs, driver/CUDA, MIG, the machine
kind); the other modules are the rules it and the flows apply: k3s flags and versions,
GPU health, reachability between the nodes, node addresses, ownership of a host, and
what `rebuild` must remove, join or restore (`lost_nodes`).
"""
