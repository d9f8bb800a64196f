{{/*
gpu-stack-lib.container: one container, as YAML. Call with dict:
  ctx              the operand chart's context
  name             container name
  image            resolved image reference (gpu-stack-lib.image / gpu-stack-lib.stackImage)
  pullPolicy       optional; defaults to the operand's image.pullPolicy, else IfNotPresent
  command, args    optional lists
  env              optional map NAME -> string | {fieldRef: ...} (a map becomes valueFrom)
  volumeMounts     optional list
  securityContext  the container's default security context
  main             true for the operand's main container: it also takes the operand's resources,
                   securityContext (merged over the default) and extraVolumeMounts
  spec             optional map of further container fields (ports, probes, lifecycle, ...)
Every container takes global.extraEnv and the operand's extraEnv; keys win over the chart's own env.
*/}}
{{- define "gpu-stack-lib.container" -}}
{{- $v := .ctx.Values -}}
{{- $c := deepCopy (.spec | default dict) -}}
{{- $_ := set $c "name" .name -}}
{{- $_ = set $c "image" .image -}}
{{- $_ = set $c "imagePullPolicy" (.pullPolicy | default ($v.image | default dict).pullPolicy | default "IfNotPresent") -}}
{{- with .command }}{{ $_ = set $c "command" . }}{{ end -}}
{{- with .args }}{{ $_ = set $c "args" . }}{{ end -}}
{{- $env := mergeOverwrite (deepCopy (.env | default dict)) (deepCopy ($v.global.extraEnv | default dict)) (deepCopy ($v.extraEnv | default dict)) -}}
{{- with (include "gpu-stack-lib.envList" $env | fromYamlArray) }}{{ $_ = set $c "env" . }}{{ end -}}
{{- $mounts := .volumeMounts | default list -}}
{{- $sc := deepCopy (.securityContext | default dict) -}}
{{- if .main -}}
{{- $mounts = concat $mounts ($v.extraVolumeMounts | default list) -}}
{{- $sc = mergeOverwrite $sc (deepCopy ($v.securityContext | default dict)) -}}
{{- with $v.resources }}{{ $_ = set $c "resources" . }}{{ end -}}
{{- end -}}
{{- with $mounts }}{{ $_ = set $c "volumeMounts" . }}{{ end -}}
{{- with $sc }}{{ $_ = set $c "securityContext" . }}{{ end -}}
{{ toYaml $c }}
{{- end }}

{{/*
gpu-stack-lib.envList: a map NAME -> value as a container env list, sorted by name (deterministic). An empty
value is rendered as no value: the container gets the empty string all the same, and the API server drops
`value: ""`, so rendering it would leave a GitOps diff that never closes.
*/}}
{{- define "gpu-stack-lib.envList" -}}
{{- range $name := keys . | sortAlpha }}
{{- $val := get $ $name }}
- name: {{ $name }}
  {{- if kindIs "map" $val }}
  valueFrom:
    {{- toYaml $val | nindent 4 }}
  {{- else if ne ($val | toString) "" }}
  value: {{ $val | toString | quote }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.waitContainer: an init container that blocks until one of the named status files exists in the
validations dir (the per-node ordering barrier: the toolkit waits for driver-ready, GPU clients for toolkit-ready).
It only reads: unprivileged, as the image's non-root user.
dict "ctx" . "name" NAME "files" (list FILE ...)
*/}}
{{- define "gpu-stack-lib.waitContainer" -}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" .name
  "image" (include "gpu-stack-lib.stackImage" .ctx)
  "pullPolicy" .ctx.Values.global.stackImage.pullPolicy
  "command" (concat (list "validator" "wait") .files)
  "volumeMounts" (list (dict "name" "run-nvidia-validations" "mountPath" "/run/nvidia/validations" "mountPropagation" "HostToContainer"))
  "securityContext" (dict "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "runAsUser" 65532 "capabilities" (dict "drop" (list "ALL")))
) -}}
{{- end }}

{{/*
gpu-stack-lib.withDriverEnv: a command that exports the facts the driver validation wrote to driver-ready
(IS_HOST_DRIVER, NVIDIA_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH, ...) and then execs the given command, so one pod
template serves nodes with a containerized driver and nodes with a host driver. dict "command" (list ...)
["exports" SHELL: run after driver-ready is sourced, while every variable it sets is exported]
*/}}
{{- define "gpu-stack-lib.withDriverEnv" -}}
{{- $script := printf "until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for driver-ready; sleep 5; done; set -a; . /run/nvidia/validations/driver-ready; %sset +a; exec %s" (.exports | default "" | printf "%s") (join " " .command) -}}
{{- toJson (list "sh" "-c" $script) -}}
{{- end }}
