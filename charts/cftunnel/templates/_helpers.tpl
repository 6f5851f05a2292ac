{{- define "cftunnel.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "cftunnel.labels" -}}
app.kubernetes.io/part-of: cftunnel
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cftunnel.controllerImage" -}}
{{ .Values.image.controller.repository }}:{{ .Values.image.controller.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cftunnel.proxyImage" -}}
{{ .Values.image.proxy.repository }}:{{ .Values.image.proxy.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cftunnel.proxyAuthSecret" -}}
{{- .Values.proxy.authToken.existingSecret | default (printf "%s-proxy-auth" (include "cftunnel.fullname" .)) -}}
{{- end -}}

{{- /* Pod scheduling from a component's values (proxy or controller): priority, nodes,
tolerations, affinity, spread; `selector` labels the component's pods for the default spread. */ -}}
{{- define "cftunnel.scheduling" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .values.topologySpreadConstraints | nindent 2 }}
{{- else if .values.spreadAcrossNodes }}
# Replicas on different nodes, and zones, where the scheduler can: one going away takes one.
# (Constraints replace the scheduler's own spreading, which covers both.) Counted per
# ReplicaSet, so a rollout's old pods do not skew where the new ones go.
topologySpreadConstraints:
  {{- range list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - maxSkew: 1
    topologyKey: {{ . }}
    whenUnsatisfiable: ScheduleAnyway
    matchLabelKeys: ["pod-template-hash"]
    labelSelector:
      matchLabels:
        {{- toYaml $.selector | nindent 8 }}
  {{- end }}
{{- end }}
{{- end -}}
