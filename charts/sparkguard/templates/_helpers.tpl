{{/* Chart name, truncated to 63 characters. */}}
{{- define "sparkguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release already contains the chart name. */}}
{{- define "sparkguard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sparkguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "sparkguard.labels" -}}
helm.sh/chart: {{ include "sparkguard.chart" . }}
{{ include "sparkguard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the operator pod. */}}
{{- define "sparkguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sparkguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "sparkguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sparkguard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sparkguard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "sparkguard.sidecarImage" -}}
{{- $repo := default .Values.image.repository .Values.sidecar.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.sidecar.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{- define "sparkguard.webhookServiceName" -}}
{{- printf "%s-webhook" (include "sparkguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sparkguard.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "sparkguard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The operator's identity as the API server sees it (the webhook lets its patches pass). */}}
{{- define "sparkguard.operatorUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "sparkguard.serviceAccountName" .) }}
{{- end }}

{{/*
The webhook's namespaceSelector: webhook.namespaceSelector, plus the watched namespaces
(operator.watchNamespaces, by their kubernetes.io/metadata.name label) when they are listed.
*/}}
{{- define "sparkguard.webhookNamespaceSelector" -}}
{{- $selector := deepCopy (default dict .Values.webhook.namespaceSelector) }}
{{- if .Values.operator.watchNamespaces }}
{{- $watched := dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .Values.operator.watchNamespaces }}
{{- $_ := set $selector "matchExpressions" (append (default list $selector.matchExpressions) $watched) }}
{{- end }}
{{- if $selector }}
{{- toYaml $selector }}
{{- end }}
{{- end }}
