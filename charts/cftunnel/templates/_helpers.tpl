{{- /* The prefix of every object's name: fullnameOverride, else the release name. The pool's
Service is named after it, and a Service's name must be a DNS-1035 label (a lowercase letter
first, no dots), which a release name need not be: such a name fails here, before anything is
installed, rather than at the Service halfway through. */ -}}
{{- define "cftunnel.fullname" -}}
{{- $name := .Values.fullnameOverride | default .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- if .Values.fullnameOverride -}}
{{- fail (printf "fullnameOverride %q cannot name the chart's Services (%q): a Service name must be a DNS-1035 label, a lowercase letter first, then only lowercase letters, digits and '-'" .Values.fullnameOverride (printf "%s-proxy" $name)) -}}
{{- else -}}
{{- fail (printf "release name %q cannot name the chart's Services (%q): a Service name must be a DNS-1035 label, a lowercase letter first, then only lowercase letters, digits and '-'. Install under such a name, or set fullnameOverride to one" .Release.Name (printf "%s-proxy" $name)) -}}
{{- end -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- /* The name of a cluster-wide object of the release (`name`: `controller`, ...): the release
namespace, a dot, then the prefix and `name` as namespaced objects are named. Releases of one
name in two namespaces would otherwise share one object, and Helm refuse the second install.
Neither part holds a dot, so no two releases share a name. */ -}}
{{- define "cftunnel.clusterName" -}}
{{- printf "%s.%s-%s" .root.Release.Namespace (include "cftunnel.fullname" .root) .name -}}
{{- end -}}

{{- /* The controller's leader-election Lease: its flag and its Role name it alike. */ -}}
{{- define "cftunnel.leaseName" -}}
{{- include "cftunnel.fullname" . }}-controller
{{- end -}}

{{- define "cftunnel.labels" -}}
app.kubernetes.io/part-of: cftunnel
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- /* A pod template's labels: the chart's own and `name`, then the values' `extra`, which
       add to them but change none (written once each: a key twice is invalid YAML to strict
       readers). */ -}}
{{- define "cftunnel.podLabels" -}}
{{- $own := include "cftunnel.labels" .root | fromYaml -}}
{{- $_ := set $own "app.kubernetes.io/name" .name -}}
{{- toYaml (merge $own (.extra | default dict)) -}}
{{- end -}}

{{- define "cftunnel.controllerImage" -}}
{{ .Values.image.controller.repository }}:{{ .Values.image.controller.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cftunnel.proxyImage" -}}
{{ .Values.image.proxy.repository }}:{{ .Values.image.proxy.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cftunnel.controllerServiceAccount" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- .Values.controller.serviceAccount.name | default (printf "%s-controller" (include "cftunnel.fullname" .)) -}}
{{- else -}}
{{- .Values.controller.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "cftunnel.proxyServiceAccount" -}}
{{- if .Values.proxy.serviceAccount.create -}}
{{- .Values.proxy.serviceAccount.name | default (printf "%s-proxy" (include "cftunnel.fullname" .)) -}}
{{- else -}}
{{- .Values.proxy.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- /* The Secret with the class tunnel's connector token: the operator's, or the chart's when
the token is given as a value. Exactly one of the two. */ -}}
{{- define "cftunnel.proxyTunnelSecret" -}}
{{- $token := .Values.proxy.tunnelToken -}}
{{- if $token.existingSecret -}}
{{- if $token.value -}}
{{- fail "proxy.tunnelToken: set existingSecret or value, not both" -}}
{{- end -}}
{{- $token.existingSecret -}}
{{- else if $token.value -}}
{{- printf "%s-proxy-tunnel" (include "cftunnel.fullname" .) -}}
{{- else -}}
{{- fail "proxy.tunnelToken: existingSecret (a Secret with the class tunnel's connector token) or value (the token) is required" -}}
{{- end -}}
{{- end -}}

{{- define "cftunnel.proxyAuthSecret" -}}
{{- .Values.proxy.authToken.existingSecret | default (printf "%s-proxy-auth" (include "cftunnel.fullname" .)) -}}
{{- end -}}

{{- /* Probe timings from a component's values (`readinessProbe`, `livenessProbe`). */ -}}
{{- define "cftunnel.probeTimings" -}}
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
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

{{- /* The labels of proxy.networkPolicy's monitoring selectors (YAML maps; matchLabels only,
which values.schema.json enforces: the controller's flags carry labels, not expressions). */ -}}
{{- define "cftunnel.monitoringNamespaceLabels" -}}
{{- index .Values.proxy.networkPolicy.monitoringNamespaceSelector "matchLabels" | default dict | toYaml -}}
{{- end -}}

{{- define "cftunnel.monitoringPodLabels" -}}
{{- index .Values.proxy.networkPolicy.monitoringPodSelector "matchLabels" | default dict | toYaml -}}
{{- end -}}

{{- /* NetworkPolicy peers of the monitoring: its pods in the release namespace, its namespaces. */ -}}
{{- define "cftunnel.monitoringPeers" -}}
{{- with index .Values.proxy.networkPolicy.monitoringPodSelector "matchLabels" }}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ $.Release.Namespace | quote }}
  podSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- with index .Values.proxy.networkPolicy.monitoringNamespaceSelector "matchLabels" }}
- namespaceSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- end -}}

