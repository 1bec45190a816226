"""One module per host component: what it puts on a host and how it takes it off again.

Each part owns its paths (and unit names, sysctls, packages), the probe's view of it, its
desired state, its plan actions and its teardown lines; `bootstrap.host.plan` composes the
parts into a host's plan, `bootstrap.host.facts.probe` into the one probe script and
`bootstrap.host.teardown` into `down`'s script. Deliberately empty: a part imports only the
parts it needs (`bootstrap.host.release` reads k3s_binary, which must not pull in the rest).
"""
