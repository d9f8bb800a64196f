{{/*
validator.workloadEnv: environment of the checks that start a workload pod on the node (cuda, plugin): the pod's
image, pull policy, pull secrets, runtime class and service account, the CUDA sample image its workload runs (the plugin check's
optional workload runs it too), and the namespace to create it in.
*/}}
{{- define "validator.workloadEnv" -}}
{{- $secrets := list -}}
{{- range include "gpu-stack-lib.pullSecrets" . | fromYamlArray }}{{ $secrets = append $secrets .name }}{{ end -}}
OPERATOR_NAMESPACE: {fieldRef: {fieldPath: metadata.namespace}}
CUDA_WORKLOAD_IMAGE: {{ include "gpu-stack-lib.image" (dict "ctx" . "image" .Values.cuda.workloadImage) | quote }}
VALIDATOR_IMAGE: {{ include "gpu-stack-lib.stackImage" . | quote }}
VALIDATOR_IMAGE_PULL_POLICY: {{ .Values.global.stackImage.pullPolicy | quote }}
VALIDATOR_RUNTIME_CLASS: {{ include "gpu-stack-lib.runtimeClassName" . | quote }}
VALIDATOR_WORKLOAD_SERVICE_ACCOUNT: {{ include "validator.workloadServiceAccount" . }}
{{- with $secrets }}
VALIDATOR_IMAGE_PULL_SECRETS: {{ join "," . | quote }}
{{- end }}
{{- end }}

{{/*
validator.workloadServiceAccount: the service account of the validator's workload pods: one with no rights, so a pod
the validator creates never runs with the validator's own or another operand's account (the chart's admission
policy lets the validator create pods with this account only)
*/}}
{{- define "validator.workloadServiceAccount" -}}nvidia-validator-workload{{- end }}
