"""The one remote layer: pyinfra through its public API for the hosts, paramiko (in
`sshlink` only) where pyinfra has none: the bastion hop, the API tunnel, the snapshot copy.
Flows see the hosts through `interface.Hosts`.
"""
