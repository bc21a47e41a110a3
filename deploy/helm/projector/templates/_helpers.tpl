{{/* The chart's name, or nameOverride. */}}
{{- define "projector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the release name when it already contains the chart's name. */}}
{{- define "projector.fullname" -}}
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

{{- define "projector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "projector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "projector.labels" -}}
{{ include "projector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: projector
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A probe's timings from values (the defaults in values.yaml: probes.<which>). */}}
{{- define "projector.probeTimings" -}}
{{- range $k := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "failureThreshold" "successThreshold" }}
{{- with index $ $k }}
{{ $k }}: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "projector.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "projector.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "projector.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespaces projector never writes a Secret or ConfigMap into, comma-separated: the
protectedNamespaces value plus the release's own namespace (always), each once. The
controller's --protected-namespaces and the admission policy both read this one list. */}}
{{- define "projector.protectedNamespaces" -}}
{{- concat .Values.protectedNamespaces (list .Release.Namespace) | uniq | join "," }}
{{- end }}

{{/* projector's ServiceAccount as a FlowSchema subject. */}}
{{- define "projector.flowSubject" -}}
kind: ServiceAccount
serviceAccount:
  name: {{ include "projector.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
