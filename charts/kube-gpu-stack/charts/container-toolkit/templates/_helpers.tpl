{{/*
container-toolkit.runtime: the container runtime the toolkit configures. OpenShift nodes run CRI-O only, so
global.platform=openshift means crio whatever toolkit.runtime says.
*/}}
{{- define "container-toolkit.runtime" -}}
{{- eq (.Values.global.platform | default "generic") "openshift" | ternary "crio" .Values.runtime -}}
{{- end }}

{{/*
container-toolkit.runtimeFiles: the runtime's host files as JSON {config, dropInConfig, socket, hooksDir}: each
empty runtimeConfig field takes the preset of global.platform for the runtime, else the runtime's generic default.
Where the platform's containerd already imports a drop-in directory (k3s, rke2, k0s), the preset writes there and
the main file is only read; elsewhere the toolkit adds one import of the drop-in to the main file.
*/}}
{{- define "container-toolkit.runtimeFiles" -}}
{{- $rt := include "container-toolkit.runtime" . -}}
{{- $platform := .Values.global.platform | default "generic" -}}
{{- $generic := dict
  "containerd" (dict "config" "/etc/containerd/config.toml" "dropInConfig" "/etc/containerd/conf.d/99-nvidia.toml" "socket" "/run/containerd/containerd.sock")
  "crio" (dict "config" "/etc/crio/config.toml" "dropInConfig" "/etc/crio/crio.conf.d/99-nvidia.conf" "socket" "/var/run/crio/crio.sock" "hooksDir" "/usr/share/containers/oci/hooks.d")
-}}
{{- /* k3s and rke2 regenerate config.toml from a template at every start; containerd 2 (config v3) loads config-v3.toml.d/*.toml */ -}}
{{- $rancher := "/var/lib/rancher/%s/agent/etc/containerd" -}}
{{- $presets := dict
  "k3s" (dict "containerd" (dict "config" (printf "%s/config.toml" (printf $rancher "k3s")) "dropInConfig" (printf "%s/config-v3.toml.d/99-nvidia.toml" (printf $rancher "k3s")) "socket" "/run/k3s/containerd/containerd.sock"))
  "rke2" (dict "containerd" (dict "config" (printf "%s/config.toml" (printf $rancher "rke2")) "dropInConfig" (printf "%s/config-v3.toml.d/99-nvidia.toml" (printf $rancher "rke2")) "socket" "/run/k3s/containerd/containerd.sock"))
  "microk8s" (dict "containerd" (dict "config" "/var/snap/microk8s/current/args/containerd-template.toml" "dropInConfig" "/var/snap/microk8s/current/args/conf.d/99-nvidia.toml" "socket" "/var/snap/microk8s/common/run/containerd.sock"))
  "k0s" (dict "containerd" (dict "config" "/etc/k0s/containerd.toml" "dropInConfig" "/etc/k0s/containerd.d/nvidia.toml" "socket" "/run/k0s/containerd.sock"))
  "openshift" (dict "crio" (dict "hooksDir" "/run/containers/oci/hooks.d"))
-}}
{{- $d := required (printf "toolkit.runtime must be containerd or crio, not %q" $rt) (get $generic $rt) -}}
{{- $d = mergeOverwrite (deepCopy $d) (get (get $presets $platform | default dict) $rt | default dict) -}}
{{- $files := dict -}}
{{- range $key := list "config" "dropInConfig" "socket" -}}
{{- $_ := set $files $key (get $.Values.runtimeConfig $key | default (get $d $key)) -}}
{{- end -}}
{{- with $d.hooksDir }}{{ $_ := set $files "hooksDir" . }}{{ end -}}
{{- toJson $files -}}
{{- end }}

