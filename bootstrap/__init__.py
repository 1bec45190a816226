"""bootstrap: rented GPU VMs to a validated GPU k3s cluster, over SSH."""

__version__ = "0.1.0"
