#!/usr/bin/env bash
# Installs what the test suite drives for real, on a fresh Debian machine of the CI kind.
# Idempotent: each tool is installed only when missing.
set -euo pipefail

apt_packages=()
command -v nginx >/dev/null 2>&1 || apt_packages+=(nginx-light)

if [ ${#apt_packages[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
  # Debian starts nginx on port 80 after install; the tests start their own.
  (command -v systemctl >/dev/null && systemctl stop nginx) >/dev/null 2>&1 || true
  pkill -x nginx >/dev/null 2>&1 || true
fi

# The offline CRD validator of ../shared/tools needs these.
python3 -c 'import jsonschema, yaml' >/dev/null 2>&1 || python3 -m pip install -q jsonschema pyyaml
