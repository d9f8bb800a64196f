{{/*
The device plugin's config manager, shared by the device plugin, its MPS daemon and GPU feature discovery: it
copies the config the node selects with its nvidia.com/device-plugin.config label (else `config.default`) from the
ConfigMap `config.name` to /config/config.yaml. The init variant runs once before the main container; the sidecar
signals the main process (SIGHUP) when the selection changes, so those pods set shareProcessNamespace.
*/}}

{{/* gpu-stack-lib.configManager: dict "ctx" . "init" BOOL "process" PROCESS_TO_SIGNAL */}}
{{- define "gpu-stack-lib.configManager" -}}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .ctx
  "name" (.init | ternary "config-manager-init" "config-manager")
  "image" (include "gpu-stack-lib.image" (dict "ctx" .ctx "image" .ctx.Values.image))
  "command" (list "config-manager")
  "env" (dict
    "ONESHOT" (.init | ternary "true" "false")
    "KUBECONFIG" ""
    "NODE_NAME" (dict "fieldRef" (dict "fieldPath" "spec.nodeName"))
    "NODE_LABEL" "nvidia.com/device-plugin.config"
    "CONFIG_FILE_SRCDIR" "/available-configs"
    "CONFIG_FILE_DST" "/config/config.yaml"
    "DEFAULT_CONFIG" .ctx.Values.config.default
    "FALLBACK_STRATEGIES" "empty"
    "SEND_SIGNAL" (.init | ternary "false" "true")
    "SIGNAL" "1"
    "PROCESS_TO_SIGNAL" .process)
  "volumeMounts" (list
    (dict "name" "available-configs" "mountPath" "/available-configs")
    (dict "name" "config" "mountPath" "/config"))
  "securityContext" (dict "privileged" false "allowPrivilegeEscalation" false)
) -}}
{{- end }}

{{/* gpu-stack-lib.configManagerVolumes: the config manager's volumes, as a YAML list; takes the operand context */}}
{{- define "gpu-stack-lib.configManagerVolumes" -}}
- name: available-configs
  configMap:
    name: {{ .Values.config.name }}
- name: config
  emptyDir: {}
{{- end }}

{{/* gpu-stack-lib.cdiHookPath: the nvidia-cdi-hook the toolkit installs, for operands that generate CDI specs */}}
{{- define "gpu-stack-lib.cdiHookPath" -}}
{{- printf "%s/toolkit/nvidia-cdi-hook" (trimSuffix "/" .Values.global.hostPaths.toolkitInstallDir) -}}
{{- end }}

{{/* gpu-stack-lib.cdiAnnotationPrefix: the prefix of the container annotations that name CDI devices: the device plugin
writes its allocations under it, and the toolkit lets the nvidia runtime read it (and containerd pass it on) */}}
{{- define "gpu-stack-lib.cdiAnnotationPrefix" -}}
cdi.k8s.io/
{{- end }}
