{{/*
gpu-feature-discovery.daemonset: GFD's DaemonSet; takes an operand context (the chart's own, or the one the umbrella
chart builds from .Subcharts.gfd with config following devicePlugin.config).
*/}}
{{- define "gpu-feature-discovery.daemonset" -}}
{{- $named := not (empty .Values.config.name) -}}
{{- $inits := list (include "gpu-stack-lib.waitContainer" (dict "ctx" . "name" "toolkit-validation" "files" (list "toolkit-ready")) | fromYaml) -}}
{{- $sidecars := list -}}
{{- $env := dict
  "GFD_SLEEP_INTERVAL" .Values.sleepInterval
  "GFD_FAIL_ON_INIT_ERROR" "true"
  "MIG_STRATEGY" .Values.global.mig.strategy
  "USE_NODE_FEATURE_API" (toString .Values.useNodeFeatureAPI)
  "NAMESPACE" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))
  "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
  "POD_NAME" (dict "fieldRef" (dict "fieldPath" "metadata.name"))
-}}
{{- $mounts := list
  (dict "name" "nfd-features-d" "mountPath" "/etc/kubernetes/node-feature-discovery/features.d")
  (dict "name" "host-sys" "mountPath" "/sys" "readOnly" true)
-}}
{{- $volumes := list -}}
{{- if $named -}}
{{- /* a named config: the config manager selects the node's config and signals GFD when it changes */ -}}
{{- $inits = append $inits (include "gpu-stack-lib.configManager" (dict "ctx" . "init" true "process" "gpu-feature-discovery") | fromYaml) -}}
{{- $sidecars = append $sidecars (include "gpu-stack-lib.configManager" (dict "ctx" . "init" false "process" "gpu-feature-discovery") | fromYaml) -}}
{{- $_ := set $env "CONFIG_FILE" "/config/config.yaml" -}}
{{- $mounts = append $mounts (dict "name" "config" "mountPath" "/config") -}}
{{- $volumes = include "gpu-stack-lib.configManagerVolumes" . | fromYamlArray -}}
{{- end -}}
{{- $gfd := include "gpu-stack-lib.container" (dict
  "ctx" .
  "name" "gpu-feature-discovery"
  "image" (include "gpu-stack-lib.image" (dict "ctx" . "image" .Values.image))
  "main" true
  "command" (list "gpu-feature-discovery")
  "env" $env
  "volumeMounts" $mounts
  "securityContext" (dict "privileged" true)
) | fromYaml -}}
{{- $pod := dict
  "serviceAccountName" "nvidia-gpu-feature-discovery"
  "runtimeClass" true
  "shareProcessNamespace" $named
  "initContainers" $inits
  "containers" (prepend $sidecars $gfd)
  "volumes" $volumes
-}}
{{- include "gpu-stack-lib.daemonset" (dict "ctx" . "name" "gpu-feature-discovery" "operand" "gpu-feature-discovery" "roles" (list "container") "pod" $pod) }}
{{- end }}
