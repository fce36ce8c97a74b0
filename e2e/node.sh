#!/usr/bin/env bash
# The e2e suite on a cluster with a node, built on this machine: a local v1.36 control plane, a
# kubelet with containerd and a CNI bridge, kube-proxy and a cluster DNS, the operator's image and
# an nginx 1.30 image (and the same run as root) imported into containerd; then the node tests
# (e2e/tests/node.rs, rollouts.rs, persistent_caches.rs, monitoring.rs), then everything taken
# down and the machine put back as it was. persistent_caches.rs and monitoring.rs make hostPath
# volumes under $NODE_DIR/volumes (monitoring.rs a small tmpfs there too); monitoring.rs runs
# Debian's Prometheus and Alertmanager, installed by `test` when missing.
#
#   KUBE_BIN=DIR e2e/node.sh          set up, run the node tests, tear down (the proof of issue 39)
#   KUBE_BIN=DIR e2e/node.sh up       set up only; prints the KUBECONFIG to use
#   e2e/node.sh test                  run the node tests against what `up` started
#   e2e/node.sh test monitoring       only those named (node, rollouts, persistent_caches,
#                                     monitoring); cargo test's arguments after `--`
#   e2e/node.sh down                  tear down what `up` started
#
# KUBE_BIN: a folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy of Kubernetes v1.36 (none is in a registry reachable here: build them from the
# vendored tree of openshift/microshift, docs/testing.md#a-cluster-with-a-node). Everything else
# comes from Debian: containerd 2.1 (unstable, unpacked into the state folder), runc and the CNI
# plugins (stable, installed), mmdebstrap and buildah for the images.
#
# Network: only addresses this script makes. A bridge (cdne2e0, 10.88.0.1/16) for the pods, the
# API server, kubelet and cluster DNS bound on its host address 10.88.0.1, Services (10.96.0.0/16)
# routed to it; NodePorts only on 10.88.0.1. Nothing listens on the machine's own address. The
# pods have routes to the pod and Service networks only. The loopback ports (etcd 23790, the
# controllers 20257 and 20259, kubelet 20248, kube-proxy 20249 and 20256) are not the usual ones:
# a control plane already running here is left alone.
# State (certificates, logs, containerd's root, the node's images): NODE_DIR, outside the
# repository (default /var/tmp/cdn-operator-node). `down` stops every process by the pid `up`
# recorded, removes the containers, mounts and the bridge, and restores the iptables rules and the
# sysctls saved before.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
NODE_DIR=${NODE_DIR:-/var/tmp/cdn-operator-node}
BRIDGE=cdne2e0
HOST_IP=10.88.0.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/16
NODE_NAME=cdn-e2e-node
OPERATOR_IMAGE=localhost/cdn-operator:e2e
NGINX_IMAGE=localhost/cdn-nginx:1.30
PAUSE_IMAGE=localhost/cdn-e2e-pause:1
ROOT_IMAGE=localhost/cdn-nginx-root:1.30
CONTAINERD_VERSION=2.1.9
PKI=$NODE_DIR/pki LOGS=$NODE_DIR/logs RUN=$NODE_DIR/run
CTR_SOCK=$NODE_DIR/containerd/containerd.sock
export KUBECONFIG=$NODE_DIR/admin.kubeconfig
# The sysctls kubelet, kube-proxy and the bridge plugin set, restored by `down`.
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)

say() { echo "node.sh: $*" >&2; }
die() { say "$*"; exit 1; }

