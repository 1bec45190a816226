"""The state folder on the operator's machine: its layout and secrets (0600, written
atomically), the cluster lock, and the etcd snapshots with the tokens they need.
"""
