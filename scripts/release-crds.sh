#!/usr/bin/env bash
# Freezes the CRDs of a release: copies the shipped CRDs (kustomize/base/crds/, which
# tests/shipped_artifacts.rs keeps equal to `cdn-operator crd`) into
# tests/fixtures/released-crds/VERSION/. tests/crd_compat.rs then requires every later CRD to
# accept every object these accept, and the e2e upgrade test installs the newest copy before the
# current CRDs. Run once per release, at the release commit (docs/releasing-crds.md).
# usage: scripts/release-crds.sh VERSION   (default: the version of Cargo.toml)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)}
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "release-crds: '$version' is not a semantic version (MAJOR.MINOR.PATCH)" >&2
  exit 2
fi
dest=tests/fixtures/released-crds/$version
# A released copy is history: never overwritten (a wrong one is removed by hand, in review).
if [ -e "$dest" ]; then
  echo "release-crds: $dest exists already; the CRDs of a release are not rewritten" >&2
  exit 1
fi
shopt -s nullglob
crds=(kustomize/base/crds/*_*.yaml)
if [ "${#crds[@]}" -eq 0 ]; then
  echo "release-crds: no CRDs in kustomize/base/crds/ (run scripts/sync-crds.sh)" >&2
  exit 1
fi
mkdir -p "$dest"
cp "${crds[@]}" "$dest/"
for f in "$dest"/*.yaml; do echo "released $f"; done
