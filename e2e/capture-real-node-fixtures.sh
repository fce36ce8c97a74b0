#!/usr/bin/env bash
# Captures tests/fixtures/real-node/ from the cluster of KUBECONFIG, which needs a node (a kubelet
# with containerd, a scheduler): pods and Deployments that cannot run, as the kubelet, the
# scheduler and the Deployment controller write them, with the operator running in the namespace
# `fail41`. Each object as the server returns it (`kubectl get -o json --show-managed-fields`).
# The node e2e/node.sh makes has what it needs: its KUBECONFIG, the images
#   localhost/cdn-operator:e2e   the operator (the metrics sidecar of every CdnCluster pod),
#   localhost/cdn-e2e-pause:1    busybox, no nginx: the `crash` cluster's entrypoint fails,
#   localhost/cdn-nginx:1.30     nginx, for the `unschedulable` cluster (never pulled: no node fits),
#   localhost/cdn-nginx-root:1.30  the same nginx image run as root (`USER 0:0`), for `rootimage`.
# Run it on a fresh namespace after a change of the pods, then
# `cargo test --lib problems` and `cargo test --test cdncluster_reconcile --test at_reconcile`.
# usage: e2e/capture-real-node-fixtures.sh [path/to/cdn-operator]   (default: target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
operator=${1:-target/debug/cdn-operator}
ns=fail41
out=tests/fixtures/real-node
origin='[{"name": "o", "origin": {"url": "http://origin.example:8080"}}]'

if kubectl get namespace "$ns" >/dev/null 2>&1; then
  echo "namespace $ns exists: capture on a fresh namespace" >&2
  exit 1
fi
"$operator" crd | kubectl apply --server-side --field-manager=cdn-operator -f - >/dev/null
kubectl create namespace "$ns" >/dev/null
log=$(mktemp)
"$operator" run --leader-elect=false --namespace "$ns" \
  --nginx-metrics-image localhost/cdn-operator:e2e \
  --health-probe-bind-address 127.0.0.1:0 --metrics-bind-address 127.0.0.1:0 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT

cluster() { # name, then the spec's fields beyond role, replicas and sources
  kubectl -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: cluster.anevia.com/v1
kind: CdnCluster
metadata: {name: $1}
spec: {role: cache, replicas: 1, sources: $origin, $2}
YAML
}
cluster crash '"image": "localhost/cdn-e2e-pause:1"'
cluster nopull '"image": "localhost/does-not-exist:1.30"'
cluster rootimage '"image": "localhost/cdn-nginx-root:1.30"'
cluster unschedulable '"resources": {"requests": {"cpu": "64"}}'
kubectl -n "$ns" apply -f - >/dev/null <<'YAML'
apiVersion: cnat.programming-kubernetes.info/v1alpha1
kind: At
metadata: {name: at-nopull}
spec: {schedule: "2019-04-12T10:12:00Z", command: "echo hi", image: "localhost/does-not-exist:1"}
YAML

# The crash loop past a short progress deadline (the operator does not own the field).
kubectl -n "$ns" patch deployment crash-deployment --field-manager=kubectl-patch --type=merge \
  -p '{"spec": {"progressDeadlineSeconds": 15}}' >/dev/null

reason() { # pod label selector (or pod name) → the first waiting reason or the scheduling reason
  kubectl -n "$ns" get pods "$@" -o json | python3 -c '
import json, sys
pods = json.load(sys.stdin)
pods = pods.get("items", [pods])
for p in pods:
    s = p.get("status", {})
    for c in s.get("initContainerStatuses", []) + s.get("containerStatuses", []):
        w = c.get("state", {}).get("waiting", {}).get("reason")
        if w and w not in ("ContainerCreating", "PodInitializing"):
            print(w); sys.exit()
    for c in s.get("conditions", []):
        if c.get("reason") == "Unschedulable":
            print("Unschedulable"); sys.exit()
'
}
progressing() {
  kubectl -n "$ns" get deployment "$1" -o jsonpath='{.status.conditions[?(@.type=="Progressing")].reason}'
}
settled() {
  [ "$(reason -l deployment=crash-deployment)" = CrashLoopBackOff ] &&
    [ "$(progressing crash-deployment)" = ProgressDeadlineExceeded ] &&
    [ "$(reason -l deployment=nopull-deployment)" = ImagePullBackOff ] &&
    [ "$(reason -l deployment=rootimage-deployment)" = CreateContainerConfigError ] &&
    [ "$(reason -l deployment=unschedulable-deployment)" = Unschedulable ] &&
    [ "$(reason at-nopull-pod)" = ImagePullBackOff ]
}
for _ in $(seq 180); do settled && break; sleep 1; done
settled || { echo "not settled within 180 s; operator log:" >&2; cat "$log" >&2; exit 1; }
get() { kubectl -n "$ns" get "$1" "$2" -o json --show-managed-fields >"$out/$3.json"; }
# The pod of the Deployment of cluster $1 whose nginx container has terminationMessagePolicy $2.
pod_of() {
  kubectl -n "$ns" get pods -l "deployment=$1-deployment" -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    nginx = [c for c in p["spec"]["containers"] if c["name"] == "nginx"][0]
    if nginx.get("terminationMessagePolicy") == sys.argv[1]:
        print(p["metadata"]["name"]); break
' "$2"
}
[ -n "$(pod_of crash FallbackToLogsOnError)" ] ||
  { echo "the nginx container does not keep its last lines: an older operator?" >&2; exit 1; }
mkdir -p "$out"
get pod "$(pod_of crash FallbackToLogsOnError)" pod-crash-logs
for c in nopull rootimage unschedulable; do
  get cdncluster "$c" "cdncluster-$c"
  get deployment "$c-deployment" "deployment-$c"
  get pod "$(pod_of "$c" FallbackToLogsOnError)" "pod-$c"
done
get at at-nopull at-at-nopull
get pod at-nopull-pod pod-at-nopull

# The same crash loop as a kubelet reports it when the container does not keep its last lines
# (terminationMessagePolicy File, as before the operator set it): the operator stopped so that it
# does not restore its policy, the Deployment rolls a pod with the kubelet's default.
kill "$pid"
wait "$pid" 2>/dev/null || true
kubectl -n "$ns" patch deployment crash-deployment --field-manager=kubectl-patch \
  -p '{"spec":{"template":{"spec":{"containers":[{"name":"nginx","terminationMessagePolicy":"File"}]}}}}' >/dev/null
crashed_without_logs() {
  local pod
  pod=$(pod_of crash File)
  [ -n "$pod" ] && [ "$(reason "$pod")" = CrashLoopBackOff ] &&
    [ "$(progressing crash-deployment)" = ProgressDeadlineExceeded ]
}
for _ in $(seq 120); do crashed_without_logs && break; sleep 1; done
crashed_without_logs || { echo "the pod without its last lines did not crash-loop" >&2; exit 1; }
get cdncluster crash cdncluster-crash
get deployment crash-deployment deployment-crash
get pod "$(pod_of crash File)" pod-crash
echo "captured into $out"
