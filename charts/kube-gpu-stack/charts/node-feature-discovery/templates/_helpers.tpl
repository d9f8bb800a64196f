{{/*
nfd.fullname: the name prefix of every NFD object. It is the upstream NFD chart's, so a cluster moving from the GPU
Operator (which installs that chart as a subchart under the same release name) keeps its object names:
<release>-node-feature-discovery-master, -worker, -gc (or <release>-master, ... when the release name already
contains node-feature-discovery). The prefix is cut to 40 characters so every suffixed name stays valid.
*/}}
{{- define "nfd.fullname" -}}
{{- $name := "node-feature-discovery" -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* nfd.port: the one HTTP port each NFD daemon serves /metrics and /healthz on (-port) */}}
{{- define "nfd.port" -}}8080{{- end }}

{{/*
nfd.container: an NFD daemon's container. NFD needs no privileges: it runs as the image's non-root user with a
read-only root filesystem and no capabilities. dict:
  ctx        the chart's context
  name       container name
  command    the daemon (nfd-master, nfd-worker, nfd-gc)
  args       its flags (the chart adds -port)
  env        optional env map
  mounts     optional volume mounts
  resources  the component's resources (the common `resources` key, when set, wins)
  probes     map of probe kind (startupProbe, livenessProbe, readinessProbe) -> extra probe fields
*/}}
{{- define "nfd.container" -}}
{{- $port := include "nfd.port" .ctx | int -}}
{{- $spec := dict
  "ports" (list (dict "name" "http" "containerPort" $port "protocol" "TCP"))
  "resources" (.resources | default dict)
-}}
{{- range $kind, $extra := .probes -}}
{{- $_ := set $spec $kind (merge (dict "httpGet" (dict "path" "/healthz" "port" "http")) $extra) -}}
{{- end -}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" .name
  "image" (include "gpu-stack-lib.image" (dict "ctx" .ctx "image" .ctx.Values.image))
  "main" true
  "command" (list .command)
  "args" (concat .args (list (printf "-port=%d" $port)))
  "env" .env
  "volumeMounts" .mounts
  "securityContext" (dict
    "allowPrivilegeEscalation" false
    "readOnlyRootFilesystem" true
    "runAsNonRoot" true
    "capabilities" (dict "drop" (list "ALL"))
    "seccompProfile" (dict "type" "RuntimeDefault"))
  "spec" $spec
) -}}
{{- end }}

{{/* nfd.masterConfig: nfd-master.conf as ConfigMap data */}}
{{- define "nfd.masterConfig" -}}
nfd-master.conf: |
  {{- toYaml (.Values.master.config | default dict) | nindent 2 }}
{{- end }}

{{/* nfd.workerConfig: nfd-worker.conf as ConfigMap data */}}
{{- define "nfd.workerConfig" -}}
nfd-worker.conf: |
  {{- toYaml (.Values.worker.config | default dict) | nindent 2 }}
{{- end }}
