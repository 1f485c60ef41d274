{{/*
Names and labels shared by every template of the chart.
*/}}

{{/* Name of the chart, overridable with nameOverride. */}}
{{- define "kneepoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fully qualified name: <release>-kneepoint, or the release name alone when it already
contains the chart name (helm install kneepoint ...). 63 characters at most (DNS label).
*/}}
{{- define "kneepoint.fullname" -}}
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

{{/* Labels on every object of the release. */}}
{{- define "kneepoint.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kneepoint.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kneepoint
{{- end -}}

{{/* Labels the operator Deployment selects its pod by (immutable once installed). */}}
{{- define "kneepoint.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kneepoint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "kneepoint.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kneepoint.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image reference; the tag defaults to the chart's appVersion. */}}
{{- define "kneepoint.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Image of load-test Jobs and Simulate-mode engines (KNEEPOINT_IMAGE). */}}
{{- define "kneepoint.workloadImage" -}}
{{- default (include "kneepoint.image" .) .Values.workloadImage -}}
{{- end -}}

{{/* Image of the node probe; defaults to the operator's. */}}
{{- define "kneepoint.probeImage" -}}
{{- $repo := default .Values.image.repository .Values.probe.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.probe.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* The node probe's pod labels (the builders' labels). */}}
{{- define "kneepoint.probe.podLabels" -}}
app.kubernetes.io/name: kneepoint-probe
app.kubernetes.io/component: node-probe
app.kubernetes.io/part-of: kneepoint
{{- end -}}

{{/* The node probe's object labels: the builders' plus the release's. */}}
{{- define "kneepoint.probe.labels" -}}
{{ include "kneepoint.probe.podLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The install notes (NOTES.txt prints them; a named template so the contract tests can render them).
*/}}
{{- define "kneepoint.notes" -}}
{{- $mon := .Values.monitoring -}}
kneepoint {{ .Chart.AppVersion }} is installed in namespace {{ .Release.Namespace }}.

Watching: {{ if .Values.watchNamespaces }}{{ join ", " .Values.watchNamespaces }}{{ else }}all namespaces{{ end }}
Prometheus: {{ .Values.prometheus.url }}
{{- if or $mon.operator.serviceMonitor.enabled $mon.engines.podMonitor.enabled $mon.dcgmExporter.serviceMonitor.enabled }}
Monitors (ServiceMonitor/PodMonitor) carry the labels: {{ range $k, $v := $mon.labels }}{{ $k }}={{ $v }} {{ end }}
  kube-prometheus-stack's Prometheus selects only monitors labelled release=<its Helm release
  name>; if yours is not "{{ $mon.labels.release | default "" }}", set monitoring.labels.release to it, or
  no engine is scraped and every tier waits for metrics.
{{- else }}
Monitors: none (monitoring.*.enabled are false). Prometheus at the URL above must scrape the
  engine pods some other way (deploy/prometheus/scrape-config.yaml), or every tier decides
  without the metrics its rules need.
{{- end }}

Check the operator:
  kubectl -n {{ .Release.Namespace }} get deploy/{{ include "kneepoint.fullname" . }}
  kubectl -n {{ .Release.Namespace }} logs deploy/{{ include "kneepoint.fullname" . }}

Run an experiment (spec.mode: Simulate runs the same ladder on the engine simulator,
without GPUs; the examples are in deploy/examples/):
  kubectl apply -f deploy/examples/experiment.yaml
  kubectl get parallelismexperiments -w
{{- end }}
