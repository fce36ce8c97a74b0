#!/usr/bin/env bash
# Checks everything a user installs with the real tools (../shared/TOOLS.md): kustomize builds,
# Helm lint/template, kubernetes-validate --strict, trivy, OLM schemas, promtool, Grafana's
# Dashboard type, Argo CD health checks, the CI workflows (check-jsonschema, zizmor), the chart
# package and the SBOM, hadolint, and the images (linux/amd64, linux/arm64) built with buildah.
# Installs the tools first (idempotent). Run from anywhere; called by test.sh.
#   CDN_OPERATOR_TOOLS   where the tools go (default ~/.cache/cdn-operator-tools)
#   SKIP_IMAGE=1         skip the static release builds (x86_64, aarch64) and the buildah images (the slow part)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
shared=$(cd "$repo/../shared" && pwd)
tools=${CDN_OPERATOR_TOOLS:-$HOME/.cache/cdn-operator-tools}
start=$SECONDS

step() { printf '\n== %s (%ss)\n' "$*" $((SECONDS - start)); }

step "installing the validators into $tools"
bash scripts/install-artifact-tools.sh "$tools"
export PATH="$tools/bin:$PATH"
py="$tools/venv/bin/python3"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step "yamllint"
# Helm templates are not YAML until rendered; the rendered output is validated below.
# Generated CRDs indent lists flush with their key and carry long descriptions (and icons are long
# base64 lines): both styles are accepted, consistently within a file.
yamllint -s -d '{extends: default, rules: {line-length: disable, document-start: disable,
  indentation: {spaces: consistent, indent-sequences: whatever},
  comments: {min-spaces-from-content: 1}, comments-indentation: disable, truthy: {check-keys: false}}}' \
  kustomize argocd bundle olm tests/alerts tests/helm .github \
  helm/cdn-operator/Chart.yaml helm/cdn-operator/values.yaml helm/cdn-operator/files
echo "ok yamllint"

step "kustomize builds, kubernetes-validate --strict (Kubernetes 1.37 and 1.29)"
for k in kustomize/base kustomize/overlays/single-namespace kustomize/overlays/monitoring argocd/overlay; do
  out="$work/kustomize-$(echo "$k" | tr / -).yaml"
  kubectl kustomize "$k" >"$out"
  # Custom resources of other projects (ServiceMonitor, PrometheusRule) have no schema there: a
  # warning; everything else must validate.
  kubernetes-validate --strict --quiet "$out"
  # The oldest Kubernetes the chart, the CSV and the CRD rules support.
  kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "$out"
  echo "ok $k ($(grep -c '^kind:' "$out") objects)"
done
# The nginx pods' metrics sidecar runs the operator's image (base/kustomization.yaml replacements).
"$py" scripts/artifact_checks.py nginx-metrics-image same "$work"/kustomize-*.yaml
"$py" scripts/artifact_checks.py nginx-metrics-image ghcr.io/anevia/cdn-operator:0.1.0 "$work/kustomize-kustomize-base.yaml"
# What `kustomize edit set image cdn-operator=IMAGE` writes into kustomize/base (no standalone
# kustomize here: the same `images:` entry, written by hand into a copy): the env follows.
cp -r kustomize "$work/edited"
"$py" - "$work/edited/base/kustomization.yaml" <<'EOF_PY'
import sys, yaml
path = sys.argv[1]
k = yaml.safe_load(open(path))
k["images"] = [{"name": "cdn-operator", "newName": "registry.example.com/mirror/cdn-operator", "newTag": "9.9.9"}]
yaml.safe_dump(k, open(path, "w"), sort_keys=False)
EOF_PY
kubectl kustomize "$work/edited/base" >"$work/edited.yaml"
"$py" scripts/artifact_checks.py nginx-metrics-image registry.example.com/mirror/cdn-operator:9.9.9 "$work/edited.yaml"
# A user's overlay that sets the image with its own `images:` repeats the replacement
# (docs/install.md, CDN metrics); the snippet is the one documented there.
mkdir -p "$work/overlay-mirror"
cat >"$work/overlay-mirror/kustomization.yaml" <<EOF_K
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$work/overlay-mirror" kustomize/base)
images:
  - name: ghcr.io/anevia/cdn-operator
    newName: registry.example.com/mirror/cdn-operator
