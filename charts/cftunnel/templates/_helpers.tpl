{{- define "cftunnel.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "cftunnel.labels" -}}
app.kubernetes.io/part-of: cftunnel
app.kubernetes.io/instance: {{ .Release.Name }}
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