waitfor() { # what seconds cmd...: also fails as soon as a process started here has exited
  local what=$1 secs=$2 f; shift 2
  for ((i = 0; i < secs * 5; i++)); do
    for f in "$RUN"/*.pid; do
      [[ -f $f ]] || continue
      kill -0 "$(cat "$f")" 2>/dev/null || die "$(basename "$f" .pid) exited; see $LOGS/$(basename "$f" .pid).log"
    done
    if "$@" >/dev/null 2>&1; then say "$what is ready"; return 0; fi
    sleep 0.2
  done
  die "$what did not become ready in ${secs}s; see $LOGS"
}

start() { # name cmd...: a background process, its pid recorded for `down`
  local name=$1; shift
  setsid nohup "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  say "started $name (pid $!), log $LOGS/$name.log"
}

stop() { # name: SIGTERM, then SIGKILL after 20 s
  local f=$RUN/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; say "killed $1 ($pid)"; else say "stopped $1 ($pid)"; fi
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------- packages
install_packages() {
  local need=()
  command -v runc >/dev/null || need+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  command -v buildah >/dev/null || need+=(buildah)
  command -v iptables >/dev/null || need+=(iptables)
  command -v nft >/dev/null || need+=(nftables)
  command -v openssl >/dev/null || need+=(openssl)
  if ((${#need[@]})); then
    say "installing ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  # containerd 2.1 is only in Debian unstable, whose libc this machine's meets: downloaded with a
  # private apt state (the machine's sources are left alone) and unpacked, not installed. The
  # mirror's unstable index is a snapshot past its Valid-Until date.
  if [[ ! -x $NODE_DIR/containerd-root/usr/bin/containerd ]]; then
    local apt=$NODE_DIR/apt
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" >"$apt/sid.list"
    local opts=(-o Dir::Etc::sourcelist="$apt/sid.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$apt/lists"
      -o Dir::Cache="$apt/cache" -o Acquire::Check-Valid-Until=false -o APT::Sandbox::User=root)
    apt-get "${opts[@]}" update -qq
    (cd "$apt/debs" && apt-get "${opts[@]}" download "containerd=$CONTAINERD_VERSION*" >/dev/null)
    dpkg -x "$apt"/debs/containerd_*.deb "$NODE_DIR/containerd-root"
  fi
  "$NODE_DIR/containerd-root/usr/bin/containerd" --version | grep -q " v\?2\.1\." ||
    die "containerd 2.1 expected in $NODE_DIR/containerd-root"
}

# ---------------------------------------------------------------- certificates
certificates() {
  mkdir -p "$PKI"
  cd "$PKI"
  mkca() { [[ -f $1.crt ]] && return 0
    openssl genrsa -out "$1.key" 2048 2>/dev/null
    openssl req -x509 -new -nodes -key "$1.key" -sha256 -days 3650 -subj "/CN=$2" -out "$1.crt" 2>/dev/null; }
  sign() { # name ca subject extensions
    [[ -f $1.crt ]] && return 0
    openssl genrsa -out "$1.key" 2048 2>/dev/null
    openssl req -new -key "$1.key" -subj "$3" -out "$1.csr" 2>/dev/null
    printf '%s\n' "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 3650 -sha256 \
      -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"; }
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  mkca ca cdn-e2e-ca
  mkca front-proxy-ca cdn-e2e-front-proxy-ca
  sign apiserver ca /CN=kube-apiserver "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$HOST_IP,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign kubelet ca "/CN=$NODE_NAME" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$HOST_IP,DNS:$NODE_NAME"
  sign admin ca /O=system:masters/CN=kubernetes-admin "$client"
  sign apiserver-kubelet-client ca /O=system:masters/CN=kube-apiserver-kubelet-client "$client"
  sign controller-manager ca /CN=system:kube-controller-manager "$client"
  sign scheduler ca /CN=system:kube-scheduler "$client"
  sign node ca "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  sign kube-proxy ca /CN=system:kube-proxy "$client"
  sign front-proxy-client front-proxy-ca /CN=front-proxy-client "$client"
  if [[ ! -f sa.key ]]; then
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  fi
  chmod 600 ./*.key
  for who in admin controller-manager scheduler node kube-proxy; do
    local f=$PKI/$who.kubeconfig
    [[ $who == admin ]] && f=$KUBECONFIG
    rm -f "$f"
    kubectl config --kubeconfig="$f" set-cluster local --server="https://$HOST_IP:6443" \
      --certificate-authority="$PKI/ca.crt" --embed-certs=true >/dev/null
    kubectl config --kubeconfig="$f" set-credentials "$who" --client-certificate="$PKI/$who.crt" \
      --client-key="$PKI/$who.key" --embed-certs=true >/dev/null
    kubectl config --kubeconfig="$f" set-context local --cluster=local --user="$who" >/dev/null
    kubectl config --kubeconfig="$f" use-context local >/dev/null
    chmod 600 "$f"
  done
  cd - >/dev/null
}

# ---------------------------------------------------------------- the machine's state, saved
save_machine_state() {
  [[ -f $NODE_DIR/saved/sysctl ]] && return 0 # saved by a previous `up` not yet taken down
  mkdir -p "$NODE_DIR/saved"
  for s in "${SYSCTLS[@]}"; do
    v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v"
  done >"$NODE_DIR/saved/sysctl.tmp"
  iptables-save >"$NODE_DIR/saved/iptables"
  ip6tables-save >"$NODE_DIR/saved/ip6tables"
  mv "$NODE_DIR/saved/sysctl.tmp" "$NODE_DIR/saved/sysctl"
}

restore_machine_state() {
  [[ -f $NODE_DIR/saved/sysctl ]] || return 0
  local t c
  for family in iptables ip6tables; do
    # Every table now present flushed and its own chains deleted, then the saved rules back.
    for t in $("$family-save" | sed -n 's/^\*//p'); do
      "$family" -t "$t" -F && "$family" -t "$t" -X || say "could not flush $family table $t"
    done
    "$family-restore" <"$NODE_DIR/saved/$family"
    # iptables-nft leaves a table it made, emptied, behind: the tables the machine had none of go.
    local nft_family=ip
    [[ $family == ip6tables ]] && nft_family=ip6
    for t in $("$family-save" | sed -n 's/^\*//p'); do
      grep -qx "\*$t" "$NODE_DIR/saved/$family" || nft delete table "$nft_family" "$t" 2>/dev/null || true
    done
  done
  while IFS='=' read -r c v; do sysctl -qw "$c=$v" || say "could not restore $c=$v"; done <"$NODE_DIR/saved/sysctl"
  rm -rf "$NODE_DIR/saved"
  say "iptables rules and sysctls restored"
}

