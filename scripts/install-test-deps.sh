#!/usr/bin/env bash
# Installs what the test suite drives for real, on a fresh Debian machine of the CI kind.
# Idempotent: each tool is installed only when missing.
set -euo pipefail

apt_packages=()
# The build of jemalloc, the operator's allocator (tikv-jemalloc-sys), runs make and a C compiler.
command -v make >/dev/null 2>&1 || apt_packages+=(make)
command -v cc >/dev/null 2>&1 || apt_packages+=(gcc)
# promtool lints the /metrics exposition (Debian ships it in the prometheus package).
command -v promtool >/dev/null 2>&1 || apt_packages+=(prometheus)
# A real Prometheus and Alertmanager deliver an alert to the monitoring harness's webhook
# (e2e/src/monitoring/prometheus.rs); the node's monitoring test uses them too.
command -v prometheus-alertmanager >/dev/null 2>&1 || apt_packages+=(prometheus-alertmanager)
# openssl makes the CA and certificate of the TLS tracing test.
command -v openssl >/dev/null 2>&1 || apt_packages+=(openssl)
# Graphviz's dot lays out the DOT output of `cdn-operator graph` (tests/graph.rs).
command -v dot >/dev/null 2>&1 || apt_packages+=(graphviz)
# The browser in which the Mermaid CLI renders `cdn-operator graph -o mermaid`: puppeteer's own
# browser download is out of reach, Debian's chromium is not.
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
# wrk drives the throughput row of the data-plane benchmark (e2e/src/bin/dataplane/).
command -v wrk >/dev/null 2>&1 || apt_packages+=(wrk)
# The caches users would pick instead, measured beside the generated one in the same benchmark
# (its rows 20 to 26): Varnish and Apache Traffic Server, Debian stable's.
command -v varnishd >/dev/null 2>&1 || apt_packages+=(varnish)
command -v traffic_server >/dev/null 2>&1 || apt_packages+=(trafficserver)

if [ ${#apt_packages[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
fi

# nginx as the pods run it (1.30), for tests/nginx.rs and the testkit's runner
# (testkit/src/nginx.rs): Debian unstable's, whose binary needs unstable's libc and OpenSSL, so it
# lives in a root of its own (about 105 MB) that the tests enter with bubblewrap. The root is
# outside the repository so that every clone shares it; CDN_TEST_NGINX_ROOT moves it, for the
# tests too. Made once (15 to 40 s here), again only if its nginx is not of the 1.30 series or
# lacks njs (libnginx-mod-http-js: the signed URLs' verifier, which the default image ships too).
nginx_root="${CDN_TEST_NGINX_ROOT:-/opt/cdn-operator-test/nginx-root}"
nginx_series="nginx/1.30."
njs_module=usr/lib/nginx/modules/ngx_http_js_module.so
root_nginx_version() {
  bwrap --ro-bind "$1" / --dev /dev --proc /proc nginx -v 2>&1 || true
}
if ! command -v bwrap >/dev/null 2>&1 \
  || ! grep -qF "$nginx_series" <<<"$(root_nginx_version "$nginx_root")" \
  || [ ! -f "$nginx_root/$njs_module" ]; then
  if ! command -v bwrap >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # mmdebstrap with its recommends, as tried.
    apt-get install -y -qq mmdebstrap bubblewrap >/dev/null
  fi
  staging="$nginx_root.new"
  rm -rf "$staging"
  mkdir -p "$(dirname "$nginx_root")"
  # The mirror's unstable index is a snapshot, past the Valid-Until date of its Release file. The
  # root gets an /etc/hosts for localhost (the tests bind their own over it).
  mmdebstrap --quiet --variant=essential --include=nginx,libnginx-mod-http-js,ca-certificates --mode=root \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='printf "127.0.0.1 localhost\n::1 localhost\n" > "$1/etc/hosts"' \
    sid "$staging"
  version="$(root_nginx_version "$staging")"
  if ! grep -qF "$nginx_series" <<<"$version"; then
    echo "Debian unstable's nginx is not of the ${nginx_series}x series the pods run: $version" >&2
    exit 1
  fi
  if [ ! -f "$staging/$njs_module" ]; then
    echo "Debian unstable's libnginx-mod-http-js installed no $njs_module" >&2
    exit 1
  fi
  rm -rf "$nginx_root"
  mv "$staging" "$nginx_root"
fi

# The offline CRD validator of ../shared/tools needs these.
python3 -c 'import jsonschema, yaml' >/dev/null 2>&1 || python3 -m pip install -q jsonschema pyyaml

# The OTLP receiver the tracing test starts (../shared/tools/otlp_receiver.py).
if ! python3 -c 'import grpc, opentelemetry.proto' >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  # Debian's own python3 refuses system-wide installs (PEP 668) unless told otherwise.
  python3 -m pip install -q opentelemetry-proto grpcio 2>/dev/null \
    || python3 -m pip install -q --break-system-packages opentelemetry-proto grpcio
fi

# Akamai's own signer of EdgeAuth tokens, an implementation independent of the operator's: the
# test vectors of signed URLs come from it (tests/fixtures/signed-urls/generate.py), pinned.
if ! python3 -c 'import akamai.edgeauth' >/dev/null 2>&1; then
  python3 -m pip install -q akamai-edgeauth==0.3.2 2>/dev/null \
    || python3 -m pip install -q --break-system-packages akamai-edgeauth==0.3.2
fi

# The Mermaid CLI (tests/graph.rs), pinned; it drives Debian's chromium, so puppeteer downloads none.
if ! command -v mmdc >/dev/null 2>&1; then
  PUPPETEER_SKIP_DOWNLOAD=1 npm install -g -q --no-audit --no-fund \
    @mermaid-js/mermaid-cli@11.12.0 puppeteer@23.11.1 >/dev/null
fi
