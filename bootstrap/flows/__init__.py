"""The pipelines behind the commands, one module each: the host phase, the cluster side,
repair (`rebuild`), teardown (`down`, `scale-down`). Commands parse arguments and call one
flow; flows call the pure planners and the I/O edges (hosts, cluster, state folder)."""
