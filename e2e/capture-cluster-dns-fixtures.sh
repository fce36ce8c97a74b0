#!/usr/bin/env bash
# Captures e2e/fixtures/cluster-dns/ (the EndpointSlices of cluster-dns's test) from the API server
# of KUBECONFIG: the seed's Services of tests/fixtures/real-server/ created again in the namespace
# `probe`, pods of theirs with the statuses a kubelet would write (ready, starting, terminating),
# and the slices the endpointslice controller makes of them, as the server returns them
# (`kubectl get -o json --show-managed-fields`).
#
# Needs a server with a kube-controller-manager running the endpointslice controller with
# `--max-endpoints-per-slice=2` (cache-live's four pods then make two slices), and NO kubelet:
# the pods are bound to a Node object this script creates, which no kubelet runs, and their
# statuses are written here. Run it on a fresh, disposable server.
# usage: e2e/capture-cluster-dns-fixtures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ns=probe
node=cdn-dns-fixture-node
out=e2e/fixtures/cluster-dns
real=tests/fixtures/real-server

if kubectl get namespace "$ns" >/dev/null 2>&1; then
  echo "namespace $ns exists: capture on a fresh server" >&2
  exit 1
fi
kubectl create namespace "$ns" >/dev/null
kubectl -n "$ns" create serviceaccount default >/dev/null 2>&1 || true
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $node}
EOF

# The Services as captured, less what the server assigns (a headless one keeps clusterIP None).
for service in balancer cache-live cache-vod; do
  python3 - "$real/service-$service.json" <<'PY' | kubectl apply -f - >/dev/null
import json, sys
svc = json.load(open(sys.argv[1]))
meta = svc["metadata"]
svc["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels")}
if svc["spec"]["clusterIP"] != "None":
    del svc["spec"]["clusterIP"], svc["spec"]["clusterIPs"]
svc.pop("status", None)
print(json.dumps(svc))
PY
done

# pod NAME DEPLOYMENT IP READY: a pod of the Deployment's pods, running at IP, Ready or not. A
# finalizer holds it, so that it can be shown terminating.
pod() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $ns, labels: {deployment: $2}, finalizers: [cdn-operator.anevia.com/fixture]}
spec:
  nodeName: $node
  automountServiceAccountToken: false
  containers: [{name: nginx, image: localhost/cdn-nginx:1.30, ports: [{name: http, containerPort: 8080, protocol: TCP}]}]
EOF
  kubectl -n "$ns" patch pod "$1" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Running\",
    \"podIP\":\"$3\",\"podIPs\":[{\"ip\":\"$3\"}],\"conditions\":[{\"type\":\"Ready\",\"status\":\"$4\"}]}}" >/dev/null
  sleep 2
}
pod balancer-deployment-5f8d6c9b77-p4w2j balancer-deployment 10.88.0.20 True
# cache-live: a ready pod and a starting one (first slice), a ready pod and one terminating.
pod cache-live-deployment-6b9f7c5d48-2lq8w cache-live-deployment 10.88.0.11 True
pod cache-live-deployment-6b9f7c5d48-9vz4k cache-live-deployment 10.88.0.12 False
pod cache-live-deployment-6b9f7c5d48-k7d2p cache-live-deployment 10.88.0.13 True
pod cache-live-deployment-6b9f7c5d48-x5m3n cache-live-deployment 10.88.0.14 True
kubectl -n "$ns" delete pod cache-live-deployment-6b9f7c5d48-x5m3n --wait=false >/dev/null
sleep 3

# The slice of SERVICE holding ADDRESS (the placeholder of a Service without pods: none), to FILE.
capture() {
  local name
  name=$(kubectl -n "$ns" get endpointslices -l "kubernetes.io/service-name=$1" -o json |
    python3 -c '
import json, sys
want = sys.argv[1]
for s in json.load(sys.stdin)["items"]:
    addresses = [a for e in s.get("endpoints") or [] for a in e["addresses"]]
    if want in addresses or (want == "none" and not addresses):
        print(s["metadata"]["name"])
' "$2")
  [ -n "$name" ] || { echo "no slice of $1 holds $2" >&2; exit 1; }
  kubectl -n "$ns" get endpointslice "$name" -o json --show-managed-fields >"$out/endpointslice-$3.json"
}
capture balancer 10.88.0.20 balancer
capture cache-live 10.88.0.11 cache-live-1
capture cache-live 10.88.0.13 cache-live-2
capture cache-vod none cache-vod
grep -q 10.88.0.12 "$out/endpointslice-cache-live-1.json" &&
  grep -q 10.88.0.14 "$out/endpointslice-cache-live-2.json" ||
  { echo "the pods were not sliced two by two in order: run again on a fresh server" >&2; exit 1; }

# Everything made here goes. No kubelet confirms a pod's end: the pods are deleted at once.
for p in $(kubectl -n "$ns" get pods -o name); do
  kubectl -n "$ns" patch "$p" --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
done
kubectl -n "$ns" delete pods --all --grace-period=0 --force >/dev/null 2>&1
kubectl delete namespace "$ns" --wait=false >/dev/null
kubectl delete node "$node" >/dev/null
echo "captured $out/"
