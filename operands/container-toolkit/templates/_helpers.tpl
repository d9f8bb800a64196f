{{/*
container-toolkit.runtimeFiles: the runtime's host files, each empty runtimeConfig field replaced by the runtime's
default, as JSON {config, dropInConfig, socket}.
*/}}
{{- define "container-toolkit.runtimeFiles" -}}
{{- $defaults := dict
  "containerd" (dict "config" "/etc/containerd/config.toml" "dropInConfig" "/etc/containerd/conf.d/99-nvidia.toml" "socket" "/run/containerd/containerd.sock")
  "crio" (dict "config" "/etc/crio/config.toml" "dropInConfig" "/etc/crio/crio.conf.d/99-nvidia.conf" "socket" "/var/run/crio/crio.sock")
-}}
{{- $d := required (printf "toolkit.runtime must be containerd or crio, not %q" .Values.runtime) (get $defaults .Values.runtime) -}}
{{- $files := dict -}}
{{- range $key := list "config" "dropInConfig" "socket" -}}
{{- $_ := set $files $key (get $.Values.runtimeConfig $key | default (get $d $key)) -}}
{{- end -}}
{{- toJson $files -}}
{{- end }}

{{/*
container-toolkit.env: environment of the toolkit container. The runtime's files are seen through their host
directories, mounted at /runtime/config-dir/, /runtime/config-dir.d/ and /runtime/sock-dir/.
*/}}
{{- define "container-toolkit.env" -}}
{{- $files := include "container-toolkit.runtimeFiles" . | fromJson -}}
{{- $config := printf "/runtime/config-dir/%s" (base $files.config) -}}
{{- $socket := printf "/runtime/sock-dir/%s" (base $files.socket) -}}
ROOT: {{ .Values.global.hostPaths.toolkitInstallDir | quote }}
RUNTIME: {{ .Values.runtime }}
RUNTIME_CONFIG: {{ $config | quote }}
RUNTIME_DROP_IN_CONFIG: {{ printf "/runtime/config-dir.d/%s" (base $files.dropInConfig) | quote }}
{{- /* containerd's main config imports the drop-in by its host path */}}
RUNTIME_DROP_IN_CONFIG_HOST_PATH: {{ $files.dropInConfig | quote }}
RUNTIME_SOCKET: {{ $socket | quote }}
{{- if eq .Values.runtime "containerd" }}
CONTAINERD_CONFIG: {{ $config | quote }}
CONTAINERD_SOCKET: {{ $socket | quote }}
CONTAINERD_RUNTIME_CLASS: {{ .Values.global.runtimeClassName | quote }}
{{- else }}
CRIO_CONFIG: {{ $config | quote }}
{{- /* without CDI, CRI-O keeps the OCI prestart hook rather than making nvidia its default runtime */}}
CRIO_CONFIG_MODE: {{ .Values.global.cdi.enabled | ternary "config" "hook" }}
{{- end }}
NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND: management.nvidia.com/gpu
NVIDIA_VISIBLE_DEVICES: void
TOOLKIT_PID_FILE: /run/nvidia/toolkit/toolkit.pid
{{- if .Values.global.cdi.enabled }}
{{- /* workloads get GPUs through the runtime's native CDI; nvidia is only the management pods' runtime class */}}
CDI_ENABLED: "true"
NVIDIA_RUNTIME_SET_AS_DEFAULT: "false"
NVIDIA_CONTAINER_RUNTIME_MODE: cdi
{{- end }}
{{- end }}

{{/* container-toolkit.volumes: the runtime's config, drop-in and socket directories, the install dir, CRI-O hooks */}}
{{- define "container-toolkit.volumes" -}}
{{- $files := include "container-toolkit.runtimeFiles" . | fromJson -}}
{{- $rt := .Values.runtime }}
- name: {{ $rt }}-config
  hostPath: {path: {{ dir $files.config | quote }}, type: DirectoryOrCreate}
- name: {{ $rt }}-drop-in-config
  hostPath: {path: {{ dir $files.dropInConfig | quote }}, type: DirectoryOrCreate}
- name: {{ $rt }}-socket
  hostPath: {path: {{ dir $files.socket | quote }}}
{{- if eq $rt "crio" }}
- name: crio-hooks
  hostPath: {path: /usr/share/containers/oci/hooks.d, type: DirectoryOrCreate}
{{- end }}
{{- end }}

{{/* container-toolkit.mounts: mounts of the toolkit container */}}
{{- define "container-toolkit.mounts" -}}
{{- $rt := .Values.runtime -}}
- {name: run-nvidia-toolkit, mountPath: /run/nvidia/toolkit}
- {name: run-nvidia-validations, mountPath: /run/nvidia/validations}
- {name: toolkit-install-dir, mountPath: {{ .Values.global.hostPaths.toolkitInstallDir | quote }}}
- {name: driver-install-dir, mountPath: /driver-root, mountPropagation: HostToContainer}
- {name: host-root, mountPath: /host, readOnly: true, mountPropagation: HostToContainer}
- {name: cdi-root, mountPath: /var/run/cdi}
- {name: {{ $rt }}-config, mountPath: /runtime/config-dir/}
- {name: {{ $rt }}-drop-in-config, mountPath: /runtime/config-dir.d/}
- {name: {{ $rt }}-socket, mountPath: /runtime/sock-dir/}
{{- if eq $rt "crio" }}
- {name: crio-hooks, mountPath: /usr/share/containers/oci/hooks.d}
{{- end }}
{{- end }}
