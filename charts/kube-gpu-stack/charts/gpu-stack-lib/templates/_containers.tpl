{{/*
gpu-stack-lib.container: one container, as YAML, for a helper that builds a container from parts (an operand
template writes its containers as YAML instead; gpu-stack-lib.podTemplate merges the user's values into those).
Call with dict:
  ctx              the operand chart's context
  name             container name
  image            resolved image reference (gpu-stack-lib.image / gpu-stack-lib.stackImage)
  pullPolicy       optional; defaults to the operand's image.pullPolicy, else IfNotPresent
  command, args    optional lists
  env              optional map NAME -> string | {fieldRef: ...} (a map becomes valueFrom)
  volumeMounts     optional list
  securityContext  the container's default security context
  main             true for the operand's main container (see gpu-stack-lib.containerValues)
  spec             optional map of further container fields (ports, probes, lifecycle, ...)
The user's values are merged as gpu-stack-lib.containerValues merges them.
*/}}
{{- define "gpu-stack-lib.container" -}}
{{- $c := deepCopy (.spec | default dict) -}}
{{- $_ := set $c "name" .name -}}
{{- $_ = set $c "image" .image -}}
{{- with .pullPolicy }}{{ $_ = set $c "imagePullPolicy" . }}{{ end -}}
{{- with .command }}{{ $_ = set $c "command" . }}{{ end -}}
{{- with .args }}{{ $_ = set $c "args" . }}{{ end -}}
{{- with .env }}{{ $_ = set $c "env" . }}{{ end -}}
{{- with .volumeMounts }}{{ $_ = set $c "volumeMounts" . }}{{ end -}}
{{- with .securityContext }}{{ $_ = set $c "securityContext" . }}{{ end -}}
{{- include "gpu-stack-lib.containerValues" (dict "ctx" .ctx "container" $c "main" .main) -}}
{{- end }}

{{/*
gpu-stack-lib.containerValues: one container with the user's values merged in (gpu-stack-lib.mergeContainerValues),
as YAML.
dict "ctx" . "container" CONTAINER ["main" BOOL]
*/}}
{{- define "gpu-stack-lib.containerValues" -}}
{{- $out := dict -}}
{{- include "gpu-stack-lib.mergeContainerValues" (dict "ctx" .ctx "container" .container "main" .main "out" $out) -}}
{{ toYaml $out.container }}
{{- end }}

{{/*
gpu-stack-lib.mergeContainerValues: one container with the user's values merged in, set as .out.container (a dict:
a template's only other way to hand back data is YAML text, and writing then reading back every container was a
fifth of a render). Every container takes the operand's image.pullPolicy where it names none (else IfNotPresent),
and global.extraEnv and the operand's extraEnv over its env (their keys win; the list is sorted by name,
gpu-stack-lib.envEntries). The operand's main container also takes the operand's resources, securityContext
(merged over the container's) and extraVolumeMounts (after its own).
gpu-stack-lib.podTemplate calls it for every container of a pod, so an operand writes its containers as plain YAML;
a container that went through it once (gpu-stack-lib.container) comes out the same, its main parts aside.
dict "ctx" . "container" CONTAINER (its env a list, or a map NAME -> value) ["main" BOOL] "out" DICT
*/}}
{{- define "gpu-stack-lib.mergeContainerValues" -}}
{{- $v := .ctx.Values -}}
{{- $c := deepCopy .container -}}
{{- $_ := set $c "imagePullPolicy" ($c.imagePullPolicy | default ($v.image | default dict).pullPolicy | default "IfNotPresent") -}}
{{- $env := dict -}}
{{- if kindIs "map" $c.env -}}
{{- $env = $c.env -}}
{{- else -}}
{{- range $c.env | default list }}{{ $_ := set $env .name (.valueFrom | default .value | default "") }}{{ end -}}
{{- end -}}
{{- $env = mergeOverwrite $env (deepCopy ($v.global.extraEnv | default dict)) (deepCopy ($v.extraEnv | default dict)) -}}
{{- $c = omit $c "env" -}}
{{- $entries := dict -}}
{{- include "gpu-stack-lib.envEntries" (dict "env" $env "out" $entries) -}}
{{- with $entries.list }}{{ $_ = set $c "env" . }}{{ end -}}
{{- if .main -}}
{{- with concat ($c.volumeMounts | default list) ($v.extraVolumeMounts | default list) }}{{ $_ = set $c "volumeMounts" . }}{{ end -}}
{{- with mergeOverwrite (deepCopy ($c.securityContext | default dict)) (deepCopy ($v.securityContext | default dict)) }}{{ $_ = set $c "securityContext" . }}{{ end -}}
{{- with $v.resources }}{{ $_ = set $c "resources" . }}{{ end -}}
{{- end -}}
{{- $_ = set .out "container" $c -}}
{{- end }}

