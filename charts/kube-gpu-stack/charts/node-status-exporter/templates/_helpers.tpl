{{/* node-status-exporter.name: the name of the DaemonSet, Service and ServiceMonitor (the GPU Operator's) */}}
{{- define "node-status-exporter.name" -}}
nvidia-node-status-exporter
{{- end }}