# ---------------------------------------------------------------- network
network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$HOST_IP/16" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  # Service addresses go to the bridge from this host address: never out of the machine.
  ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$HOST_IP"
  mkdir -p "$NODE_DIR/cni/net.d"
  cat >"$NODE_DIR/cni/net.d/10-cdn-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cdn-e2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$NODE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "10.88.1.1", "rangeEnd": "10.88.255.254", "gateway": "$HOST_IP"}]],
        "routes": [{"dst": "$POD_CIDR"}, {"dst": "$SERVICE_CIDR"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# ---------------------------------------------------------------- containerd
containerd_up() {
  local c=$NODE_DIR/containerd
  mkdir -p "$c/root" "$c/state"
  cat >"$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
[grpc]
  address = "$CTR_SOCK"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$NODE_DIR/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  netns_mounts_under_state_dir = true
EOF
  start containerd env PATH="$NODE_DIR/containerd-root/usr/bin:$PATH" \
    "$NODE_DIR/containerd-root/usr/bin/containerd" --config "$c/config.toml"
  waitfor containerd 30 ctr version
}

ctr() { "$NODE_DIR/containerd-root/usr/bin/ctr" --address "$CTR_SOCK" "$@"; }

# ---------------------------------------------------------------- images
images() {
  local bah=(buildah --storage-driver vfs) work=$NODE_DIR/images
  mkdir -p "$work"
  # The operator's image, from the Dockerfile, of a static release binary (as CI builds it).
  (cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target x86_64-unknown-linux-gnu -q)
  (cd "$repo" && "${bah[@]}" bud --isolation chroot --quiet --build-arg BINARY_FROM=prebuilt \
    --platform linux/amd64 -t "$OPERATOR_IMAGE" . >/dev/null)
  # nginx 1.30 (the default image's minor version): Debian unstable's, in a minimal Debian root,
  # run as a numeric non-root user, stopped with SIGQUIT as nginx's images are. Made once.
  # The root ./test.sh makes for the data-plane tests when there is one, else one of its own;
  # with njs (libnginx-mod-http-js), which CdnClusters with signed URLs load, as the default
  # image ships it.
  local nginx_root=${CDN_TEST_NGINX_ROOT:-/opt/cdn-operator-test/nginx-root}
  local njs=usr/lib/nginx/modules/ngx_http_js_module.so
  if [[ ! -x $nginx_root/usr/sbin/nginx || ! -f $nginx_root/$njs ]]; then
    nginx_root=$work/nginx-root
    if [[ ! -x $nginx_root/usr/sbin/nginx || ! -f $nginx_root/$njs ]]; then
      rm -rf "$nginx_root.tmp"
      mmdebstrap --quiet --variant=essential --include=nginx,libnginx-mod-http-js --mode=root \
        --aptopt='Acquire::Check-Valid-Until "false"' sid "$nginx_root.tmp"
      rm -rf "$nginx_root"
      mv "$nginx_root.tmp" "$nginx_root"
    fi
  fi
  chroot "$nginx_root" nginx -v 2>&1 | grep -q 'nginx/1\.30\.' || die "nginx 1.30 expected in $nginx_root"
  image_from_root "$nginx_root" "$NGINX_IMAGE" --user 101:101 --stop-signal SIGQUIT \
    --cmd '["nginx", "-g", "daemon off;"]'
  # The same run as root, which the kubelet refuses under runAsNonRoot (a pod that cannot start,
  # issue 41): a layer on the image above, no copy of its root.
  local c
  c=$("${bah[@]}" from --quiet "$NGINX_IMAGE")
  "${bah[@]}" config --user 0:0 "$c"
  "${bah[@]}" commit --quiet --rm "$c" "$ROOT_IMAGE" >/dev/null
  # The pods' sandbox ("pause"): a shell that waits until told to stop.
  if [[ ! -x $work/pause-root/bin/busybox ]]; then
    (cd "$work" && apt-get download busybox-static >/dev/null 2>&1 || apt-get -o APT::Sandbox::User=root download busybox-static >/dev/null)
    mkdir -p "$work/pause-root"
    dpkg -x "$work"/busybox-static_*.deb "$work/pause-root.deb"
    install -D -m 0755 "$work/pause-root.deb/bin/busybox" "$work/pause-root/bin/busybox"
    ln -sf busybox "$work/pause-root/bin/sh"
    ln -sf busybox "$work/pause-root/bin/sleep"
    rm -rf "$work/pause-root.deb"
  fi
  image_from_root "$work/pause-root" "$PAUSE_IMAGE" --user 65535:65535 \
    --cmd '["/bin/sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]'
  for image in "$OPERATOR_IMAGE" "$NGINX_IMAGE" "$ROOT_IMAGE" "$PAUSE_IMAGE"; do
    rm -f "$work/image.tar"
    "${bah[@]}" push --quiet "$image" "oci-archive:$work/image.tar:$image" >/dev/null
    ctr -n k8s.io images import --all-platforms "$work/image.tar" >/dev/null
    say "image $image in containerd"
  done
  rm -f "$work/image.tar"
}

image_from_root() { # root name buildah-config-options...
  local root=$1 name=$2; shift 2
  local bah=(buildah --storage-driver vfs) c
  c=$("${bah[@]}" from --quiet scratch)
  "${bah[@]}" copy --quiet "$c" "$root/" / >/dev/null
  "${bah[@]}" config "$@" "$c"
  "${bah[@]}" commit --quiet --rm "$c" "$name" >/dev/null
}

# ---------------------------------------------------------------- control plane and node
control_plane() {
  local B=$KUBE_BIN
  # The flags every etcd 3.6 build takes; the cluster's own addresses by environment.
  start etcd env ETCD_ADVERTISE_CLIENT_URLS=http://127.0.0.1:23790 \
    ETCD_INITIAL_ADVERTISE_PEER_URLS=http://127.0.0.1:23800 ETCD_INITIAL_CLUSTER=cdn-e2e=http://127.0.0.1:23800 \
    "$B/etcd" --name cdn-e2e --data-dir "$NODE_DIR/etcd" --unsafe-no-fsync \
    --listen-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800
  waitfor etcd 30 curl -sf http://127.0.0.1:23790/health
  start kube-apiserver "$B/kube-apiserver" \
    --bind-address="$HOST_IP" --advertise-address="$HOST_IP" --secure-port=6443 \
    --etcd-servers=http://127.0.0.1:23790 \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --api-audiences=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$SERVICE_CIDR" --service-node-port-range=30000-32767 \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --profiling=false
  waitfor kube-apiserver 120 kubectl get --raw /readyz
  start kube-controller-manager "$B/kube-controller-manager" \
    --kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=20257 --controllers='*' --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --cluster-name=cdn-e2e --service-cluster-ip-range="$SERVICE_CIDR" --leader-elect=false --profiling=false
  waitfor kube-controller-manager 60 curl -skf https://127.0.0.1:20257/healthz
  start kube-scheduler "$B/kube-scheduler" --kubeconfig="$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig="$PKI/scheduler.kubeconfig" --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=20259 --leader-elect=false --profiling=false
  waitfor kube-scheduler 60 curl -skf https://127.0.0.1:20259/healthz
}

node() {
  local B=$KUBE_BIN k=$NODE_DIR/kubelet
  mkdir -p "$k"
  cat >"$k/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $HOST_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 20248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
clusterDomain: cluster.local
clusterDNS: [$HOST_IP]
resolvConf: $k/resolv.conf
containerRuntimeEndpoint: unix://$CTR_SOCK
cgroupDriver: cgroupfs
# This machine mounts cgroup v1 (kubelet 1.36 refuses it unless told).
failCgroupV1: false
failSwapOn: false
enforceNodeAllocatable: []
cgroupsPerQOS: true
protectKernelDefaults: false
makeIPTablesUtilChains: false
localStorageCapacityIsolation: true
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
EOF
  # The pods' resolv.conf search list and nameserver come from clusterDNS; the host's own resolver
  # is not given to them (no name outside the cluster resolves: no traffic off the machine).
  : >"$k/resolv.conf"
  start kubelet "$B/kubelet" --config="$k/config.yaml" --kubeconfig="$PKI/node.kubeconfig" \
    --hostname-override="$NODE_NAME" --node-ip="$HOST_IP" --root-dir="$k/root" \
    --cert-dir="$k/pki" --v=1
  start kube-proxy "$B/kube-proxy" --kubeconfig="$PKI/kube-proxy.kubeconfig" \
    --hostname-override="$NODE_NAME" --proxy-mode=iptables --cluster-cidr="$POD_CIDR" --masquerade-all \
    --nodeport-addresses="$HOST_IP/32" --bind-address="$HOST_IP" \
    --metrics-bind-address=127.0.0.1:20249 --healthz-bind-address=127.0.0.1:20256 \
    --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0
  waitfor "node $NODE_NAME" 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  (cd "$repo" && cargo build -q --locked -p cdn-operator-e2e --bin cluster-dns)
  start cluster-dns "$(target_dir)/debug/cluster-dns" --listen "$HOST_IP:53" --domain cluster.local \
    --kubeconfig "$KUBECONFIG"
  # It publishes nothing before both watches have listed: the API server's own name means it has.
  waitfor "cluster DNS" 60 grep -q "kubernetes.default.svc.cluster.local" "$LOGS/cluster-dns.log"
  waitfor "kube-proxy" 60 curl -sf http://127.0.0.1:20256/healthz
}

target_dir() { echo "${CARGO_TARGET_DIR:-$repo/target}"; }

up() {
  [[ -n ${KUBE_BIN:-} ]] || die "KUBE_BIN is unset: a folder with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy"
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x $KUBE_BIN/$b ]] || die "$KUBE_BIN/$b is missing"
  done
  # Helm refuses the chart (kubeVersion >=1.30) on a server that reports no version, as a plain
  # `go build` makes it: say so before anything starts.
  local version
  version=$("$KUBE_BIN/kube-apiserver" --version 2>/dev/null | awk '{print $2}')
  [[ $version == v1.36.* ]] || die "$KUBE_BIN/kube-apiserver reports version '$version', not v1.36.x: build it with -ldflags \"-X k8s.io/component-base/version.gitVersion=v1.36.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36\" (docs/testing.md)"
  [[ $(id -u) == 0 ]] || die "needs root (a kubelet and containerd)"
  if [[ -f $RUN/kube-apiserver.pid ]] && kill -0 "$(cat "$RUN/kube-apiserver.pid")" 2>/dev/null; then
    die "already up; run: $0 down"
  fi
  mkdir -p "$LOGS" "$RUN"
  rm -rf "$NODE_DIR/etcd"
  install_packages
  certificates
  save_machine_state
  network
  containerd_up
  images
  control_plane
  node
  say "up: export KUBECONFIG=$KUBECONFIG CDN_E2E_OPERATOR_IMAGE=$OPERATOR_IMAGE CDN_E2E_NGINX_IMAGE=$NGINX_IMAGE" \
    "CDN_E2E_PAUSE_IMAGE=$PAUSE_IMAGE CDN_E2E_ROOT_IMAGE=$ROOT_IMAGE"
}

