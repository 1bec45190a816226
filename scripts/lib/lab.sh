# The lab as scripts/try-lab and scripts/try-lab-down use it. Sourced (bash) after install.sh.
# shellcheck shell=bash

INVENTORY=inventories/lab.yaml
NODES=(cp-1 gpu-1 gpu-2)
CONTEXT=bootstrap-lab  # bootstrap-<cluster>: what `bootstrap kubeconfig --merge` writes (cluster, user, context)

# Whether the lab's machines already run: `testhosts.py up` would boot new machines in their
# place (as for a spot loss), whose new host keys `bootstrap up` rightly refuses.
lab_running() {
  "$VENV/bin/python" - "${NODES[@]}" <<'PY'
import sys
sys.path.insert(0, "tests")
import testhosts
running = {host.name for host in testhosts.known_hosts() if host.is_running()}
sys.exit(0 if set(sys.argv[1:]) <= running else 1)
PY
}

# What pointed at the lab's earlier machines: their pinned host keys, and the kubeconfig entries
# `kubeconfig --merge` wrote for that cluster (a new cluster of the same name is refused there).
forget_old_lab() {
  "$VENV/bin/bootstrap" forget-host "$INVENTORY" "${NODES[@]}"
  if command -v kubectl >/dev/null 2>&1; then
    if [ "$(kubectl config current-context 2>/dev/null)" = "$CONTEXT" ]; then
      kubectl config unset current-context >/dev/null 2>&1 || true
    fi
    kubectl config delete-context "$CONTEXT" >/dev/null 2>&1 || true
    kubectl config delete-cluster "$CONTEXT" >/dev/null 2>&1 || true
    kubectl config delete-user "$CONTEXT" >/dev/null 2>&1 || true
  fi
}
