#!/usr/bin/env bash
# Runs the operator against the cluster of KUBECONFIG (or ~/.kube/config): builds it, installs or
# upgrades the CRDs, then runs the controllers. Extra arguments go to `cdn-operator run`.
# Out of a cluster there is no pod namespace for the Lease: one process, no leader election.
# When no cluster answers: with KUBE_BIN (Kubernetes v1.36's binaries), scripts/local-demo.sh
# brings up a local one and shows the CDN working; without it, what is missing and what runs
# offline.
set -euo pipefail
cd "$(dirname "$0")"
tools=$HOME/.cache/cdn-operator-tools
if ! command -v kubectl >/dev/null; then
  if [[ ! -x $tools/bin/kubectl ]]; then
    echo "run.sh: kubectl is not installed: fetching it into $tools/bin (scripts/install-helm.sh)" >&2
    bash scripts/install-helm.sh "$tools"
  fi
  PATH=$tools/bin:$PATH
fi
if ! kubectl get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; then
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null || true)
  if [[ -n ${KUBE_BIN:-} ]]; then
    echo "run.sh: no cluster answers${server:+ at $server}; KUBE_BIN is set: bringing up a local one (scripts/local-demo.sh)" >&2
    exec bash scripts/local-demo.sh
  fi
  cat >&2 <<MESSAGE
run.sh: no Kubernetes API server answers (KUBECONFIG: ${KUBECONFIG:-~/.kube/config}${server:+, server $server}).
  - Point KUBECONFIG at a cluster (kind, minikube, k3s, a real one) and run ./run.sh again; or
  - set KUBE_BIN to a folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    kubelet and kube-proxy of Kubernetes v1.36 (docs/testing.md#a-cluster-with-a-node-e2enodesh says how to
    build them) and run ./run.sh as root: it brings up a one-node cluster here, installs the
    operator and an example CDN with its origin (examples/demo.yaml), and prints the URL it
    answers on.
Without a cluster, what the operator would deploy:
  cargo run --release -- render -f examples/topology.yaml   # each CdnCluster's children and nginx.conf
  cargo run --release -- graph -f examples/topology.yaml    # balancers -> caches -> origins
MESSAGE
  exit 1
fi
cargo build --release --locked
./target/release/cdn-operator crd | kubectl apply --server-side --field-manager=cdn-operator -f -
exec ./target/release/cdn-operator run --leader-elect=false "$@"
