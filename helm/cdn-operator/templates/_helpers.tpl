{{/* The name of every object of the release. */}}
{{- define "cdn-operator.fullname" -}}
{{- if contains "cdn-operator" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-cdn-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* app.kubernetes.io/name stays cdn-operator: the ServiceMonitor turns it into job="cdn-operator",
which the dashboard and the alerts select on. */}}
{{- define "cdn-operator.selectorLabels" -}}
app.kubernetes.io/name: cdn-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cdn-operator.labels" -}}
{{ include "cdn-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cdn-operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cdn-operator.serviceAccountName" -}}
{{- default (include "cdn-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The namespace the operator manages in single-namespace mode. */}}
{{- define "cdn-operator.watchNamespace" -}}
{{- default .Release.Namespace .Values.singleNamespace.namespace -}}
{{- end -}}

{{- define "cdn-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
