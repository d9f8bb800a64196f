{{/*
gpu-stack-lib.rbac: a ServiceAccount and, when rules are given, a ClusterRole / Role bound to it.
dict "ctx" . "name" NAME ["clusterRules" (list RULE ...)] ["rules" (list RULE ...)] ["component" COMPONENT]
["annotations" MAP: put on every object, e.g. Helm hook annotations (gpu-stack-lib.hookRbac)]
["scc" NAME: on OpenShift, the SecurityContextConstraints the account's pods need (gpu-stack-lib.sccRules)]
Cluster-scoped names carry the release namespace so two releases in two namespaces do not collide.
*/}}
{{- define "gpu-stack-lib.rbac" -}}
{{- $meta := dict "ctx" .ctx "name" .name "component" .component -}}
{{- $rules := concat (.rules | default list) (include "gpu-stack-lib.sccRules" (dict "ctx" .ctx "scc" .scc) | fromYamlArray) -}}
{{- $annotations := .annotations -}}
{{- $clusterName := include "gpu-stack-lib.rbacClusterName" . -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  {{- include "gpu-stack-lib.metadata" $meta | nindent 2 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- with include "gpu-stack-lib.pullSecrets" .ctx }}
imagePullSecrets:
  {{- . | nindent 2 }}
{{- end }}
{{- if .clusterRules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $clusterName }}
  labels:
    {{- include "gpu-stack-lib.labels" $meta | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  {{- toYaml .clusterRules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $clusterName }}
  labels:
    {{- include "gpu-stack-lib.labels" $meta | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $clusterName }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end }}
{{- if $rules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  {{- include "gpu-stack-lib.metadata" $meta | nindent 2 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  {{- toYaml $rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  {{- include "gpu-stack-lib.metadata" $meta | nindent 2 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end }}
{{- end }}

{{/*
gpu-stack-lib.sccRules: on OpenShift (global.platform=openshift), the Role rule that lets a ServiceAccount `use` the
SecurityContextConstraints named scc, as a YAML list; empty elsewhere (the API group exists only there) and without
scc. OpenShift admits a pod only under an SCC its account may use, and every account may use only restricted-v2 by
default, which refuses privileged containers, hostPath volumes and host namespaces (hostPID, hostIPC,
hostNetwork), and any fixed runAsUser outside the namespace's UID range. So:
  privileged   pods with a privileged container, a hostPath volume or a host namespace (what the GPU Operator grants
               its operands);
  nonroot-v2   pods that need nothing of the host but run as a fixed non-root UID (the hook Jobs, 65532).
A Role in the release namespace is enough: SCC admission asks whether the pod's account may use the SCC in the
pod's namespace. dict "ctx" . "scc" NAME
*/}}
{{- define "gpu-stack-lib.sccRules" -}}
{{- if and .scc (eq (.ctx.Values.global.platform | default "generic") "openshift") -}}
- apiGroups: [security.openshift.io]
  resources: [securitycontextconstraints]
  resourceNames: [{{ .scc }}]
  verbs: [use]
{{- else -}}
[]
{{- end -}}
{{- end }}

{{/* gpu-stack-lib.rbacClusterName: the name of gpu-stack-lib.rbac's ClusterRole and ClusterRoleBinding; dict "ctx" . "name" NAME */}}
{{- define "gpu-stack-lib.rbacClusterName" -}}
{{- printf "%s-%s" .name .ctx.Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* gpu-stack-lib.configMap: dict "ctx" . "name" NAME "data" MAP */}}
{{- define "gpu-stack-lib.configMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  {{- include "gpu-stack-lib.metadata" (dict "ctx" .ctx "name" .name) | nindent 2 }}
data:
  {{- toYaml .data | nindent 2 }}
{{- end }}

{{/*
gpu-stack-lib.nfdFullname: the name prefix of every bundled NFD object (nfd.fullname): the upstream NFD chart's,
<release>-node-feature-discovery, or the release name alone when it already contains node-feature-discovery, cut
to 40 characters. Here so that the umbrella's cleanup names NFD's objects also when NFD is not bundled any more.
*/}}
{{- define "gpu-stack-lib.nfdFullname" -}}
{{- $name := "node-feature-discovery" -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/* gpu-stack-lib.denyPolicyBinding: the binding that makes ValidatingAdmissionPolicy NAME deny what it refuses; dict
"ctx" . "name" NAME */}}
{{- define "gpu-stack-lib.denyPolicyBinding" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "gpu-stack-lib.labels" (dict "ctx" .ctx "name" .name "component" "admission-policy") | nindent 4 }}
spec:
  policyName: {{ .name }}
  validationActions: [Deny]
{{- end }}
