#!/usr/bin/env bash
# Captures tests/fixtures/real-server/ from the API server of KUBECONFIG (with a
# kube-controller-manager, no kubelet needed): the seed examples applied in the namespace `probe`
# with the operator running, each object as the server returns it (`kubectl get -o json
# --show-managed-fields`), then, with the operator stopped, the hand edits the tests restore.
# Run it on a fresh server after a change of the children, then `cargo test --test real_server`.
# usage: e2e/capture-real-server-fixtures.sh [path/to/cdn-operator]   (default: target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
operator=${1:-target/debug/cdn-operator}
ns=probe
out=tests/fixtures/real-server
seed=../shared/seed-examples

if kubectl get namespace "$ns" >/dev/null 2>&1; then
  echo "namespace $ns exists: capture on a fresh server" >&2
  exit 1
fi
"$operator" crd | kubectl apply --server-side --field-manager=cdn-operator -f - >/dev/null
kubectl create namespace "$ns" >/dev/null
log=$(mktemp)
"$operator" run --leader-elect=false --namespace "$ns" \
  --health-probe-bind-address 127.0.0.1:0 --metrics-bind-address 127.0.0.1:0 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

for f in cdncluster-balancer cdncluster-cache-live cdncluster-cache-vod at-example; do
  kubectl -n "$ns" apply -f "$seed/$f.yaml" >/dev/null
done

# Settled: every CdnCluster Deploying, every Deployment's status written for its generation,
# the At running its pod.
settled() {
  for c in balancer cache-live cache-vod; do
    [ "$(kubectl -n "$ns" get cdncluster "$c" -o jsonpath='{.status.state}')" = Deploying ] || return 1
    d=$(kubectl -n "$ns" get deployment "$c-deployment" \
      -o jsonpath='{.metadata.generation}/{.status.observedGeneration}' 2>/dev/null) || return 1
    [ "${d%/*}" = "${d#*/}" ] || return 1
  done
  [ "$(kubectl -n "$ns" get at example-at -o jsonpath='{.status.phase}')" = RUNNING ]
}
for _ in $(seq 60); do settled && break; sleep 1; done
settled || { echo "not settled within 60 s; operator log:" >&2; cat "$log" >&2; exit 1; }
sleep 2

get() { kubectl -n "$ns" get "$1" "$2" -o json --show-managed-fields >"$out/$3.json"; }
for c in balancer cache-live cache-vod; do
  get cdncluster "$c" "cdncluster-$c"
  get configmap "$c-nginx" "configmap-$c"
  get deployment "$c-deployment" "deployment-$c"
  get service "$c" "service-$c"
done
get at example-at at-example
get pod example-at-pod pod-example-at

# Hand edits, the operator stopped so that it does not restore them before they are captured.
kill "$pid"
wait "$pid" 2>/dev/null || true
kubectl -n "$ns" patch configmap cache-vod-nginx --field-manager=kubectl-edit --type=merge \
  -p '{"data":{"nginx.conf":"events {}\n"}}' >/dev/null
kubectl -n "$ns" patch deployment cache-vod-deployment --field-manager=kubectl-edit \
  -p '{"spec":{"template":{"spec":{"containers":[{"name":"nginx","image":"evil.example.com/nginx:latest","imagePullPolicy":"Always"}]}}}}' >/dev/null
kubectl -n "$ns" scale deployment cache-live-deployment --replicas=2 >/dev/null
sleep 2
get configmap cache-vod-nginx configmap-cache-vod-edited
get deployment cache-vod-deployment deployment-cache-vod-edited
get deployment cache-live-deployment deployment-cache-live-scaled
echo "captured into $out"
