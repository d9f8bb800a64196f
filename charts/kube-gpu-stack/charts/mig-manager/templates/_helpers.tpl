{{/* mig-manager.configData: data of ConfigMap default-mig-parted-config, checked to parse and to hold config.default */}}
{{- define "mig-manager.configData" -}}
{{- $parsed := .Values.config.data | fromYaml -}}
{{- with $parsed.Error }}{{ fail (printf "migManager.config.data is not valid YAML: %s" .) }}{{ end -}}
{{- if and .Values.config.default (not (hasKey ($parsed | dig "mig-configs" dict) .Values.config.default)) -}}
{{- fail (printf "migManager.config.default %q is not a profile of migManager.config.data (mig-configs)" .Values.config.default) -}}
{{- end -}}
{{- toYaml (dict "config.yaml" .Values.config.data) -}}
{{- end }}

{{/* mig-manager.gpuClientsData: data of ConfigMap default-gpu-clients */}}
{{- define "mig-manager.gpuClientsData" -}}
{{- toYaml (dict "clients.yaml" (toYaml (dict "version" "v1" "systemd-services" .Values.gpuClientsConfig.services))) -}}
{{- end }}
