{{/* device-plugin.env: environment of the plugin and the MPS control daemon */}}
{{- define "device-plugin.env" -}}
{{- $cdi := .Values.global.cdi.enabled -}}
PASS_DEVICE_SPECS: "true"
FAIL_ON_INIT_ERROR: "true"
DEVICE_ID_STRATEGY: uuid
DEVICE_LIST_STRATEGY: {{ $cdi | ternary "cdi-annotations,cdi-cri" "envvar" }}
MIG_STRATEGY: {{ .Values.global.mig.strategy }}
NVIDIA_MIG_MONITOR_DEVICES: all
MPS_ROOT: {{ .Values.mps.root }}
NODE_NAME: {fieldRef: {fieldPath: spec.nodeName}}
{{- if $cdi }}
CDI_ANNOTATION_PREFIX: cdi.k8s.io/
NVIDIA_CDI_HOOK_PATH: /usr/local/nvidia/toolkit/nvidia-cdi-hook
{{- end }}
{{- if .Values.config.name }}
CONFIG_FILE: /config/config.yaml
DEFAULT_CONFIG: {{ .Values.config.default | quote }}
FALLBACK_STRATEGIES: empty
{{- end }}
{{- end }}

{{/* device-plugin.configManager: the config-manager container (init: "true" for the one-shot init variant) */}}
{{- define "device-plugin.configManager" -}}
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

{{/* device-plugin.volumes: MPS shared memory, and the config manager's volumes when a config is named */}}
{{- define "device-plugin.volumes" -}}
- name: mps-shm
  hostPath:
    path: {{ printf "%s/shm" .Values.mps.root }}
    type: DirectoryOrCreate
{{- if .Values.config.name }}
- name: available-configs
  configMap:
    name: {{ .Values.config.name }}
- name: config
  emptyDir: {}
{{- end }}
{{- end }}

{{/* device-plugin.mounts: mounts shared by the plugin and the MPS control daemon */}}
{{- define "device-plugin.mounts" -}}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations}
- {name: run-nvidia-mps, mountPath: /mps}
- {name: mps-shm, mountPath: /dev/shm}
{{- if .Values.config.name }}
- {name: config, mountPath: /config}
{{- end }}
{{- end }}