{{/*
container-toolkit.env: environment of the toolkit container. The runtime's files are seen through their host
directories, mounted at /runtime/config-dir/, /runtime/config-dir.d/ and /runtime/sock-dir/. With the NRI plugin
the toolkit touches no runtime config: it injects CDI devices through the runtime's NRI socket instead.
*/}}
{{- define "container-toolkit.env" -}}
{{- $rt := include "container-toolkit.runtime" . -}}
{{- $files := include "container-toolkit.runtimeFiles" . | fromJson -}}
{{- $config := printf "/runtime/config-dir/%s" (base $files.config) -}}
{{- $socket := printf "/runtime/sock-dir/%s" (base $files.socket) -}}
ROOT: {{ .Values.global.hostPaths.toolkitInstallDir | quote }}
RUNTIME: {{ $rt }}
{{- if .Values.global.cdi.nriPluginEnabled }}
ENABLE_NRI_PLUGIN: "true"
NRI_SOCKET: /var/run/nri/nri.sock
NRI_NAMESPACE: {{ .Release.Namespace | quote }}
{{- else }}
RUNTIME_CONFIG: {{ $config | quote }}
RUNTIME_DROP_IN_CONFIG: {{ printf "/runtime/config-dir.d/%s" (base $files.dropInConfig) | quote }}
{{- /* containerd's main config imports the drop-in by its host path */}}
RUNTIME_DROP_IN_CONFIG_HOST_PATH: {{ $files.dropInConfig | quote }}
RUNTIME_SOCKET: {{ $socket | quote }}
{{- if eq $rt "containerd" }}
CONTAINERD_CONFIG: {{ $config | quote }}
CONTAINERD_SOCKET: {{ $socket | quote }}
CONTAINERD_RUNTIME_CLASS: {{ .Values.global.runtimeClassName | quote }}
{{- else }}
{{- /* RUNTIME_CONFIG names CRI-O's config: the installer reads no CRIO_CONFIG */}}
{{- /* without CDI, CRI-O keeps the OCI prestart hook rather than making nvidia its default runtime */}}
CRIO_CONFIG_MODE: {{ .Values.global.cdi.enabled | ternary "config" "hook" }}
{{- end }}
{{- end }}
NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND: management.nvidia.com/gpu
NVIDIA_VISIBLE_DEVICES: void
TOOLKIT_PID_FILE: /run/nvidia/toolkit/toolkit.pid
{{- if .Values.global.cdi.enabled }}
{{- /* workloads get GPUs through the runtime's native CDI; nvidia is only the management pods' runtime class */}}
CDI_ENABLED: "true"
NVIDIA_RUNTIME_SET_AS_DEFAULT: "false"
NVIDIA_CONTAINER_RUNTIME_MODE: cdi
{{- if not .Values.global.cdi.nriPluginEnabled }}
{{- /* The runtime's CDI mode reads the devices the device plugin names in these annotations, and the installer lets
containerd pass them to the nvidia handler (container_annotations): how a pod of runtime class nvidia gets its GPUs
from a containerd without native CDI (before 1.7), where enable_cdi does nothing. A containerd with native CDI
applies the same devices first; the runtime's second application replaces the same devices and mounts, and reruns
hooks that are idempotent (the CDI library, nvidia-cdi-hook v1.20.0). */}}
NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES: {{ include "gpu-stack-lib.cdiAnnotationPrefix" . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
container-toolkit.volumes: the runtime's config, drop-in and socket directories, the install dir, CRI-O hooks; with
NRI only the NRI socket's directory.
*/}}
{{- define "container-toolkit.volumes" -}}
{{- $rt := include "container-toolkit.runtime" . -}}
{{- if .Values.global.cdi.nriPluginEnabled }}
- name: nri-socket
  hostPath: {path: /var/run/nri}
{{- else }}
{{- $files := include "container-toolkit.runtimeFiles" . | fromJson }}
- name: {{ $rt }}-config
  hostPath: {path: {{ dir $files.config | quote }}, type: DirectoryOrCreate}
- name: {{ $rt }}-drop-in-config
  hostPath: {path: {{ dir $files.dropInConfig | quote }}, type: DirectoryOrCreate}