$(sed -n '/^replacements:/,/^```/p' docs/install.md | sed '$d')
EOF_K
kubectl kustomize "$work/overlay-mirror" >"$work/mirror.yaml"
"$py" scripts/artifact_checks.py nginx-metrics-image registry.example.com/mirror/cdn-operator:0.1.0 "$work/mirror.yaml"
"$py" scripts/artifact_checks.py no-cluster-rbac "$work/kustomize-kustomize-overlays-single-namespace.yaml"
# The single-namespace overlay installs into the user's namespace: it must not own (label, delete) it.
"$py" scripts/artifact_checks.py no-kind Namespace "$work/kustomize-kustomize-overlays-single-namespace.yaml"
# No fixed UID by default (OpenShift's restricted-v2 assigns one); components/pinned-ids pins them.
"$py" scripts/artifact_checks.py pod-ids none "$work"/kustomize-*.yaml
mkdir -p "$work/overlay-pinned"
cat >"$work/overlay-pinned/kustomization.yaml" <<EOF_K
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$work/overlay-pinned" kustomize/base)
components:
  - $(realpath --relative-to="$work/overlay-pinned" kustomize/components/pinned-ids)
EOF_K
kubectl kustomize "$work/overlay-pinned" >"$work/pinned.yaml"
kubernetes-validate --strict --quiet "$work/pinned.yaml"
"$py" scripts/artifact_checks.py pod-ids pinned "$work/pinned.yaml"
# A user's overlay that moves the install to another namespace moves the RBAC subjects with it.
mkdir -p "$work/overlay-team-a"
cat >"$work/overlay-team-a/kustomization.yaml" <<EOF_K
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: team-a
resources:
  - $(realpath --relative-to="$work/overlay-team-a" kustomize/overlays/single-namespace)
EOF_K
kubectl kustomize "$work/overlay-team-a" >"$work/team-a.yaml"
"$py" scripts/artifact_checks.py all-in-namespace team-a "$work/team-a.yaml"
"$py" scripts/artifact_checks.py no-kind Namespace "$work/team-a.yaml"
"$py" scripts/artifact_checks.py all-in-namespace cdn-operator "$work/kustomize-kustomize-base.yaml"
# The purge key's Secret, empty, under the name the operator reads, in its namespace, with the one
# Role on it; an overlay's namePrefix renames it, and the kustomization docs/install.md puts on top
# names it back.
for f in kustomize-kustomize-base kustomize-kustomize-overlays-single-namespace kustomize-kustomize-overlays-monitoring \
  kustomize-argocd-overlay; do
  "$py" scripts/artifact_checks.py purge-key cdn-operator "$work/$f.yaml"
done
"$py" scripts/artifact_checks.py purge-key team-a "$work/team-a.yaml"
mkdir -p "$work/prefixed" "$work/renamed"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: team-a-\nresources:\n  - %s\n' \
  "$(realpath --relative-to="$work/prefixed" kustomize/base)" >"$work/prefixed/kustomization.yaml"
sed -n '/the Role follows/,/^```$/p' docs/install.md | sed '1,/^```yaml$/d;$d' >"$work/renamed/kustomization.yaml"
grep -q '^  - ../prefixed ' "$work/renamed/kustomization.yaml" || { echo "docs/install.md: no namePrefix snippet"; exit 1; }
kubectl kustomize "$work/prefixed" >"$work/prefixed.yaml"
if "$py" scripts/artifact_checks.py purge-key cdn-operator "$work/prefixed.yaml" >/dev/null 2>&1; then
  echo "a namePrefix kept the purge key's name: docs/install.md's snippet is not needed"; exit 1
fi
kubectl kustomize "$work/renamed" >"$work/renamed.yaml"
"$py" scripts/artifact_checks.py purge-key cdn-operator "$work/renamed.yaml"
# The optional NetworkPolicy component, on the base as a user's overlay adds it.
mkdir -p "$work/overlay-netpol"
cat >"$work/overlay-netpol/kustomization.yaml" <<EOF_K
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$work/overlay-netpol" kustomize/base)
components:
  - $(realpath --relative-to="$work/overlay-netpol" kustomize/components/network-policy)
EOF_K
kubectl kustomize "$work/overlay-netpol" >"$work/kustomize-network-policy.yaml"
kubernetes-validate --strict --quiet "$work/kustomize-network-policy.yaml"
kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "$work/kustomize-network-policy.yaml"
grep -q '^kind: NetworkPolicy' "$work/kustomize-network-policy.yaml"
echo "ok kustomize/components/network-policy"
# Monitoring in single-namespace mode: components/prometheus, then components/single-namespace,
# in a user's namespace. The PodMonitor scrapes that namespace only.
mkdir -p "$work/overlay-sn-monitoring"
cat >"$work/overlay-sn-monitoring/kustomization.yaml" <<EOF_K
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: team-b
resources:
  - $(realpath --relative-to="$work/overlay-sn-monitoring" kustomize/base)
components:
  - $(realpath --relative-to="$work/overlay-sn-monitoring" kustomize/components/prometheus)
  - $(realpath --relative-to="$work/overlay-sn-monitoring" kustomize/components/single-namespace)
