{{/*
Labels on every object. app.kubernetes.io/part-of is deploy/kustomization.yaml's, on every
object as kustomize puts it; the other four are the ones Helm's own starter chart puts on every
object (`helm create`), which a Helm user's tooling expects: tests/tests/chart.rs removes exactly
these four before it compares the chart with deploy/. They are never put in selectors or on the
pod template: a selector cannot change after install, and a version label there would restart
every agent on an upgrade that changes nothing else.
*/}}
{{- define "observer.labels" -}}
app.kubernetes.io/part-of: observer
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The agent's pods, as the DaemonSet, the Service, the NetworkPolicy and the kubectl plugin
(--agent-selector) select them. */}}
{{- define "observer.selector" -}}
app.kubernetes.io/name: observer
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

{{/* The agent's service account, as the API server names its user (the admission policy). */}}
{{- define "observer.user" -}}
system:serviceaccount:{{ .Values.namespace.name }}:observer
{{- end }}