- name: {{ $rt }}-socket
  hostPath: {path: {{ dir $files.socket | quote }}}
{{- with $files.hooksDir }}
- name: crio-hooks
  hostPath: {path: {{ . | quote }}, type: DirectoryOrCreate}
{{- end }}
{{- end }}
{{- end }}

{{/* container-toolkit.mounts: mounts of the toolkit container */}}
{{- define "container-toolkit.mounts" -}}
{{- $rt := include "container-toolkit.runtime" . -}}
- {name: run-nvidia-toolkit, mountPath: /run/nvidia/toolkit}
{{- /* only the wrapper's driver-ready is read there: the installer never writes it */}}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations, readOnly: true}
- {name: toolkit-install-dir, mountPath: {{ .Values.global.hostPaths.toolkitInstallDir | quote }}}
- {name: driver-install-dir, mountPath: /driver-root, mountPropagation: HostToContainer}
- {name: host-root, mountPath: /host, readOnly: true, mountPropagation: HostToContainer}
- {name: cdi-root, mountPath: /var/run/cdi}
{{- if .Values.global.cdi.nriPluginEnabled }}
- {name: nri-socket, mountPath: /var/run/nri}
{{- else }}
- {name: {{ $rt }}-config, mountPath: /runtime/config-dir/}
- {name: {{ $rt }}-drop-in-config, mountPath: /runtime/config-dir.d/}
- {name: {{ $rt }}-socket, mountPath: /runtime/sock-dir/}
{{- if eq $rt "crio" }}
{{- /* the toolkit writes its OCI hook here; the volume maps it to the host's hooks dir (per platform) */}}
- {name: crio-hooks, mountPath: /usr/share/containers/oci/hooks.d}
{{- end }}
{{- end }}
{{- end }}

{{/*
container-toolkit.configKeeper: the toolkit pod's native sidecar (an init container that runs for the pod's life).
It starts before the toolkit and records the runtime's main config; it stops after the toolkit's own cleanup (a
native sidecar stops after the pod's containers) and gives the config its bytes back when it differs only by the
toolkit's import of its drop-in, and removes the toolkit's CDI spec for management containers (hooks/node/runtimeconfig).
Upstream's installer, stopped, leaves both. Root for the root-owned config, with no capability and no token.
*/}}
{{- define "container-toolkit.configKeeper" -}}
{{- $rt := include "container-toolkit.runtime" . -}}
{{- $args := list "--state" "/run/nvidia/toolkit/runtime-config.json" -}}
{{- $mounts := list (dict "name" "run-nvidia-toolkit" "mountPath" "/run/nvidia/toolkit") -}}
{{- if not .Values.global.cdi.nriPluginEnabled }}
{{- $files := include "container-toolkit.runtimeFiles" . | fromJson -}}
{{- $args = concat $args (list "--config" (printf "/runtime/config-dir/%s" (base $files.config)) "--drop-in" $files.dropInConfig) -}}
{{- $mounts = append $mounts (dict "name" (printf "%s-config" $rt) "mountPath" "/runtime/config-dir/") -}}
{{- end }}
{{- if .Values.global.cdi.enabled }}
{{- $args = concat $args (list "--cdi-spec" "/var/run/cdi/management.nvidia.com-gpu.yaml") -}}
{{- $mounts = append $mounts (dict "name" "cdi-root" "mountPath" "/var/run/cdi") -}}
{{- end }}
{{- include "gpu-stack-lib.container" (dict
  "ctx" .
  "name" "runtime-config-keeper"
  "image" (include "gpu-stack-lib.stackImage" .)
  "pullPolicy" .Values.global.stackImage.pullPolicy
  "command" (list "kube-gpu-stack" "keep-runtime-config")
  "args" $args
  "volumeMounts" $mounts
  "securityContext" (dict "privileged" false "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "runAsUser" 0 "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault"))
  "spec" (dict "restartPolicy" "Always" "resources" (dict "requests" (dict "cpu" "1m" "memory" "32Mi") "limits" (dict "memory" "128Mi")))
) }}
{{- end }}
