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
# namespaces `ballast-*`. Needs the release builds of the operator and of the benchmark
# (CDN_OPERATOR_BIN, CDN_BENCH_BIN), which prints the CdnClusters.
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
bench=${CDN_BENCH_BIN:-target/release/bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The benchmark's topology, its group g in namespace ballast-(g mod namespaces).
"$bench" --print-manifests ballast --clusters $((namespaces * per_namespace)) \
  --namespaces "$namespaces" > "$work/cdnclusters.yaml"
if [ "$mode" = cdnclusters ]; then
  "$operator" crd | kubectl apply --server-side -f -
  kubectl wait --for condition=Established crd/cdnclusters.cluster.anevia.com
  objects=$work/cdnclusters.yaml
else
  objects=$work/children.yaml
  "$operator" render -f "$work/cdnclusters.yaml" |
    sed 's|app.kubernetes.io/managed-by: cdn-operator|app.kubernetes.io/managed-by: ballast|' > "$objects"
  if grep -q 'managed-by: cdn-operator' "$objects"; then
    echo "ballast: the operator's label is still in the objects" >&2
    exit 1
  fi
fi
for ((n = 0; n < namespaces; n++)); do
  kubectl create namespace "ballast-$n"
done
# Three kubectl processes, each creating a third of the objects one by one.
awk -v dir="$work" '/^---$/ { n++ } { print > (dir "/part-" (n % 3) ".yaml") }' "$objects"
creating=()
for part in "$work"/part-*.yaml; do
  kubectl create -f "$part" > /dev/null &
  creating+=($!)
done
for pid in "${creating[@]}"; do wait "$pid"; done

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
