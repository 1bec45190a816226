"""Write an inventory for test hosts, with a state folder private to the test."""

from pathlib import Path

import yaml

import testhosts


def write_inventory(path: Path, hosts, *, servers=1, extra: dict | None = None, cluster="lab-test",
                    node_extra: dict | None = None) -> Path:
    """The first `servers` hosts are servers, the rest agents. `extra` merges top-level keys."""
    nodes = []
    for index, host in enumerate(hosts):
        node = {"name": host.name, "address": host.address, "role": "server" if index < servers else "agent"}
        node.update((node_extra or {}).get(host.name, {}))
        nodes.append(node)
    data = {
        "cluster": cluster,
        "state_dir": str(path.parent / "state"),
        "ssh": {"user": testhosts.SSH_USER, "key": str(testhosts.key_path()), "sudo": True, "connect_timeout": 5},
        "nodes": nodes,
    }
    if "charts" not in (extra or {}):
        # Charts as an air-gapped user supplies them: the real Helm installs the lab's chart
        # archives (nothing can be downloaded here).
        from labcharts import lab_charts

        data["charts"] = lab_charts(testhosts.LAB_DIR / "charts")
    data.update(extra or {})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