{{/*
The hostname ownership rule as CEL, for the ValidatingAdmissionPolicy: the controller's
`ownership::ADMISSION_EXPRESSION` (controller-core/src/translate/ownership.rs), character for
character; the chart's tests check that and evaluate it against the controller's rule.
*/}}
{{- define "cftunnel.hostnameOwnershipExpression" -}}
!has(object.spec.hostnames) || object.spec.hostnames.all(h, has(namespaceObject.metadata.labels) && namespaceObject.metadata.labels.exists(k, k.startsWith('hostnames.cf.k8s.lex.la/') && namespaceObject.metadata.labels[k] == 'true' && (h == k.substring(24) || h.endsWith('.' + k.substring(24)))))
{{- end -}}

{{- /* The ConfigMap in which the controller lists its Gateways and their ListenerSets, the
hostname-ownership admission policy's parameter; empty without that policy. */ -}}
{{- define "cftunnel.ownershipParents" -}}
{{- $own := .Values.controller.hostnameOwnership -}}
{{- if $own.enabled -}}
{{- if $own.admissionPolicy -}}
{{- include "cftunnel.fullname" . }}-hostname-ownership
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Whether a route names a parent the controller listed in the policy's parameter (params, the
ConfigMap above): the controller's `ownership_parents::ADMISSION_PARENTS_EXPRESSION`
(controller/src/runtime/ownership_parents.rs), character for character; the chart's tests
check that and evaluate it against the list the controller writes.
*/}}
{{- define "cftunnel.ownershipParentsExpression" -}}
has(object.spec.parentRefs) && has(params.data) && has(params.data.parents) && object.spec.parentRefs.exists(p, ('\n' + params.data.parents).contains('\n' + (((!has(p.group) || p.group == 'gateway.networking.k8s.io') && (!has(p.kind) || p.kind == 'Gateway')) ? 'Gateway' : ((((!has(p.group) || p.group == 'gateway.networking.k8s.io') && has(p.kind) && p.kind == 'ListenerSet') || (has(p.group) && p.group == 'gateway.networking.x-k8s.io' && has(p.kind) && p.kind == 'XListenerSet')) ? 'ListenerSet' : '-')) + '/' + (has(p.namespace) ? p.namespace : request.namespace) + '/' + p.name + '\n'))
{{- end -}}

{{- /* The OTEL_* variables of tracing.* for a container; none while tracing.endpoint is empty.
Resource attribute values are URL-encoded, as OTEL_RESOURCE_ATTRIBUTES requires. */ -}}
{{- define "cftunnel.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .ratio | toString | quote }}
{{- with .resourceAttributes }}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key (urlquery $value | replace "+" "%20")) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $pairs | quote }}
{{- end }}
{{- with .headers.existingSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.tracing.headers.key | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- /* The proxy's settings (proxy.*) as its environment: the shared pool runs with them, and
the controller gives them to every dedicated plane (--plane-env), so a region, post-quantum
key agreement or log format holds for every plane. Metrics stay the pool's own: a plane's
autoscaler reads its metrics. */ -}}
{{- define "cftunnel.proxySettings" -}}
{{- $p := .Values.proxy }}
{{- $s := dict }}
{{- $_ := set $s "RUST_LOG" ($p.logLevel | toString) }}
{{- $_ := set $s "PROXY_LOG_FORMAT" ($p.logFormat | toString) }}
{{- $_ := set $s "PROXY_ACCESS_LOG_ENABLED" ($p.accessLog.enabled | toString) }}
{{- $_ := set $s "PROXY_ACCESS_LOG_QUERY" ($p.accessLog.query | toString) }}
{{- $_ := set $s "PROXY_ACCESS_LOG_SAMPLE" ($p.accessLog.sampleEvery | int | toString) }}
{{- $_ := set $s "PROXY_TUNNEL_PROTOCOL" ($p.tunnel.protocol | toString) }}
{{- $_ := set $s "PROXY_TUNNEL_POST_QUANTUM" ($p.tunnel.postQuantum | toString) }}
{{- $_ := set $s "TUNNEL_EDGE_IP_VERSION" ($p.tunnel.edgeIpVersion | toString) }}
{{- with $p.tunnel.region }}
{{- $_ := set $s "TUNNEL_REGION" (. | toString) }}
{{- end }}
{{- $_ := set $s "PROXY_TUNNEL_QUIC_MAX_STREAMS" ($p.tunnel.quicMaxStreams | int | toString) }}
{{- $_ := set $s "PROXY_BACKEND_MAX_CONNECTIONS" ($p.backend.maxConnections | int | toString) }}
{{- $_ := set $s "PROXY_BACKEND_HEADER_TIMEOUT" ($p.backend.headerTimeout | toString) }}
{{- $_ := set $s "PROXY_REQUEST_BODY_TIMEOUT" ($p.requestBodyTimeout | toString) }}
{{- $_ := set $s "PROXY_SEND_TIMEOUT" ($p.sendTimeout | toString) }}
{{- $_ := set $s "PROXY_WEBSOCKET_IDLE_TIMEOUT" ($p.websocketIdleTimeout | toString) }}
{{- with .Values.clusterCIDRs }}
{{- $_ := set $s "PROXY_CLUSTER_CIDRS" (join "," .) }}
{{- end }}
{{- toYaml $s }}
{{- end -}}
