#!/usr/bin/env bash
# Installs what the test suite drives for real, on a fresh Debian machine of the CI kind.
# Idempotent: each tool is installed only when missing.
set -euo pipefail

apt_packages=()
# The build of jemalloc, the operator's allocator (tikv-jemalloc-sys), runs make and a C compiler.
command -v make >/dev/null 2>&1 || apt_packages+=(make)
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc)
command -v nginx >/dev/null 2>&1 || apt_packages+=(nginx-light)
# promtool lints the /metrics exposition (Debian ships it in the prometheus package).
command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
# openssl makes the CA and certificate of the TLS tracing test.
command -v openssl >/dev/null 2>&1 || apt_packages+=(openssl)
# Graphviz's dot lays out the DOT output of `cdn-operator graph` (tests/graph.rs).
command -v dot >/dev/null 2>&1 || apt_packages+=(graphviz)
# The browser in which the Mermaid CLI renders `cdn-operator graph -o mermaid`: puppeteer's own
# browser download is out of reach, Debian's chromium is not.
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)

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

# The OTLP receiver the tracing test starts (../shared/tools/otlp_receiver.py).
if ! python3 -c 'import grpc, opentelemetry.proto' >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  # Debian's own python3 refuses system-wide installs (PEP 668) unless told otherwise.
  python3 -m pip install -q opentelemetry-proto grpcio 2>/dev/null \
    || python3 -m pip install -q --break-system-packages opentelemetry-proto grpcio
fi

# The Mermaid CLI (tests/graph.rs), pinned; it drives Debian's chromium, so puppeteer downloads none.
if ! command -v mmdc >/dev/null 2>&1; then
  PUPPETEER_SKIP_DOWNLOAD=1 npm install -g -q --no-audit --no-fund \
    @mermaid-js/mermaid-cli@11.12.0 puppeteer@23.11.1 >/dev/null
fi
