{{/* The name of every object of the release: fullnameOverride, else <release>-<nameOverride or
cdn-operator> (the release name alone when it already contains that name). */}}
{{- define "cdn-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* app.kubernetes.io/name stays cdn-operator: the ServiceMonitor turns it into job="cdn-operator",
which the dashboard and the alerts select on. */}}
{{- define "cdn-operator.selectorLabels" -}}
app.kubernetes.io/name: cdn-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cdn-operator.ownLabels" -}}
{{ include "cdn-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cdn-operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels of every object: the chart's over commonLabels (one key each, the chart's win). */}}
{{- define "cdn-operator.labels" -}}
{{- toYaml (merge (include "cdn-operator.ownLabels" . | fromYaml) (deepCopy (.Values.commonLabels | default dict))) -}}
{{- end -}}

{{/* The namespace of the release's objects: namespaceOverride (for umbrella charts), else the
release's. */}}
{{- define "cdn-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The operator's ServiceAccount: the chart's (named serviceAccount.name, else the full name),
or an existing one (serviceAccount.create=false), which must then be named. */}}
{{- define "cdn-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cdn-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.create=false needs serviceAccount.name: the existing ServiceAccount the operator runs as" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespace the operator manages in single-namespace mode. */}}
{{- define "cdn-operator.watchNamespace" -}}
{{- default (include "cdn-operator.namespace" .) .Values.singleNamespace.namespace -}}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}: global.imageRegistry replaces
the registry (a mirror), an empty registry leaves the repository as written; the digest wins over
the tag. Called with (list $ .Values.image). */}}
{{- define "cdn-operator.imageRef" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $registry := (($root.Values.global | default dict).imageRegistry) | default $image.registry -}}
{{- $name := $image.repository -}}
{{- if $registry -}}
{{- $name = printf "%s/%s" (trimSuffix "/" $registry) $image.repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "cdn-operator.image" -}}
{{- include "cdn-operator.imageRef" (list . .Values.image) -}}
{{- end -}}

{{/* A probe of the operator's health port: the chart's handler, the user's timings (enabled
aside). Called with (list PATH VALUES). */}}
{{- define "cdn-operator.probe" -}}
httpGet:
  path: {{ index . 0 }}
  port: health
{{ toYaml (omit (index . 1) "enabled") }}
{{- end -}}

{{/* The release notes (NOTES.txt); a named template so that scripts/check-artifacts.sh can render
them with `helm template`, which skips NOTES.txt. */}}
{{- define "cdn-operator.notes" -}}
cdn-operator {{ .Chart.AppVersion }} is installed in namespace {{ include "cdn-operator.namespace" . }}
{{- if .Values.singleNamespace.enabled }}, managing namespace {{ include "cdn-operator.watchNamespace" . }} only (Role).
{{- else }}, managing every namespace (ClusterRole).
{{- end }}

Check that the operator is ready:
  kubectl -n {{ include "cdn-operator.namespace" . }} get deployment {{ include "cdn-operator.fullname" . }}
  helm test {{ .Release.Name }} -n {{ .Release.Namespace }}   # its Service answers /readyz
{{- if .Values.leaderElection.enabled }}
  kubectl -n {{ include "cdn-operator.namespace" . }} get lease {{ .Values.leaderElection.id }}   # the leader replica
{{- end }}

Create a CdnCluster and see it deployed:
  kubectl apply -n {{ include "cdn-operator.watchNamespace" . }} -f - <<'YAML'
  apiVersion: cluster.anevia.com/v1
  kind: CdnCluster
  metadata: {name: cache-live}
  spec: {role: cache, sources: []}
  YAML
  kubectl -n {{ include "cdn-operator.watchNamespace" . }} get cdn,at
{{- if .Values.crds.install }}

{{ if .Values.crds.keep -}}
The CRDs stay on `helm uninstall` (helm.sh/resource-policy: keep), and with them every CdnCluster,
CdnPurge and At. To remove those too: kubectl delete crd cdnclusters.cluster.anevia.com cdnpurges.cluster.anevia.com ats.cnat.programming-kubernetes.info
{{- else -}}
The CRDs are deleted on `helm uninstall`, and with them every CdnCluster, CdnPurge and At of the cluster.
{{- end }}
{{- end }}
{{- if or .Values.metrics.serviceMonitor.enabled .Values.cdnMetrics.podMonitor.enabled .Values.prometheusRule.enabled .Values.dashboards.enabled }}

Monitoring:
{{- if .Values.metrics.serviceMonitor.enabled }}
  - ServiceMonitor {{ include "cdn-operator.fullname" . }} (job="cdn-operator")
{{- end }}
{{- if .Values.cdnMetrics.podMonitor.enabled }}
  - PodMonitor {{ include "cdn-operator.fullname" . }}-cdnclusters (job="cdncluster"): the nginx pods' metrics sidecars
{{- end }}
{{- if .Values.prometheusRule.enabled }}
  - PrometheusRule {{ include "cdn-operator.fullname" . }}; runbooks: https://github.com/anevia/cdn-operator/blob/main/docs/runbooks.md
{{- end }}
{{- if .Values.dashboards.enabled }}
  - Grafana dashboard ConfigMap {{ include "cdn-operator.fullname" . }}-dashboard in {{ default (include "cdn-operator.namespace" .) .Values.dashboards.namespace }}
{{- end }}
{{- end }}
{{- end -}}
