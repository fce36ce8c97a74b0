#!/usr/bin/env bash
# Runs the operator against the cluster of KUBECONFIG (or ~/.kube/config): builds it, installs or
# upgrades the CRDs, then runs the controllers. Extra arguments go to `cdn-operator run`.
# Out of a cluster there is no pod namespace for the Lease: one process, no leader election.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release --locked
./target/release/cdn-operator crd | kubectl apply --server-side --field-manager=cdn-operator -f -
exec ./target/release/cdn-operator run --leader-elect=false "$@"
