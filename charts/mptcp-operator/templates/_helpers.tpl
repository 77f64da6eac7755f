{{/*
Names and labels shared by every object. Object names are fixed ("mptcp-agent",
"mptcp-controller"): the CRDs, the agents' pins on every node and the
cluster-scoped admission policies allow one installation per cluster anyway.
*/}}

{{- define "mptcp-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mptcp-operator
{{- range $key, $_ := .Values.commonLabels }}
{{- if regexMatch "^(app\\.kubernetes\\.io|helm\\.sh)/" $key }}
{{- fail (printf "commonLabels: %s is a label the chart sets itself; choose another key" $key) }}
{{- end }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select one component's pods; call with (list $ "agent"). */}}
{{- define "mptcp-operator.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
A pod template's metadata: the component's labels, which its selector needs and
which no key of podLabels replaces, with the component's podLabels and
podAnnotations; call with (list $ "agent" .Values.agent).
*/}}
{{- define "mptcp-operator.podMetadata" -}}
{{- $values := index . 2 -}}
{{- $labels := merge (include "mptcp-operator.componentLabels" (list (index . 0) (index . 1)) | fromYaml) ($values.podLabels | default dict) -}}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Every label of one component's objects; call with (list $ "agent"). */}}
{{- define "mptcp-operator.componentLabels" -}}
{{ include "mptcp-operator.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}; call with (list $ .Values.agent.image).
global.imageRegistry, when set, takes the place of the repository's registry (its first
component when that has a dot or a port or is localhost, as the container runtimes read
it), so that one value moves every image to a mirror. The tag defaults to the chart's
appVersion, which `make images` tags its images with; a digest, when given, pins the
image whatever the tag says.
*/}}
{{- define "mptcp-operator.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $repository := $image.repository -}}
{{- $registry := (($root.Values.global | default dict).imageRegistry) | default "" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" $registry $repository -}}
{{- end -}}
{{- $ref := printf "%s:%s" $repository (default $root.Chart.AppVersion $image.tag) -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $ref $image.digest -}}
{{- end -}}
{{- $ref -}}
{{- end }}

{{/*
The API server's address for the agent and the controller when it is not the
in-cluster Service: the agent must reach the API server before kube-proxy (or a
CNI replacing it) programs Service addresses, and in clusters without either.
client-go's in-cluster configuration reads these two variables.
*/}}
{{- define "mptcp-operator.apiServerEnv" -}}
{{- if .Values.apiServer.host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | quote }}
{{- end -}}
{{- end }}

{{/* The agent's Kubernetes user name, which its admission policies match. */}}
{{- define "mptcp-operator.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ .Values.agent.serviceAccount.name }}
{{- end }}

{{/*
Keys a later chart added are optional in the schema and defaulted here, so that
`helm upgrade --reuse-values` from a release whose values lack them renders: Helm
then keeps the previous chart's values, without the new chart's defaults
(docs/install.md, "Upgrade"). Each returns "true" or "false".
*/}}
{{- define "mptcp-operator.webhookEnabled" -}}
{{- dig "enabled" false (.Values.webhook | default dict) -}}
{{- end }}

{{- define "mptcp-operator.metricsAuthEnabled" -}}
{{- dig "metricsAuth" "enabled" false .Values.agent -}}
{{- end }}

{{- define "mptcp-operator.controllerMetricsAuthEnabled" -}}
{{- dig "metricsAuth" "enabled" false .Values.controller -}}
{{- end }}
