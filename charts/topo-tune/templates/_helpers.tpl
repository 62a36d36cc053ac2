{{/*
Names. Kubernetes names are limited to 63 characters; suffixes are added after truncation.
*/}}
{{- define "topo-tune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "topo-tune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "topo-tune.controller.fullname" -}}
{{- printf "%s-controller" (include "topo-tune.fullname" .) }}
{{- end }}

{{- define "topo-tune.agent.fullname" -}}
{{- printf "%s-agent" (include "topo-tune.fullname" .) }}
{{- end }}

{{- define "topo-tune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels. Selector labels never change after install (they are immutable in Deployments and DaemonSets).
*/}}
{{- define "topo-tune.labels" -}}
helm.sh/chart: {{ include "topo-tune.chart" . }}
{{ include "topo-tune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: topo-tune
{{- end }}

{{- define "topo-tune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "topo-tune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "topo-tune.controller.selectorLabels" -}}
{{ include "topo-tune.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "topo-tune.agent.selectorLabels" -}}
{{ include "topo-tune.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "topo-tune.controller.labels" -}}
{{ include "topo-tune.labels" . }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "topo-tune.agent.labels" -}}
{{ include "topo-tune.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/*
Images: the tag defaults to the chart's appVersion.
*/}}
{{- define "topo-tune.controller.image" -}}
{{- $img := .Values.image.controller }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}

{{- define "topo-tune.agent.image" -}}
{{- $img := .Values.image.agent }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}

{{/*
Secrets and addresses.
*/}}
{{- define "topo-tune.tokenSecretName" -}}
{{- default (printf "%s-token" (include "topo-tune.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "topo-tune.agentTLSSecretName" -}}
{{- default .Values.tls.existingSecret .Values.tls.agentExistingSecret }}
{{- end }}

{{- define "topo-tune.controllerAddress" -}}
{{- if .Values.agent.controllerAddress }}
{{- .Values.agent.controllerAddress }}
{{- else }}
{{- printf "%s.%s.svc:%d" (include "topo-tune.controller.fullname" .) .Release.Namespace (int .Values.controller.ports.grpc) }}
{{- end }}
{{- end }}

{{/*
In-container paths. Secrets are mounted as directories (never subPath) so that rotated Secrets reach
running pods.
*/}}
{{- define "topo-tune.tokenFile" -}}/etc/topo-tune/auth/{{ .Values.auth.secretKey }}{{- end }}
{{- define "topo-tune.tlsDir" -}}/etc/topo-tune/tls{{- end }}
{{- define "topo-tune.configFile" -}}/etc/topo-tune/config/cluster.yaml{{- end }}
{{- define "topo-tune.sqliteDir" -}}/var/lib/topo-tune{{- end }}

{{/*
Client flags for anything that dials the controller (agent, helm test).
*/}}
{{- define "topo-tune.clientTLSArgs" -}}
{{- if .Values.tls.enabled }}
- --tls-ca
- {{ include "topo-tune.tlsDir" . }}/ca.crt
{{- if .Values.tls.requireClientCert }}
- --tls-cert
- {{ include "topo-tune.tlsDir" . }}/tls.crt
- --tls-key
- {{ include "topo-tune.tlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/*
Environment every topo-tune process of the release gets (read by the `topo-tune` command group).
*/}}
{{- define "topo-tune.loggingEnv" -}}
- name: TOPO_TUNE_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: TOPO_TUNE_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
{{- end }}

{{/*
Leader election: on with more than one controller replica ("true"), else "". With it, only the holder of
the Lease (named after the release's controller, so two releases in one namespace never share one) serves
agents and admins and reports Ready.
*/}}
{{- define "topo-tune.leaderElection" -}}
{{- if gt (int .Values.controller.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
gRPC health service the controller's readiness probe asks for: SERVING only while this replica leads
(always, with one replica). Liveness asks for "" (the process), which a standby also serves.
*/}}
{{- define "topo-tune.readinessService" -}}
{{- if not (include "topo-tune.leaderElection" .) }}topo_tune.v1.AgentService{{ end }}
{{- end }}
