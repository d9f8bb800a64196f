{{/*
OS tags of driver-class operands: parsing NFD's os_release form (<ID><VERSION_ID>) into node selector requirements,
and the per-OS image tags of the NVIDIA driver image scheme.
*/}}

{{/*
gpu-stack-lib.osInfo: one OS tag (<ID><VERSION_ID> as NFD reports os_release, e.g. ubuntu22.04, rhel9) parsed into
{"tag", "id", "version", "suffix" (the tag without dots, for object names), "match" (node selector requirements
for gpu-stack-lib.podTemplate's `match`)}, as JSON. Letters (and inner dashes) are the ID, the rest the version. A
version without a dot (rhel9, rocky9, ol9: the images drop the minor version) matches VERSION_ID.major, so every
9.x node takes it. dict "tag" TAG "key" VALUES_KEY (named in the error).
*/}}
{{- define "gpu-stack-lib.osInfo" -}}
{{- $tag := toString .tag -}}
{{- if not (regexMatch "^[a-z]+(-[a-z]+)*[0-9]+(\\.[0-9]+)*$" $tag) -}}
{{- fail (printf "%s: %q is not an OS tag: write <ID><VERSION_ID> as NFD's feature.node.kubernetes.io/system-os_release labels show them, e.g. ubuntu22.04, ubuntu24.04, rhel9" .key $tag) -}}
{{- end -}}
{{- $id := regexFind "^[a-z]+(-[a-z]+)*" $tag -}}
{{- $version := trimPrefix $id $tag -}}
{{- $prefix := "feature.node.kubernetes.io/system-os_release" -}}
{{- $versionKey := ternary (printf "%s.VERSION_ID" $prefix) (printf "%s.VERSION_ID.major" $prefix) (contains "." $version) -}}
{{- toJson (dict
  "tag" $tag
  "id" $id
  "version" $version
  "suffix" (replace "." "" $tag)
  "match" (list
    (dict "key" (printf "%s.ID" $prefix) "operator" "In" "values" (list $id))
    (dict "key" $versionKey "operator" "In" "values" (list $version)))
) -}}
{{- end }}

{{/*
gpu-stack-lib.osList: a list of OS tags parsed with gpu-stack-lib.osInfo, as {"items": [...]}. Fails on an empty
list and on two tags that would put two driver pods on one node (same tag, or rhel9 next to rhel9.4).
dict "tags" (list ...) "key" VALUES_KEY
*/}}
{{- define "gpu-stack-lib.osList" -}}
{{- $key := .key -}}
{{- if not .tags }}{{ fail (printf "%s: list at least one OS tag of your GPU nodes (e.g. ubuntu22.04, ubuntu24.04, rhel9)" $key) }}{{ end -}}
{{- $items := list -}}
{{- range .tags -}}
{{- $os := include "gpu-stack-lib.osInfo" (dict "tag" . "key" $key) | fromJson -}}
{{- range $items -}}
{{- $oneMajorOnly := ne (contains "." .version) (contains "." $os.version) -}}
{{- if or (eq .suffix $os.suffix) (and (eq .id $os.id) $oneMajorOnly (eq (first (splitList "." .version)) (first (splitList "." $os.version)))) -}}
{{- fail (printf "%s: OS tags %q and %q select the same nodes; keep one" $key .tag $os.tag) -}}
{{- end -}}
{{- end -}}
{{- $items = append $items $os -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end }}

{{/*
gpu-stack-lib.osImage: an image whose tag gets the OS tag appended (<tag>-<os tag>, the NVIDIA driver image
scheme), resolved with gpu-stack-lib.image. A digest, when set, pins the image as given.
dict "ctx" . "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImage" -}}
{{- $img := deepCopy .image -}}
{{- with $img.tag }}{{ $_ := set $img "tag" (printf "%v-%s" . $.os.tag) }}{{ end -}}
{{- include "gpu-stack-lib.image" (dict "ctx" .ctx "image" $img) -}}
{{- end }}

{{/*
gpu-stack-lib.osImageID: repository[:<tag>-<os tag>][@digest] of an image, without its registry, for config digests:
moving to a mirror (global.imageRegistry) changes no digest. dict "image" IMAGE "os" OSINFO
*/}}
{{- define "gpu-stack-lib.osImageID" -}}
{{- $id := .image.repository -}}
{{- with .image.tag }}{{ $id = printf "%s:%v-%s" $id . $.os.tag }}{{ end -}}
{{- with .image.digest }}{{ $id = printf "%s@%s" $id . }}{{ end -}}
{{- $id -}}
{{- end }}

