{{- /*
kube-gpu-stack.monitoringLeftOut: the monitoring objects the values ask for that this render leaves out because
the API server does not serve the Prometheus Operator's API (monitoring.coreos.com/v1), joined with "; "; empty
when none is. The NOTES warn with it, or validations.yaml fails with it (monitoring.whenPrometheusOperatorAbsent).
*/ -}}
{{- define "kube-gpu-stack.monitoringLeftOut" -}}
{{- $v := .Values -}}
{{- $out := list -}}
{{- if not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") -}}
{{- if and $v.dcgmExporter.enabled (dig "serviceMonitor" "enabled" false $v.dcgmExporter) -}}
{{- $out = append $out "the DCGM exporter's ServiceMonitor (dcgmExporter.serviceMonitor.enabled)" -}}
{{- end -}}
{{- if and $v.nodeStatusExporter.enabled (dig "serviceMonitor" "enabled" false $v.nodeStatusExporter) -}}
{{- $out = append $out "the node status exporter's ServiceMonitor (nodeStatusExporter.serviceMonitor.enabled)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.monitoring.prometheusRule.enabled (not (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule")) -}}
{{- $out = append $out "the PrometheusRule with the stack's alerts (monitoring.prometheusRule.enabled)" -}}
{{- end -}}
{{- join "; " $out -}}
{{- end -}}