EOF_K
kubectl kustomize "$work/overlay-sn-monitoring" >"$work/kustomize-single-namespace-monitoring.yaml"
kubernetes-validate --strict --quiet "$work/kustomize-single-namespace-monitoring.yaml"
kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "$work/kustomize-single-namespace-monitoring.yaml"
"$py" scripts/artifact_checks.py pod-monitor-namespace team-b "$work/kustomize-single-namespace-monitoring.yaml"
"$py" scripts/artifact_checks.py no-cluster-rbac "$work/kustomize-single-namespace-monitoring.yaml"
echo "ok kustomize/components/prometheus with single-namespace"
# A user's overlay without `namespace:` adding every component: what the components add goes to
# the operator's namespace, not to kubectl's current one; on top of an overlay that moved the
# operator (team-a above), to that one.
for on in base:cdn-operator overlay-team-a:team-a; do
  dir="$work/overlay-components-${on%%:*}"
  mkdir -p "$dir"
  case $on in base:*) from=kustomize/base ;; *) from="$work/${on%%:*}" ;; esac
  {
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n'
    printf '  - %s\ncomponents:\n' "$(realpath --relative-to="$dir" "$from")"
    for c in kustomize/components/*/; do
      printf '  - %s\n' "$(realpath --relative-to="$dir" "$c")"
    done
  } >"$dir/kustomization.yaml"
  kubectl kustomize "$dir" >"$dir.yaml"
  kubernetes-validate --strict --quiet --no-warn "$dir.yaml"
  "$py" scripts/artifact_checks.py all-in-namespace "${on#*:}" "$dir.yaml"
done
echo "ok kustomize/components/* land in the operator's namespace"

step "helm lint and template, kubernetes-validate --strict (Kubernetes 1.37 and 1.29)"
chart=helm/cdn-operator
variants=("default:" "all-features:-f tests/helm/values-all-features.yaml"
  "single-replica:-f tests/helm/values-single-replica.yaml" "single-namespace:--set singleNamespace.enabled=true")
for v in "${variants[@]}"; do
  name=${v%%:*}
  # shellcheck disable=SC2086 # the flags are words
  set -- ${v#*:}
  helm lint --strict "$chart" "$@" >/dev/null
  helm template cdn-operator "$chart" --namespace cdn-operator "$@" >"$work/helm-$name.yaml"
  kubernetes-validate --strict --quiet "$work/helm-$name.yaml"
  kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "$work/helm-$name.yaml"
  echo "ok helm $name ($(grep -c '^kind:' "$work/helm-$name.yaml") objects)"
done
# helm template skips NOTES.txt: render its named template through a copy of the chart.
cp -r "$chart" "$work/notes-chart"
printf 'notes: {{ include "cdn-operator.notes" . | quote }}\n' >"$work/notes-chart/templates/notes-check.yaml"
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086
  set -- ${v#*:}
  helm template cdn-operator "$work/notes-chart" --namespace cdn-operator "$@" \
    --show-only templates/notes-check.yaml >"$work/notes.yaml"
  # all-features moves the objects to namespaceOverride; `helm test` stays in the release's.
  ns=cdn-operator; [ "${v%%:*}" = all-features ] && ns=cdn-system
  grep -q "is installed in namespace $ns" "$work/notes.yaml" || { cat "$work/notes.yaml"; exit 1; }
  grep -q 'helm test cdn-operator -n cdn-operator ' "$work/notes.yaml" || { cat "$work/notes.yaml"; exit 1; }
done
echo "ok NOTES.txt renders"
if helm lint "$chart" -f tests/helm/values-invalid.yaml >/dev/null 2>&1; then
  echo "values.schema.json accepted tests/helm/values-invalid.yaml"; exit 1
fi
echo "ok values.schema.json rejects tests/helm/values-invalid.yaml"
# Rules between values, in values.schema.json (if/then) so that `helm lint` refuses them too.
refused() { # MESSAGE HELM-ARGS...: helm lint and helm template both fail, saying MESSAGE
  local message=$1; shift
  for cmd in lint template; do
    if helm "$cmd" "$chart" "$@" >"$work/refused.out" 2>&1; then
      echo "helm $cmd accepted $*"; exit 1
    fi
    grep -qF -- "$message" "$work/refused.out" || { echo "helm $cmd $*: expected '$message'"; cat "$work/refused.out"; exit 1; }
  done
  echo "ok helm refuses $*"
}
refused 'leaderElection.enabled does not match: true' --set replicaCount=2 --set leaderElection.enabled=false
refused 'serviceAccount.name: String length must be greater than or equal to 1' --set serviceAccount.create=false
refused 'managedPods.runAsUser: Must be greater than or equal to 1' --set managedPods.runAsUser=0
refused 'managedPods.image: Does not match pattern' --set 'managedPods.image=nginx unprivileged'
# managedPods.image is the operator's --nginx-image (RELATED_IMAGE_NGINX), as written; none by default.
grep -A1 -- '- name: RELATED_IMAGE_NGINX$' "$work/helm-all-features.yaml" | grep -q 'mirror/nginx-unprivileged@sha256:' \
  || { echo "helm all-features: no RELATED_IMAGE_NGINX from managedPods.image"; exit 1; }
if grep -q -- '- name: RELATED_IMAGE_NGINX$' "$work/helm-default.yaml"; then
  echo "helm default: RELATED_IMAGE_NGINX set although managedPods.image is empty"; exit 1
fi
refused 'cdnMetrics.podMonitor.enabled does not match: false' --set cdnMetrics.enabled=false --set cdnMetrics.podMonitor.enabled=true
refused 'podDisruptionBudget.maxUnavailable: podDisruptionBudget.maxUnavailable must be one of the following: "unset: minAvailable is set' \
  --set podDisruptionBudget.minAvailable=1 --set podDisruptionBudget.maxUnavailable=1
# The conventions' values stay strict on types and typos.
refused 'commonLabels.team: Invalid type. Expected: string, given: integer' --set commonLabels.team=1
refused 'revisionHistoryLimit: Invalid type. Expected: integer, given: string' --set revisionHistoryLimit=many
refused 'strategy.type: strategy.type must be one of the following' --set strategy.type=Sideways
refused 'livenessProbe: Additional property perodSeconds is not allowed' --set livenessProbe.perodSeconds=5
refused 'topologySpreadConstraints.0: topologyKey is required' --set 'topologySpreadConstraints[0].maxSkew=1' \
  --set 'topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule'
refused 'metrics.serviceMonitor.scrapeTimeout: Does not match pattern' --set metrics.serviceMonitor.scrapeTimeout=10x
refused 'global.imageRegistry: Does not match pattern' --set global.imageRegistry=https://registry.example.com
refused 'prometheusRule.additionalRules.0: Must validate one and only one schema (oneOf)' \
  --set 'prometheusRule.additionalRules[0].expr=up == 0'
# Every convention set in tests/helm/values-all-features.yaml is in the output; the defaults
# (values.yaml) render as before (hostname spread, maxUnavailable 1, the token mounted).
"$py" scripts/artifact_checks.py helm-values tests/helm/values-all-features.yaml "$work/helm-all-features.yaml"
"$py" scripts/artifact_checks.py helm-values "$chart/values.yaml" "$work/helm-default.yaml"
helm template cdn-operator "$chart" --namespace cdn-operator -f tests/helm/values-all-features.yaml \
  --set serviceAccount.create=true >"$work/helm-all-features-sa.yaml"
"$py" scripts/artifact_checks.py helm-values tests/helm/values-all-features.yaml "$work/helm-all-features-sa.yaml"
"$py" scripts/artifact_checks.py chart-annotations "$chart/Chart.yaml" "$work/helm-default.yaml" \
  bundle/manifests/cdn-operator.clusterserviceversion.yaml
# The operator exports OTLP over HTTP (4318) only: no example points it at gRPC's 4317.
if grep -rnE 'https?://[^ ]*:4317' README.md docs argocd helm tests/helm; then
  echo "an OTLP example uses port 4317 (gRPC); the operator speaks OTLP/HTTP, port 4318"; exit 1
fi
echo "ok OTLP examples use port 4318"
# RELATED_IMAGE_NGINX_METRICS: the operator's image (tag or digest), a pinned one, or none.
"$py" scripts/artifact_checks.py nginx-metrics-image same "$work/helm-default.yaml" "$work/helm-single-replica.yaml" \
  "$work/helm-single-namespace.yaml" bundle/manifests/cdn-operator.clusterserviceversion.yaml
"$py" scripts/artifact_checks.py nginx-metrics-image ghcr.io/anevia/cdn-operator:0.1.0 "$work/helm-default.yaml"
helm template cdn-operator "$chart" --set image.digest=sha256:"$(printf '%064d' 7)" >"$work/helm-digest.yaml"
"$py" scripts/artifact_checks.py nginx-metrics-image same "$work/helm-digest.yaml"
"$py" scripts/artifact_checks.py nginx-metrics-image registry.example.com/mirror/cdn-operator:0.1.0 "$work/helm-all-features.yaml"
helm template cdn-operator "$chart" --set cdnMetrics.enabled=false >"$work/helm-no-cdn-metrics.yaml"
"$py" scripts/artifact_checks.py nginx-metrics-image none "$work/helm-no-cdn-metrics.yaml"
"$py" scripts/artifact_checks.py no-kind PodMonitor "$work/helm-default.yaml"
# The PodMonitor in single-namespace mode scrapes the managed namespace only.
"$py" scripts/artifact_checks.py pod-monitor-namespace cdn-apps "$work/helm-all-features.yaml"
helm template cdn-operator "$chart" --namespace cdn-operator --set singleNamespace.enabled=true \
  --set cdnMetrics.podMonitor.enabled=true >"$work/helm-single-namespace-monitoring.yaml"
kubernetes-validate --strict --quiet "$work/helm-single-namespace-monitoring.yaml"
"$py" scripts/artifact_checks.py pod-monitor-namespace cdn-operator "$work/helm-single-namespace-monitoring.yaml"
# No fixed UID by default; pinned when asked (tests/helm/values-all-features.yaml); the
# `helm test` pod is rendered (and validated above).
"$py" scripts/artifact_checks.py pod-ids none "$work/helm-default.yaml" "$work/helm-single-replica.yaml" \
  "$work/helm-single-namespace.yaml" bundle/manifests/cdn-operator.clusterserviceversion.yaml
"$py" scripts/artifact_checks.py pod-ids pinned "$work/helm-all-features.yaml"
grep -q 'helm.sh/hook: test' "$work/helm-default.yaml" || { echo "no helm test pod rendered"; exit 1; }
# `helm uninstall` releases the At pods first (docs/adr/0006), as the operator and over its scope.
"$py" scripts/artifact_checks.py uninstall-hook "$work/helm-default.yaml"
"$py" scripts/artifact_checks.py uninstall-hook "$work/helm-single-namespace.yaml"
"$py" scripts/artifact_checks.py uninstall-hook "$work/helm-all-features.yaml"
helm template cdn-operator "$chart" --set uninstall.releaseFinalizers=false >"$work/helm-no-uninstall-hook.yaml"
"$py" scripts/artifact_checks.py uninstall-hook "$work/helm-no-uninstall-hook.yaml" none
"$py" scripts/artifact_checks.py same-rbac "$work/kustomize-kustomize-base.yaml" "$work/helm-default.yaml"
"$py" scripts/artifact_checks.py same-rbac "$work/kustomize-kustomize-overlays-single-namespace.yaml" "$work/helm-single-namespace.yaml"
"$py" scripts/artifact_checks.py no-cluster-rbac "$work/helm-single-namespace.yaml"
"$py" scripts/artifact_checks.py purge-key cdn-operator "$work/helm-default.yaml"
"$py" scripts/artifact_checks.py purge-key cdn-operator "$work/helm-single-namespace.yaml"
# all-features moves the objects to namespaceOverride (cdn-system).
"$py" scripts/artifact_checks.py purge-key cdn-system "$work/helm-all-features.yaml"
# The users' roles: CdnClusters edited by admin and edit, CdnPurges created by admin only.
for f in kustomize-kustomize-base kustomize-kustomize-overlays-single-namespace helm-default helm-single-namespace; do
  "$py" scripts/artifact_checks.py user-roles "$work/$f.yaml"
done
helm template cdn-operator "$chart" --set userRoles.enabled=false >"$work/helm-no-user-roles.yaml"
"$py" scripts/artifact_checks.py user-roles "$work/helm-no-user-roles.yaml" none
"$py" scripts/artifact_checks.py same-crds "$work/helm-default.yaml" bundle/manifests/*_*.yaml
# Monitoring on with default labels: kustomize overlay, Helm, the Argo CD Application's values.
"$py" scripts/artifact_checks.py kube-prometheus-stack "$work/kustomize-kustomize-overlays-monitoring.yaml"
helm template cdn-operator "$chart" --namespace cdn-operator --set metrics.serviceMonitor.enabled=true \
  --set prometheusRule.enabled=true --set cdnMetrics.podMonitor.enabled=true >"$work/helm-monitoring.yaml"
"$py" scripts/artifact_checks.py kube-prometheus-stack "$work/helm-monitoring.yaml"
"$py" -c 'import sys, yaml; print(yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["spec"]["source"]["helm"]["valuesObject"]))' \
  argocd/application-helm.yaml >"$work/argocd-values.yaml"
helm template cdn-operator "$chart" --namespace cdn-operator -f "$work/argocd-values.yaml" >"$work/helm-argocd.yaml"
"$py" scripts/artifact_checks.py kube-prometheus-stack "$work/helm-argocd.yaml"
"$py" scripts/artifact_checks.py same-crds "$work/kustomize-kustomize-base.yaml" bundle/manifests/*_*.yaml

step "trivy config (no HIGH or CRITICAL beyond scripts/trivy-ignore.yaml)"
mkdir -p "$work/rendered"
cp "$work"/kustomize-*.yaml "$work"/helm-*.yaml "$work/rendered/"
trivy config --quiet --skip-check-update --ignorefile scripts/trivy-ignore.yaml \
  --severity HIGH,CRITICAL --exit-code 1 "$work/rendered"
echo "ok trivy"

step "OLM: CSV, catalog examples against OLM's schemas; examples against our CRDs"
olm="$shared/olm-schemas"
"$py" "$shared/tools/crd_validate.py" "$olm/operators.coreos.com_clusterserviceversions.yaml" \
  bundle/manifests/cdn-operator.clusterserviceversion.yaml
"$py" "$shared/tools/crd_validate.py" "$olm/operators.coreos.com_catalogsources.yaml" olm/examples/catalog_source.yaml
"$py" "$shared/tools/crd_validate.py" "$olm/operators.coreos.com_operatorgroups.yaml" olm/examples/operator_group*.yaml
"$py" "$shared/tools/crd_validate.py" "$olm/operators.coreos.com_subscriptions.yaml" olm/examples/subscription*.yaml
# Channels named after the CSV's maturity everywhere; com.redhat.openshift.versions runs minKubeVersion.
"$py" scripts/artifact_checks.py bundle-annotations
"$py" scripts/artifact_checks.py alm-examples bundle/manifests/cdn-operator.clusterserviceversion.yaml "$work/alm-examples.yaml"
# The catalog's bundle properties (olm.csv.metadata, olm.gvk, olm.package) are what opm renders.
"$py" scripts/artifact_checks.py catalog-properties
# The bundle's other objects (metrics Service, PodDisruptionBudget, purge key Secret) as OLM applies them.
bundled=(bundle/manifests/cdn-operator-metrics.service.yaml bundle/manifests/cdn-operator.poddisruptionbudget.yaml
  bundle/manifests/cdn-operator-purge-signing.secret.yaml)
kubernetes-validate --strict --quiet "${bundled[@]}"
kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "${bundled[@]}"
# A release as the release workflow makes it (docs/upgrading.md): scripts/bundle_release.py on a
# copy of bundle/ and olm/, for a 0.2.0 with fake digests; then every check of a release.
rel="$work/release"
mkdir -p "$rel"
cp -r bundle olm "$rel/"
fake() { printf 'sha256:%064d' "$1"; }
"$py" scripts/bundle_release.py --root "$rel" bundle 0.2.0 --image cdn-operator=ghcr.io/anevia/cdn-operator@"$(fake 1)" \
  --image nginx=docker.io/nginxinc/nginx-unprivileged@"$(fake 2)"
"$py" scripts/bundle_release.py --root "$rel" catalog 0.2.0 --bundle-image ghcr.io/anevia/cdn-operator-bundle@"$(fake 3)"
"$py" "$shared/tools/crd_validate.py" "$olm/operators.coreos.com_clusterserviceversions.yaml" \
  "$rel/bundle/manifests/cdn-operator.clusterserviceversion.yaml"
"$py" scripts/artifact_checks.py released "$rel" 0.2.0 0.1.0
(cd "$rel" && "$py" "$repo/scripts/artifact_checks.py" bundle-annotations)
# What it refuses, writing nothing: a tag instead of a digest, an image missing, no newer version.
mkdir -p "$work/refused-release" && cp -r bundle olm "$work/refused-release/"
for bad in "0.2.0 --image cdn-operator=ghcr.io/anevia/cdn-operator:0.2.0 --image nginx=docker.io/nginxinc/nginx-unprivileged@$(fake 2)" \
  "0.2.0 --image cdn-operator=ghcr.io/anevia/cdn-operator@$(fake 1)" \
  "0.1.0 --image cdn-operator=ghcr.io/anevia/cdn-operator@$(fake 1) --image nginx=docker.io/nginxinc/nginx-unprivileged@$(fake 2)"; do
  # shellcheck disable=SC2086 # the arguments are words
  if "$py" scripts/bundle_release.py --root "$work/refused-release" bundle $bad 2>"$work/refused.err"; then
    echo "bundle_release.py accepted: bundle $bad"; exit 1
  fi
  grep -q '^bundle_release: ' "$work/refused.err" || { cat "$work/refused.err"; exit 1; }
  diff -r bundle "$work/refused-release/bundle" >/dev/null || { echo "bundle_release.py wrote on: bundle $bad"; exit 1; }
done
if "$py" scripts/bundle_release.py --root "$work/refused-release" catalog 0.1.0 --bundle-image x@"$(fake 3)" 2>/dev/null; then
  echo "bundle_release.py added the bundle of bundle/ to the catalog twice"; exit 1
fi
diff -r olm "$work/refused-release/olm" >/dev/null || { echo "bundle_release.py wrote a refused catalog"; exit 1; }
echo "ok bundle_release.py refuses tags, missing images, versions not after the previous one, a bundle twice"
# Monitoring of OLM installs (not in the bundle): both variants, and in another namespace.
for variant in prometheus-operator openshift; do
  kubectl kustomize "olm/monitoring/$variant" >"$work/olm-monitoring-$variant.yaml"
  kubernetes-validate --strict --quiet "$work/olm-monitoring-$variant.yaml"
  kubernetes-validate --strict --quiet --no-warn -k 1.29.0 "$work/olm-monitoring-$variant.yaml"
  "$py" scripts/artifact_checks.py olm-monitoring cdn-operator "$work/olm-monitoring-$variant.yaml" "$variant"
  "$py" scripts/artifact_checks.py kube-prometheus-stack "$work/olm-monitoring-$variant.yaml"
done
# Another namespace is set in the directory applied (docs/install.md): serverName follows it.
cp -r olm "$work/olm-team-c"
sed -i 's/^namespace: cdn-operator$/namespace: team-c/' "$work/olm-team-c/monitoring/openshift/kustomization.yaml"
kubectl kustomize "$work/olm-team-c/monitoring/openshift" >"$work/olm-monitoring-team-c.yaml"
"$py" scripts/artifact_checks.py olm-monitoring team-c "$work/olm-monitoring-team-c.yaml" openshift
for crd in bundle/manifests/*_*.yaml; do
  "$py" scripts/artifact_checks.py crd-for-objects "$crd" "$work/crd.yaml"
  "$py" "$shared/tools/crd_validate.py" "$work/crd.yaml" "$work/alm-examples.yaml" "$shared"/seed-examples/*.yaml \
    argocd/health/*/*/testdata/*.yaml
done

step "promtool: alert rules, their unit tests, dashboard queries"
mkdir -p "$work/rules"
"$py" scripts/artifact_checks.py rules-file kustomize/components/prometheus/prometheus_rule.yaml "$work/rules/cdn-operator.rules.yaml"
promtool check rules "$work/rules/cdn-operator.rules.yaml"
# Every unit test file (the operator's alerts, the CDN's), each beside the extracted rules.
for t in tests/alerts/*.test.yaml; do
  cp "$t" "$work/rules/"
  promtool test rules "$work/rules/${t##*/}"
