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

{{/*
gpu-stack-lib.crds: the chart's CRDs (files/crds/*.yaml), rendered as templates so that `helm upgrade`, Argo CD and
Flux update them with the chart, with the chart's labels, and kept on uninstall (helm.sh/resource-policy: keep;
Argo CD's Delete=false): deleting a CRD deletes every object of its kind in the cluster. A CRD has one owner: the
calling chart decides when it renders them (never in its external mode). dict "ctx" . "component" COMPONENT
*/}}
{{- define "gpu-stack-lib.crds" -}}
{{- $ctx := .ctx -}}
{{- $component := .component -}}
{{- range $path, $_ := $ctx.Files.Glob "files/crds/*.yaml" }}
{{- $crd := $ctx.Files.Get $path | fromYaml }}
{{- $_ := set $crd "metadata" (dict
  "name" $crd.metadata.name
  "labels" (include "gpu-stack-lib.labels" (dict "ctx" $ctx "name" $crd.metadata.name "component" $component) | fromYaml)
  "annotations" (dict "helm.sh/resource-policy" "keep" "argocd.argoproj.io/sync-options" "Delete=false")) }}
---
{{ toYaml $crd }}
{{- end }}
{{- end }}
