{{/* dcgm-exporter.podAPI: "true" when the exporter reads the API (pod labels or UIDs, DRA ResourceSlices), else "" */}}
{{- define "dcgm-exporter.podAPI" -}}
{{- if or .Values.enablePodLabels .Values.enablePodUID .Values.kubernetesDRA }}true{{ end -}}
{{- end }}

{{/* dcgm-exporter.env: environment of the exporter */}}
{{- define "dcgm-exporter.env" -}}
DCGM_EXPORTER_LISTEN: ":9400"
DCGM_EXPORTER_KUBERNETES: "true"
{{- /* a named ConfigMap's CSV is mounted beside the image's default list */}}
DCGM_EXPORTER_COLLECTORS: {{ empty .Values.config.name | ternary "/etc/dcgm-exporter/dcp-metrics-included.csv" "/etc/dcgm-exporter/dcgm-metrics.csv" }}
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
