{{/* dcgm-exporter.podAPI: "true" when the exporter reads the API (pod labels or UIDs, DRA ResourceSlices), else "" */}}
{{- define "dcgm-exporter.podAPI" -}}
{{- if or .Values.enablePodLabels .Values.enablePodUID .Values.kubernetesDRA }}true{{ end -}}
{{- end }}

{{/* dcgm-exporter.metricsConfig: the collectors ConfigMap in use, as YAML {name, create, data}: the health profile's
own, or config.name/create/data; name is empty for the image's default list */}}
{{- define "dcgm-exporter.metricsConfig" -}}
{{- $c := .Values.config -}}
{{- if eq $c.profile "health" -}}
{{- if or $c.name $c.create $c.data -}}
{{- fail "dcgmExporter.config.profile=health renders its own ConfigMap: leave dcgmExporter.config.name, create and data unset" -}}
{{- end -}}
{{- dict "name" "nvidia-dcgm-exporter-health-metrics" "create" true "data" (.Files.Get "files/health-metrics.csv") | toYaml -}}
{{- else -}}
{{- if and $c.create (not (and $c.name $c.data)) -}}
{{- fail "dcgmExporter.config.create needs dcgmExporter.config.name and dcgmExporter.config.data" -}}
{{- end -}}
{{- dict "name" $c.name "create" $c.create "data" $c.data | toYaml -}}
{{- end -}}
{{- end }}

{{/* dcgm-exporter.env: environment of the exporter */}}
{{- define "dcgm-exporter.env" -}}
DCGM_EXPORTER_LISTEN: ":9400"
DCGM_EXPORTER_KUBERNETES: "true"
{{- /* a named ConfigMap's CSV is mounted beside the image's default list */}}
DCGM_EXPORTER_COLLECTORS: {{ empty (include "dcgm-exporter.metricsConfig" . | fromYaml).name | ternary "/etc/dcgm-exporter/dcp-metrics-included.csv" "/etc/dcgm-exporter/dcgm-metrics.csv" }}
{{- if eq .Values.config.profile "health" }}
{{- /* --xid-count-window-size (dcgm-exporter pkg/cmd/app.go) */}}
DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE: {{ .Values.config.xidCountWindowMs | int | quote }}
{{- end }}
NODE_NAME: {fieldRef: {fieldPath: spec.nodeName}}
{{- with .Values.remoteHostEngine }}
DCGM_REMOTE_HOSTENGINE_INFO: {{ . | quote }}
{{- end }}
{{- if .Values.enablePodLabels }}
DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS: "true"
{{- with .Values.podLabelAllowlistRegex }}
{{- /* a string-slice flag: comma-separated */}}
DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- if .Values.enablePodUID }}
DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID: "true"
{{- end }}
{{- if .Values.kubernetesDRA }}
{{- /* --kubernetes-enable-dra (dcgm-exporter pkg/cmd/app.go) */}}
KUBERNETES_ENABLE_DRA: "true"
{{- end }}
{{- if .Values.hpcJobMapping.enabled }}
DCGM_HPC_JOB_MAPPING_DIR: {{ .Values.hpcJobMapping.directory | quote }}
{{- end }}
{{- end }}