done
dashboards=(kustomize/components/grafana-dashboards/*.json)
[ "${#dashboards[@]}" -ge 2 ] || { echo "expected the cdn-operator and cdn-clusters dashboards"; exit 1; }
for d in "${dashboards[@]}"; do
  name=$(basename "$d" .json)
  "$py" scripts/artifact_checks.py dashboard-rules "$d" "$work/rules/dashboard-$name.rules.yaml"
  promtool check rules "$work/rules/dashboard-$name.rules.yaml"
done

step "Grafana: the dashboards against @grafana/schema's Dashboard type"
for d in "${dashboards[@]}"; do
  NODE_ROOT="$tools/node" sh "$shared/tools/check_dashboard.sh" "$d"
  echo "ok $d type-checks"
done

step "Argo CD health checks (Lua, Argo CD's test format)"
"$py" scripts/argocd_health_test.py "$shared/tools/argo_health.lua"

step "release: CI workflows, the chart as a package, the SBOM"
# GitHub's workflow schema, and zizmor's security audit (any finding fails; offline: no API calls).
check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
zizmor --offline .github/workflows/*.yml
# The chart as `helm push` publishes it (release.yml): the package lints, renders, and is the
# version of Chart.yaml, which is the crate's (one version for the whole release).
crate_version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
chart_version=$(sed -n 's/^version: //p' "$chart/Chart.yaml")
app_version=$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$chart/Chart.yaml")
[ "$chart_version" = "$crate_version" ] && [ "$app_version" = "$crate_version" ] || {
  echo "Cargo.toml $crate_version, Chart.yaml version $chart_version appVersion $app_version: they must agree"; exit 1; }
grep -q "^## \[$crate_version\]" CHANGELOG.md || { echo "CHANGELOG.md has no section [$crate_version]"; exit 1; }
helm package "$chart" --destination "$work/package" >/dev/null
tgz="$work/package/cdn-operator-$chart_version.tgz"
[ -f "$tgz" ] || { echo "helm package made $(ls "$work/package"), not ${tgz##*/}"; exit 1; }
helm lint --strict "$tgz" >/dev/null
helm template cdn-operator "$tgz" --namespace cdn-operator >"$work/helm-package.yaml"
cmp -s "$work/helm-package.yaml" "$work/helm-default.yaml" || { echo "the packaged chart renders differently from $chart"; exit 1; }
echo "ok helm package ${tgz##*/}: lints, renders as the chart's folder"
# The SBOM the release attaches: CycloneDX from Cargo.lock, every package in it.
trivy fs --quiet --skip-db-update --offline-scan --format cyclonedx --output "$work/sbom.cdx.json" Cargo.lock
"$py" scripts/artifact_checks.py sbom-covers-lock "$work/sbom.cdx.json" Cargo.lock