down() {
  for p in cluster-dns kube-proxy kubelet; do stop "$p"; done
  if [[ -S $CTR_SOCK ]]; then
    # The pods' containers outlive the kubelet: killed and removed through containerd.
    local ids
    ids=$(ctr -n k8s.io tasks ls -q 2>/dev/null || true)
    for id in $ids; do ctr -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 1
    for id in $ids; do ctr -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr -n k8s.io containers ls -q 2>/dev/null || true); do
      ctr -n k8s.io containers rm "$id" >/dev/null 2>&1 || true
    done
  fi
  for p in kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do stop "$p"; done
  # A sandbox's shim can outlive its deleted task: the shims of this containerd (their address is
  # its socket) are stopped too.
  local pid
  for pid in $(pgrep -f -- "-address $CTR_SOCK" || true); do
    kill -KILL "$pid" 2>/dev/null && say "killed a containerd shim ($pid)"
  done
  # What the kubelet and containerd mounted (volumes, sandboxes' network namespaces, rootfs).
  local m
  for m in $(awk -v d="$NODE_DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" || say "could not unmount $m"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE"
    say "bridge $BRIDGE removed"
  fi
  ip route del "$SERVICE_CIDR" 2>/dev/null || true
  # The QoS cgroups the kubelet made (the cgroup mounts themselves are the machine's).
  for c in /sys/fs/cgroup/*/kubepods; do
    [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  restore_machine_state
  rm -rf "$NODE_DIR/cni/ipam" "$NODE_DIR/kubelet/root" "$NODE_DIR/volumes"
  say "down"
}

# The node tests, or those named (cargo's --test names) before `--`.
run_tests() {
  local tests=(node rollouts persistent_caches monitoring) args=() t
  if (($#)) && [[ $1 != -* ]]; then
    tests=()
    while (($#)) && [[ $1 != -- ]]; do tests+=("$1"); shift; done
    (($#)) && shift
  fi
  for t in "${tests[@]}"; do args+=(--test "$t"); done
  export CDN_E2E_OPERATOR_IMAGE=$OPERATOR_IMAGE CDN_E2E_NGINX_IMAGE=$NGINX_IMAGE
  export CDN_E2E_PAUSE_IMAGE=$PAUSE_IMAGE CDN_E2E_ROOT_IMAGE=$ROOT_IMAGE
  export CDN_E2E_CLUSTER_DNS=$HOST_IP:53 CDN_E2E_VOLUME_DIR=$NODE_DIR/volumes
  export HELM=${HELM:-$(command -v helm || echo /root/.cache/cdn-operator-tools/bin/helm)}
  [[ -x $HELM ]] || bash "$repo/scripts/install-helm.sh" /root/.cache/cdn-operator-tools
  # The monitoring test runs Debian stable's Prometheus and Alertmanager.
  if ! command -v prometheus >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
    say "installing prometheus prometheus-alertmanager"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
  fi
  (cd "$repo" && cargo test --locked -p cdn-operator-e2e "${args[@]}" -- --test-threads="${TEST_THREADS:-2}" "$@")
}

case ${1:-all} in
  up) up ;;
  down) down ;;
  test) shift; run_tests "$@" ;;
  all)
    trap down EXIT
    up
    run_tests
    ;;
  *) die "usage: $0 [all|up|test [TEST…] [-- CARGO-TEST-ARGS…]|down]" ;;
esac
