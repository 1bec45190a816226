"""The host side: what the tool learns of a host, decides for it and runs on it.

`facts` (the one-round-trip probe and its parsers), `parts` (one module per host
component: its files, probe, plan actions and teardown), `plan` (desired state against
the facts: each host's plan and the ordered steps), `release` (the k3s artifacts),
`images` (what GPU nodes pull), `teardown` (what `down` runs on a host).
"""