{{/*
gpu-stack-lib.envList: a map NAME -> value as a container env list in YAML (gpu-stack-lib.envEntries); nothing
for an empty map.
*/}}
{{- define "gpu-stack-lib.envList" -}}
{{- $out := dict -}}
{{- include "gpu-stack-lib.envEntries" (dict "env" . "out" $out) -}}
{{- with $out.list }}{{ toYaml . }}{{ end -}}
{{- end }}

{{/*
gpu-stack-lib.envEntries: a map NAME -> value as a container env list, sorted by name (deterministic), set as
.out.list. A map value becomes valueFrom. An empty value becomes no value: the container gets the empty string all
the same, and the API server drops `value: ""`, so rendering it would leave a GitOps diff that never closes. Values
are strings (toString), so none reads back as a number or boolean.
dict "env" MAP "out" DICT
*/}}
{{- define "gpu-stack-lib.envEntries" -}}
{{- $list := list -}}
{{- range $name := keys .env | sortAlpha -}}
{{- $val := get $.env $name -}}
{{- $entry := dict "name" $name -}}
{{- if kindIs "map" $val }}{{ $_ := set $entry "valueFrom" $val }}
{{- else if ne ($val | toString) "" }}{{ $_ := set $entry "value" ($val | toString) }}{{ end -}}
{{- $list = append $list $entry -}}
{{- end -}}
{{- $_ := set .out "list" $list -}}
{{- end }}

{{/*
gpu-stack-lib.seedLabelContainer: an init container that sets default labels on its node where each is absent or
empty (`kube-gpu-stack seed-label`, recorded so that the pre-delete cleanup takes them back), for operands that act
only on labels that have a value. Unprivileged, as the image's non-root user; it writes the node through the pod's
ServiceAccount (nodes get and update). dict "ctx" . "name" NAME "labels" (list "KEY=VALUE" ...)
["args" (list FLAG ...): more seed-label flags, e.g. --workload]
*/}}
{{- define "gpu-stack-lib.seedLabelContainer" -}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" .name
  "image" (include "gpu-stack-lib.stackImage" .ctx)
  "pullPolicy" .ctx.Values.global.stackImage.pullPolicy
  "command" (concat (list "kube-gpu-stack" "seed-label" "--node=$(NODE_NAME)") (.args | default list) .labels)
  "env" (dict "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName")))
  "securityContext" (dict "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "runAsUser" 65532 "capabilities" (dict "drop" (list "ALL")))
) -}}
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
  "volumeMounts" (list (dict "name" "run-nvidia-validations" "mountPath" "/run/nvidia/validations" "readOnly" true "mountPropagation" "HostToContainer"))
  "securityContext" (dict "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsNonRoot" true "runAsUser" 65532 "capabilities" (dict "drop" (list "ALL")))
) -}}
{{- end }}

{{/*
gpu-stack-lib.withDriverEnv: a command that exports the facts the driver validation wrote to driver-ready
(IS_HOST_DRIVER, NVIDIA_DRIVER_ROOT, DRIVER_ROOT_CTR_PATH, ...) and then execs the given command, so one pod
template serves nodes with a containerized driver and nodes with a host driver. dict "command" (list ...)
["exports" SHELL: run after driver-ready is sourced, while every variable it sets is exported]
["delaySeconds" N: wait N seconds before the exec]
*/}}
{{- define "gpu-stack-lib.withDriverEnv" -}}
{{- $delay := "" -}}
{{- with .delaySeconds }}{{ $delay = printf "sleep %d; " (int .) }}{{ end -}}
{{- $script := printf "until [ -f /run/nvidia/validations/driver-ready ]; do echo waiting for driver-ready; sleep 5; done; set -a; . /run/nvidia/validations/driver-ready; %sset +a; %sexec %s" (.exports | default "" | printf "%s") $delay (join " " .command) -}}
{{- toJson (list "sh" "-c" $script) -}}
{{- end }}
