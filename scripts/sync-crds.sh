#!/usr/bin/env bash
# Writes every shipped copy of the CRDs from their single source, `cdn-operator crd` (generated
# from src/api/): one file per CRD, named <group>_<plural>.yaml as OLM bundles expect, into
#   kustomize/base/crds/, helm/cdn-operator/files/crds/ and bundle/manifests/.
# It also copies the Grafana dashboards and the PrometheusRule of kustomize/components/ into the
# Helm chart's files/ (Helm cannot read outside its chart), the metrics Service (with OpenShift's
# serving-certificate annotation), the PodDisruptionBudget and the empty Secret of the purge key
# into bundle/manifests/ (OLM installs bundle objects of these kinds as they are), the
# PrometheusRule into olm/monitoring/ (not in the bundle: OLM fails an install whose kinds the
# cluster lacks) with the PodMonitor, then regenerates the catalog's bundle properties.
# tests/shipped_artifacts.rs fails when any copy differs from its source; run this to fix it.
# usage: scripts/sync-crds.sh [path/to/cdn-operator]   (default: cargo run)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ]; then
  stream=$("$1" crd)
else
  stream=$(cargo run --quiet --locked --bin cdn-operator -- crd)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Split the multi-document stream on `---`; name each file from metadata.name (<plural>.<group>).
printf '%s\n' "$stream" | awk -v dir="$tmp" '
  BEGIN { n = 0 }
  /^---$/ { n++; next }
  { doc[n] = doc[n] $0 "\n" }
  /^  name: / && !(n in name) { name[n] = $2 }
  END {
    for (i = 0; i <= n; i++) {
      if (!(i in name)) { print "a CRD without metadata.name" > "/dev/stderr"; exit 1 }
      dot = index(name[i], ".")
      file = dir "/" substr(name[i], dot + 1) "_" substr(name[i], 1, dot - 1) ".yaml"
      printf "%s", doc[i] > file
    }
  }'
for dest in kustomize/base/crds helm/cdn-operator/files/crds bundle/manifests; do
  mkdir -p "$dest"
  # Only CRD copies are replaced: bundle/manifests also holds the ClusterServiceVersion.
  find "$dest" -maxdepth 1 -name '*_*.yaml' ! -name '*clusterserviceversion*' -delete
  cp "$tmp"/*.yaml "$dest/"
done
for f in "$tmp"/*.yaml; do echo "synced ${f##*/}"; done
mkdir -p helm/cdn-operator/files/dashboards
cp kustomize/components/grafana-dashboards/cdn-operator.json kustomize/components/grafana-dashboards/cdn-clusters.json \
  helm/cdn-operator/files/dashboards/
cp kustomize/components/prometheus/prometheus_rule.yaml helm/cdn-operator/files/
echo "synced the dashboards and the PrometheusRule into helm/cdn-operator/files/"
# The annotation goes first in metadata (tests/shipped_artifacts.rs expects exactly this text).
sed '0,/^  labels:$/s//  annotations:\
    # OpenShift'"'"'s service CA writes a certificate for this Service into this Secret (inert\
    # elsewhere); olm\/monitoring\/openshift scrapes with it (docs\/install.md, OLM).\
    service.beta.openshift.io\/serving-cert-secret-name: cdn-operator-metrics-cert\
  labels:/' kustomize/base/metrics_service.yaml >bundle/manifests/cdn-operator-metrics.service.yaml
cp kustomize/base/pod_disruption_budget.yaml bundle/manifests/cdn-operator.poddisruptionbudget.yaml
cp kustomize/base/purge_signing_secret.yaml bundle/manifests/cdn-operator-purge-signing.secret.yaml
cp kustomize/components/prometheus/prometheus_rule.yaml kustomize/components/prometheus/pod_monitor.yaml \
  olm/monitoring/prometheus-operator/
echo "synced the metrics Service, PodDisruptionBudget and purge key Secret into bundle/manifests/, the PrometheusRule and PodMonitor into olm/monitoring/"
"${PYTHON:-python3}" scripts/artifact_checks.py catalog-properties --write
