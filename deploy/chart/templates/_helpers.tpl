{{/*
The chart's name (nameOverride) and the release's full name (fullnameOverride), as Helm's starter
chart derives them: the full name is the release's name when that contains the chart's name
(release observer: observer, deploy/'s names), else <release>-<name>. Every object's name is
derived from it, the cluster-scoped ones included, so that a second release (a canary) renames
all of them and collides with nothing of the first.
*/}}
{{- define "observer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "observer.fullname" -}}
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

{{/*
Labels on every object's metadata. app.kubernetes.io/part-of is deploy/kustomization.yaml's, on
every object as kustomize puts it; the other four are the ones Helm's own starter chart puts on
every object (`helm create`), which a Helm user's tooling expects: tests/tests/chart.rs removes
exactly these four before it compares the chart with deploy/. The version labels are never put
in selectors or on the pod template: a selector cannot change after install, and a version label
there would restart every agent on an upgrade that changes nothing else.
*/}}
{{- define "observer.labels" -}}
app.kubernetes.io/part-of: observer
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The release's agent pods, as the DaemonSet, the Service, the NetworkPolicy and the
monitors select them: the name (deploy/'s selector) and the release, so that a second release's
selectors never take the first one's pods, even in the same namespace. */}}
{{- define "observer.selector" -}}
app.kubernetes.io/name: {{ include "observer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The agent's service account: serviceAccount.name, else the full name (never the namespace's
`default`: the admission policies match this account's requests, and no other pod should make
them). */}}
{{- define "observer.serviceAccountName" -}}
{{- default (include "observer.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The agent's service account, as the API server names its user (the admission policies'
matchConditions). */}}
{{- define "observer.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "observer.serviceAccountName" . }}
{{- end }}

{{/* The priority class the agent runs at: priorityClassName (an existing class: the chart then
makes none), else the chart's own class when it makes one (<fullname>-node-agent), else none. */}}
{{- define "observer.priorityClassName" -}}
{{- if .Values.priorityClassName }}
{{- .Values.priorityClassName }}
{{- else if .Values.priorityClass.create }}
{{- printf "%s-node-agent" (include "observer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The mode's ConfigMap's data: the ConfigMap renders it, the pod template carries its
checksum (a mode change rolls the agents, nothing else about the ConfigMap does). */}}
{{- define "observer.configData" -}}
# conditions: two observer-owned pod conditions beside kubelet's (<prefix>/ContainersAlive,
# <prefix>/OOMKilled) and Events; audit: Events only; full: the whole pod status, where
# nothing else writes it; off: nothing reaches the API.
statusMode: {{ .Values.statusMode | quote }}
conditionPrefix: {{ .Values.conditionPrefix | quote }}
{{- end }}

{{/* host:port of --listen; an IPv6 address in brackets. */}}
{{- define "observer.listen" -}}
{{- if contains ":" (toString .Values.listen.address) -}}
[{{ .Values.listen.address }}]:{{ int .Values.listen.port }}
{{- else -}}
{{ .Values.listen.address }}:{{ int .Values.listen.port }}
{{- end -}}
{{- end }}

{{/* Where kubelet's probes connect: the pod's IP (no host) when the agent listens on every
address, else the one address it listens on. */}}
{{- define "observer.probeHost" -}}
{{- $a := toString .Values.listen.address -}}
{{- if not (has $a (list "" "0.0.0.0" "::")) -}}
{{ $a }}
{{- end -}}
{{- end }}

{{/* The series of this release's agents as the monitors below label them (honorLabels keeps the
metrics' own namespace and pod labels, which name the pods the agents watch; the target's
namespace label is the agents' only where a metric has none of its own, as every metric the
alerts read). */}}
{{- define "observer.alertSelector" -}}
{{- if .Values.prometheusRule.selector -}}
{{ .Values.prometheusRule.selector }}
{{- else -}}
job="{{ include "observer.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end -}}
{{- end }}

{{/* A Kubernetes memory quantity (128Mi, 1G, 134217728) in bytes, for the memory alert. */}}
{{- define "observer.bytes" -}}
{{- $q := toString . -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $n := regexFind "^[0-9]+" $q -}}
{{- $unit := trimPrefix $n $q -}}
{{- if or (eq $n "") (not (hasKey $units $unit)) -}}
{{- fail (printf "prometheusRule: resources.limits.memory %q is not a whole number of bytes, Ki, Mi, Gi, Ti, k, M, G or T" $q) -}}
{{- end -}}
{{- mul (int64 $n) (get $units $unit) -}}
{{- end }}
