{{/*
Labels. Selectors carry only name + instance because DaemonSet selectors are immutable; pod templates never carry
the chart or app version, so a chart-only bump does not roll any pod.
*/}}

{{/* gpu-stack-lib.selectorLabels: dict "ctx" . "name" NAME */}}
{{- define "gpu-stack-lib.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end }}

{{/* gpu-stack-lib.labels: metadata labels of every object; dict "ctx" . "name" NAME ["component" COMPONENT] */}}
{{- define "gpu-stack-lib.labels" -}}
{{ include "gpu-stack-lib.selectorLabels" . }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/part-of: kube-gpu-stack
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- with .ctx.Values.global.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.podLabels: selector labels, the anchor's `app` label and the operand as component (static, so a
chart bump never changes them; validators find driver pods by it), then global and operand podLabels
*/}}
{{- define "gpu-stack-lib.podLabels" -}}
{{- $labels := dict "app" .name -}}
{{- with .component }}{{ $_ := set $labels "app.kubernetes.io/component" . }}{{ end -}}
{{- $_ := mergeOverwrite $labels (deepCopy (.ctx.Values.global.podLabels | default dict)) (deepCopy (.ctx.Values.podLabels | default dict)) -}}
{{- $_ = mergeOverwrite $labels (include "gpu-stack-lib.selectorLabels" . | fromYaml) -}}
{{ toYaml $labels }}
{{- end }}

{{/* gpu-stack-lib.metadata: name, namespace and labels of a namespaced object; dict "ctx" . "name" NAME ["component" C] */}}
{{- define "gpu-stack-lib.metadata" -}}
name: {{ .name }}
namespace: {{ .ctx.Release.Namespace }}
labels:
  {{- include "gpu-stack-lib.labels" . | nindent 2 }}
{{- end }}