step "hadolint"
hadolint Dockerfile bundle/bundle.Dockerfile olm/catalog.Dockerfile
echo "ok hadolint"

if [ "${SKIP_IMAGE:-}" = 1 ]; then
  step "image: skipped (SKIP_IMAGE=1)"
else
  step "image: static release binary, buildah (vfs, chroot)"
  RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target x86_64-unknown-linux-gnu
  bin=target/x86_64-unknown-linux-gnu/release/cdn-operator
  # ldd says "statically linked" (or "not a dynamic executable") for a static binary.
  ldd "$bin" 2>&1 | grep -qE 'statically linked|not a dynamic executable' || { echo "$bin is dynamically linked"; exit 1; }
  env -i "$bin" version
  bah=(buildah --storage-driver vfs)
  tag=localhost/cdn-operator:check-$$
  "${bah[@]}" bud --isolation chroot --quiet --build-arg BINARY_FROM=prebuilt --platform linux/amd64 -t "$tag" . >/dev/null
  config=$("${bah[@]}" inspect --type image --format '{{.OCIv1.OS}}/{{.OCIv1.Architecture}} {{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$tag")
  # The image holds the binary and nothing else (no shell), and the binary runs from it.
  ctr=$("${bah[@]}" from "$tag")
  mkdir "$work/image-root"
  rootfs=$("${bah[@]}" mount "$ctr")
  files=$(cd "$rootfs" && find . -mindepth 1 | sort | tr '\n' ' ')
  version=$(env -i "$rootfs/cdn-operator" version)
  cp -a "$rootfs/." "$work/image-root/"
  "${bah[@]}" umount "$ctr" >/dev/null
  "${bah[@]}" rm "$ctr" >/dev/null
  "${bah[@]}" rmi "$tag" >/dev/null
  [ "$config" = 'linux/amd64 101:101 [/cdn-operator]' ] || { echo "unexpected image config: $config"; exit 1; }
  [ "$files" = './cdn-operator ' ] || { echo "unexpected files in the image: $files"; exit 1; }
  echo "ok image: user and entrypoint $config, only /cdn-operator, $version"
  # That filesystem run as a runtime runs it (tests/process/image.rs): chroot as 101 with
  # /etc/hosts and /etc/resolv.conf, the API server named in /etc/hosts, the OTLP collector by
  # DNS (dnsmasq on loopback), no CA files: the spans of a reconcile must arrive.
  CDN_OPERATOR_IMAGE_ROOT="$work/image-root" cargo test --locked --test process -- --ignored --exact \
    image::the_image_resolves_its_api_server_and_collector_by_name_and_delivers_spans
  echo "ok image: resolves host names through /etc/hosts and DNS, exports traces over http without CA files"
  # linux/arm64 from the same Dockerfile: a static aarch64 build with Debian's cross linker, run
  # under qemu-user, then the image of platform linux/arm64 (its prebuilt-arm64 stage).
  arm_start=$SECONDS
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --locked --target aarch64-unknown-linux-gnu
  arm_bin=target/aarch64-unknown-linux-gnu/release/cdn-operator
  file -b "$arm_bin" | grep -q 'ARM aarch64.*statically linked' || { echo "$arm_bin: $(file -b "$arm_bin")"; exit 1; }
  arm_version=$(env -i qemu-aarch64 "$arm_bin" version)
  echo "ok arm64 binary ($((SECONDS - arm_start))s to build): $arm_version under qemu-aarch64"
  atag=localhost/cdn-operator-arm64:check-$$
  "${bah[@]}" bud --isolation chroot --quiet --build-arg BINARY_FROM=prebuilt --platform linux/arm64 -t "$atag" . >/dev/null
  platform=$("${bah[@]}" inspect --type image --format '{{.OCIv1.OS}}/{{.OCIv1.Architecture}} {{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$atag")
  ctr=$("${bah[@]}" from "$atag")
  rootfs=$("${bah[@]}" mount "$ctr")
  image_arm_version=$(env -i qemu-aarch64 "$rootfs/cdn-operator" version)
  "${bah[@]}" umount "$ctr" >/dev/null
  "${bah[@]}" rm "$ctr" >/dev/null
  "${bah[@]}" rmi "$atag" >/dev/null
  [ "$platform" = 'linux/arm64 101:101 [/cdn-operator]' ] || { echo "unexpected arm64 image config: $platform"; exit 1; }
  echo "ok arm64 image: $platform, $image_arm_version"
  btag=localhost/cdn-operator-bundle:check-$$
  "${bah[@]}" bud --isolation chroot --quiet -f bundle/bundle.Dockerfile -t "$btag" bundle >/dev/null
  "${bah[@]}" rmi "$btag" >/dev/null
  echo "ok bundle image"
fi

step "all artifact checks passed"
