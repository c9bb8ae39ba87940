{{/* The DaemonSet's name: the release's, with the chart's unless it holds it. */}}
{{- define "portmap.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels that select the pods: the same as deploy/portmap.yaml's, so
that a DaemonSet applied from it keeps its (immutable) selector. */}}
{{- define "portmap.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
{{- end -}}

{{/* The image: repository@digest, or repository:tag (the chart's appVersion
without a tag). */}}
{{- define "portmap.image" -}}
{{- with .Values.image -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (.tag | default $.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The agent's metrics address, HOST:PORT ([HOST]:PORT for IPv6). */}}
{{- define "portmap.metricsAddr" -}}
{{- $a := .Values.agent.metrics.address | toString -}}
{{- if contains ":" $a -}}
{{- printf "[%s]:%v" $a .Values.agent.metrics.port -}}
{{- else -}}
{{- printf "%s:%v" $a .Values.agent.metrics.port -}}
{{- end -}}
{{- end -}}

{{/* Where the kubelet probes the agent from the node: the metrics address,
its loopback where it listens on every address. */}}
{{- define "portmap.probeHost" -}}
{{- $a := .Values.agent.metrics.address | toString -}}
{{- if eq $a "0.0.0.0" "" -}}
127.0.0.1
{{- else if eq $a "::" -}}
"::1"
{{- else if contains ":" $a -}}
{{ $a | quote }}
{{- else -}}
{{ $a }}
{{- end -}}
{{- end -}}

{{/* portmap-agent sync's arguments. */}}
{{- define "portmap.agentArgs" -}}
{{- $args := list "sync" "--watch" -}}
{{- if .Values.agent.prune -}}{{- $args = append $args "--prune" -}}{{- end -}}
{{- $args = concat $args (list "--root" "/host") -}}
{{- if ne .Values.cniCacheDir "/var/lib/cni" -}}{{- $args = concat $args (list "--cache-dir" .Values.cniCacheDir) -}}{{- end -}}
{{- $args = concat $args (list "--metrics-addr" (include "portmap.metricsAddr" .)) -}}
{{- with .Values.agent.minSyncPeriod -}}{{- $args = concat $args (list "--min-sync-period" .) -}}{{- end -}}
{{- with .Values.agent.interval -}}{{- $args = concat $args (list "--interval" .) -}}{{- end -}}
{{- with .Values.agent.logFormat -}}{{- $args = concat $args (list "--log-format" .) -}}{{- end -}}
{{- $args = concat $args .Values.agent.extraArgs -}}
{{- include "portmap.flow" $args -}}
{{- end -}}

{{/* A list of strings as a YAML flow sequence: ["a", "b"]. */}}
{{- define "portmap.flow" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s | toString | quote }}{{ end }}]
{{- end -}}
