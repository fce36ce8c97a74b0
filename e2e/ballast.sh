#!/bin/bash
# Fills the cluster of KUBECONFIG with what 9,000 more CdnClusters would make it hold, without
# the operator seeing any of it: the ConfigMaps, Services and Deployments `cdn-operator render`
# prints for the benchmark's topology (per group of ten, one balancer routing to nine caches),
# labelled `app.kubernetes.io/managed-by: ballast` instead of the operator's label, so that the
# operator's watches (which select its label) neither list nor receive them. The
# controller-manager then makes their ReplicaSets and pods, as it does for the operator's.
#
# Why: the benchmark's CPU at 10,000 CdnClusters grows faster than the work, and both the
# operator and the benchmark process (which does the same work per CdnCluster at both sizes)
# grow alike. A 1,000 run on a server holding this ballast tells whether the growth is the
# operator's own caches (then the CPU stays as on an empty server) or the server's size.
#
# With `cdnclusters`, it creates the CdnClusters themselves instead, for an operator running
# meanwhile to converge (the script waits until every status is written): stopped, then the
# benchmark's, it holds them in its caches while it converges the benchmark's 1,000, which
# tells the operator's caches apart from its queue (all 10,000 queued at once in a 10,000 run).
#
# Usage: KUBECONFIG=… e2e/ballast.sh children|cdnclusters [namespaces] [per-namespace]
# (default 9 × 1,000), then the benchmark as usual, without a fresh server. Removal: delete the
# namespaces `ballast-*`.
set -euo pipefail
mode=${1:-}
case $mode in
  children | cdnclusters) ;;
  *)
    echo "usage: e2e/ballast.sh children|cdnclusters [namespaces] [per-namespace]" >&2
    exit 2
    ;;
esac
namespaces=${2:-9}
per_namespace=${3:-1000}
operator=${CDN_OPERATOR_BIN:-target/release/cdn-operator}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The benchmark's CdnCluster i (e2e/src/bin/bench.rs, `manifest`), in namespace $1.
manifests() {
  local ns=$1 i group
  for ((i = 0; i < per_namespace; i++)); do
    group=$((i / 10))
    echo "---"
    if ((i % 10 == 0)); then
      printf 'apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata:\n  name: b%d\n  namespace: %s\nspec:\n  role: balancer\n  replicas: 1\n  sources:\n' "$group" "$ns"
      for k in 1 2 3 4 5 6 7 8 9; do
        printf '    - name: c%d-%d\n      pathCondition: "^/c%d/"\n' "$group" "$k" "$k"
      done
    else
      printf 'apiVersion: cluster.anevia.com/v1\nkind: CdnCluster\nmetadata:\n  name: c%d-%d\n  namespace: %s\nspec:\n  role: cache\n  replicas: 1\n  sources:\n    - name: origin\n      origin:\n        url: http://origin-%d.example.com:8080/media\n' "$group" "$((i % 10))" "$ns" "$group"
    fi
  done
}

if [ "$mode" = cdnclusters ]; then
  "$operator" crd | kubectl apply --server-side -f -
  kubectl wait --for condition=Established crd/cdnclusters.cluster.anevia.com
fi
for ((n = 0; n < namespaces; n++)); do
  ns=ballast-$n
  manifests "$ns" > "$work/cdn-$n.yaml"
  if [ "$mode" = cdnclusters ]; then
    kubectl create namespace "$ns"
    cp "$work/cdn-$n.yaml" "$work/children-$n.yaml"
    continue
  fi
  "$operator" render -f "$work/cdn-$n.yaml" |
    sed 's|app.kubernetes.io/managed-by: cdn-operator|app.kubernetes.io/managed-by: ballast|' > "$work/children-$n.yaml"
  if grep -q 'managed-by: cdn-operator' "$work/children-$n.yaml"; then
    echo "ballast: the operator's label is still in $ns's objects" >&2
    exit 1
  fi
  kubectl create namespace "$ns"
done
# Three kubectl processes at a time: each creates its objects one by one.
for ((n = 0; n < namespaces; n++)); do
  kubectl create -f "$work/children-$n.yaml" > /dev/null &
  if ((n % 3 == 2)); then wait; fi
done
wait

want=$((namespaces * per_namespace))
if [ "$mode" = cdnclusters ]; then
  while true; do
    # A status is written once the operator reconciled the CdnCluster's generation.
    done_=$(kubectl get cdnclusters -A -o jsonpath='{range .items[?(@.status.observedGeneration)]}{.metadata.name}{"\n"}{end}' |
      grep -c . || true)
    echo "ballast: $(date +%T) $done_ of $want CdnClusters with a status"
    if ((done_ >= want)); then exit 0; fi
    sleep 20
  done
fi
while true; do
  rs=$(kubectl get replicasets -A -l app.kubernetes.io/managed-by=ballast --no-headers | wc -l)
  pods=$(kubectl get pods -A -l app.kubernetes.io/managed-by=ballast --no-headers | wc -l)
  echo "ballast: $(date +%T) $rs of $want ReplicaSets, $pods pods"
  if ((rs >= want && pods >= want)); then break; fi
  sleep 20
done
