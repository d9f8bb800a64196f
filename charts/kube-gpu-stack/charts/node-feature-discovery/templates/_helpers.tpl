{{/*
nfd.fullname: the name prefix of every NFD object. It is the upstream NFD chart's, so a cluster moving from the GPU
Operator (which installs that chart as a subchart under the same release name) keeps its object names:
<release>-node-feature-discovery-master, -worker, -gc (or <release>-master, ... when the release name already
contains node-feature-discovery). The prefix is cut to 40 characters so every suffixed name stays valid.
*/}}
{{- define "nfd.fullname" -}}
{{- include "gpu-stack-lib.nfdFullname" . -}}
{{- end }}

{{/* nfd.port: the one HTTP port each NFD daemon serves /metrics and /healthz on (-port) */}}
{{- define "nfd.port" -}}8080{{- end }}

{{/*
nfd.daemon: what every NFD daemon's container shares, as YAML fields after its name: the image, the command and
its flags with -port added, the one HTTP port its probes use, and the resources (the common `resources` key, when
set, wins: gpu-stack-lib.containerValues). NFD needs no privileges: it runs as the image's non-root user with a
read-only root filesystem and no capabilities. dict: ctx, command (nfd-master, nfd-worker, nfd-gc), args (optional
flags), resources (the component's).
*/}}
{{- define "nfd.daemon" -}}
{{- $port := include "nfd.port" .ctx -}}
image: {{ include "gpu-stack-lib.image" (dict "ctx" .ctx "image" .ctx.Values.image) | quote }}
command: [{{ .command }}]
args:
{{- range .args }}
- {{ . | quote }}
{{- end }}
- "-port={{ $port }}"
ports:
- {name: http, containerPort: {{ $port }}, protocol: TCP}
{{- with .resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
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
