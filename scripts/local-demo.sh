#!/usr/bin/env bash
# The CDN working on this machine, in one command (what ./run.sh does when no cluster answers and
# KUBE_BIN is set): brings up the one-node cluster of e2e/node.sh (root; a few minutes the first
# time), installs the operator from its image with the Helm chart, applies examples/demo.yaml (an
# origin, a cache of two pods, a balancer of two) and prints the URL through which the CDN answers.
# Run again, it reuses what is up. `e2e/node.sh down` takes everything down.
#
#   KUBE_BIN=DIR scripts/local-demo.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
NODE_DIR=${NODE_DIR:-/var/tmp/cdn-operator-node}
NAMESPACE=cdn-demo
RELEASE=cdn-operator
# The images e2e/node.sh builds and imports into the node's containerd.
OPERATOR_IMAGE=localhost/cdn-operator:e2e
NGINX_IMAGE=localhost/cdn-nginx:1.30
TOOLS=${CDN_TOOLS:-$HOME/.cache/cdn-operator-tools}

say() { echo "local-demo: $*" >&2; }
[[ $(id -u) -eq 0 ]] || { say "the local cluster needs root (network, containerd, kubelet): run as root"; exit 1; }

export KUBECONFIG=$NODE_DIR/admin.kubeconfig
if [[ -f $KUBECONFIG ]] && kubectl get --raw=/readyz --request-timeout=5s >/dev/null 2>&1; then
  say "the local cluster of e2e/node.sh is up: reusing it"
else
  say "bringing up the local cluster of e2e/node.sh (a few minutes the first time)"
  "$repo/e2e/node.sh" up
fi

helm=$(command -v helm || echo "$TOOLS/bin/helm")
[[ -x $helm ]] || bash "$repo/scripts/install-helm.sh" "$TOOLS"
say "installing the operator ($OPERATOR_IMAGE) with the chart, release $RELEASE in $RELEASE"
# Strings as strings: a tag such as 1.30 would be a number to --set.
# --take-ownership: CRDs another release (a node test's) installed are adopted, not refused.
"$helm" upgrade --install "$RELEASE" "$repo/helm/cdn-operator" --namespace "$RELEASE" \
  --create-namespace --take-ownership --wait --timeout 5m \
  --set-string image.registry=localhost --set-string image.repository=cdn-operator \
  --set-string image.tag=e2e --set-string image.pullPolicy=IfNotPresent \
  --set-string managedPods.image="$NGINX_IMAGE" >/dev/null

say "applying examples/demo.yaml in namespace $NAMESPACE (its origin on the node's nginx image)"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# The node reaches no registry: the origin runs the nginx image already in its containerd.
sed "s#image: docker.io/nginxinc/nginx-unprivileged:1.30-alpine#image: $NGINX_IMAGE#" \
  "$repo/examples/demo.yaml" | kubectl apply -n "$NAMESPACE" --server-side -f - >/dev/null
for cluster in cache-vod edge; do
  kubectl wait -n "$NAMESPACE" "cdncluster/$cluster" --for=jsonpath='{.status.state}'=Running \
    --timeout=300s >/dev/null
done
edge=$(kubectl get -n "$NAMESPACE" service edge -o jsonpath='{.spec.clusterIP}')
url=http://$edge/vod/demo/index.m3u8
# The balancer looks its caches up every 5 s: the first answer within seconds of Running.
for _ in $(seq 1 60); do
  curl -sf -o /dev/null "$url" && break
  sleep 1
done
kubectl get -n "$NAMESPACE" cdn
cat <<EOF

The CDN answers at $url (the balancer's Service, routed to this host by e2e/node.sh):

  curl -si $url          # X-Cache-Status: HIT (this script's own request was the MISS)
  curl -si ${url%/*}/seg-1.ts    # MISS the first time, then HIT
  export KUBECONFIG=$KUBECONFIG
  kubectl get cdn -n $NAMESPACE

Take it all down with: e2e/node.sh down
EOF
