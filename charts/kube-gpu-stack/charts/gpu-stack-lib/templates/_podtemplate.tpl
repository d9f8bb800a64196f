{{/*
gpu-stack-lib.podTemplate: a pod template (metadata + spec) with the chart's scheduling merged in. Call with dict:
  ctx          the operand chart's context
  name         the workload's (and app label's) name
  operand      the suffix of its nvidia.com/gpu.deploy.<operand> switch label; empty for pods that are not GPU
               operands (NFD), which then get no GPU node affinity
  roles        node roles it serves (container, vm-passthrough, vm-vgpu)
  match        optional extra node selector requirements (e.g. nvidia.com/mig.capable In [true])
  matchAny     optional alternatives, each a requirement list ANDed with the others (an allocationScope's)
  pod          pod spec fragment: containers, initContainers, volumes and any other pod field; set
               `runtimeClass: true` for pods that run under the nvidia runtime class (or, with
               global.cdi.nriPluginEnabled, get every GPU through NRI annotations). An operand writes it as YAML
               (a template of its own, read with fromYaml)
  main         optional: the name of the operand's main container, written in the pod (one not built with
               gpu-stack-lib.container main=true), or a list of names where the pod has more than one
  podAnnotations  optional extra pod annotations (e.g. a config checksum)
The user's container values are merged here into every container and init container (gpu-stack-lib.containerValues),
so the containers can be written as plain YAML. Scheduling is merged here and nowhere else: the pod's own + global +
the operand's tolerations, the pod's own nodeSelector under the global one under the operand's (operand wins),
operand priorityClassName over the global one, global + operand pull secrets.
*/}}
{{- define "gpu-stack-lib.podTemplate" -}}
{{- $ctx := .ctx -}}
{{- $v := $ctx.Values -}}
{{- $g := $v.global -}}
{{- /* a template that is not YAML reads back as {"Error": ...}: say so rather than render that */ -}}
{{- with .pod.Error }}{{ fail (printf "the pod of %s does not read as YAML: %s" $.name .) }}{{ end -}}
{{- $pod := deepCopy .pod -}}
{{- $main := .main | default list -}}
{{- if kindIs "string" $main }}{{ $main = list $main }}{{ end -}}
{{- $containers := list -}}
{{- range $pod.containers }}{{ $merged := dict }}{{ include "gpu-stack-lib.mergeContainerValues" (dict "ctx" $ctx "container" . "main" (has .name $main) "out" $merged) }}{{ $containers = append $containers $merged.container }}{{ end -}}
{{- $_ := set $pod "containers" $containers -}}
{{- $inits := list -}}
{{- range $pod.initContainers | default list }}{{ $merged := dict }}{{ include "gpu-stack-lib.mergeContainerValues" (dict "ctx" $ctx "container" . "main" (has .name $main) "out" $merged) }}{{ $inits = append $inits $merged.container }}{{ end -}}
{{- $podVolumes := dict -}}
{{- include "gpu-stack-lib.volumes" (dict "ctx" $ctx "volumes" $pod.volumes "containers" $containers "initContainers" $inits "out" $podVolumes) -}}
{{- $volumes := $podVolumes.list -}}
{{- $nri := dict -}}
{{- if $pod.runtimeClass -}}
{{- if ($g.cdi | default dict).nriPluginEnabled -}}
{{- /* the NRI plugin injects GPUs per container, asked by annotation */ -}}
{{- range concat $inits $containers }}{{ $_ := set $nri (printf "nvidia.cdi.k8s.io/container.%s" .name) "management.nvidia.com/gpu=all" }}{{ end -}}
{{- else -}}
{{- with include "gpu-stack-lib.runtimeClassName" $ctx }}{{ $_ := set $pod "runtimeClassName" . }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $pod = omit $pod "runtimeClass" "volumes" "initContainers" -}}
{{- with $inits }}{{ $_ := set $pod "initContainers" . }}{{ end -}}
{{- with $volumes }}{{ $_ := set $pod "volumes" . }}{{ end -}}
{{- /* seccomp RuntimeDefault for every container the pod does not set otherwise: privileged containers run
unconfined whatever the pod says (the container runtimes skip seccomp for them), so this confines exactly the others */ -}}
{{- $podSecurity := deepCopy ($pod.securityContext | default dict) -}}
{{- if not $podSecurity.seccompProfile }}{{ $_ := set $podSecurity "seccompProfile" (dict "type" "RuntimeDefault") }}{{ $_ := set $pod "securityContext" $podSecurity }}{{ end -}}
{{- /* containers that need the API mount its token themselves (gpu-stack-lib.apiAccessMount): no other gets it */ -}}
{{- range $volumes }}{{ if eq .name "kube-api-access" }}{{ $_ := set $pod "automountServiceAccountToken" false }}{{ end }}{{ end -}}
{{- if .operand -}}
{{- $affinity := dict -}}
{{- include "gpu-stack-lib.nodeAffinity" (merge (dict "out" $affinity) .) -}}
{{- $_ := set $pod "affinity" (mergeOverwrite ($pod.affinity | default dict) $affinity) -}}
{{- end -}}
{{- with concat ($g.tolerations | default list) ($pod.tolerations | default list) ($v.tolerations | default list) | uniq }}{{ $_ := set $pod "tolerations" . }}{{ end -}}
{{- with mergeOverwrite (deepCopy ($pod.nodeSelector | default dict)) (deepCopy ($g.nodeSelector | default dict)) (deepCopy ($v.nodeSelector | default dict)) }}{{ $_ := set $pod "nodeSelector" . }}{{ end -}}
{{- with $v.priorityClassName | default $g.priorityClassName }}{{ $_ := set $pod "priorityClassName" . }}{{ end -}}
{{- with include "gpu-stack-lib.pullSecrets" $ctx | fromYamlArray }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end -}}
{{- $annotations := mergeOverwrite (deepCopy ($g.podAnnotations | default dict)) (deepCopy ($v.podAnnotations | default dict)) (deepCopy (.podAnnotations | default dict)) $nri -}}
metadata:
  labels:
    {{- include "gpu-stack-lib.podLabels" (dict "ctx" $ctx "name" .name "component" .operand) | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- toYaml $pod | nindent 2 }}
{{- end }}

{{/* gpu-stack-lib.updateStrategy: a DaemonSet's update strategy: the operand's updateStrategy, else global.updateStrategy */}}
{{- define "gpu-stack-lib.updateStrategy" -}}
{{- toYaml (.Values.updateStrategy | default .Values.global.updateStrategy) -}}
{{- end }}

{{/*
gpu-stack-lib.runtimeClassName: the runtime class GPU management pods (and the validator's workload pods) run with,
or empty where there is none: with the NRI plugin (GPUs come by annotation), and on OpenShift without CDI, where
CRI-O injects GPUs through its OCI hook and has no nvidia handler (the GPU Operator's rules).
*/}}
{{- define "gpu-stack-lib.runtimeClassName" -}}
{{- $g := .Values.global -}}
{{- $cdi := $g.cdi | default dict -}}
{{- if not (or $cdi.nriPluginEnabled (and (eq ($g.platform | default "generic") "openshift") (not $cdi.enabled))) -}}
{{- $g.runtimeClassName -}}
{{- end -}}
{{- end }}
