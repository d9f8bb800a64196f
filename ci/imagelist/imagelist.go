// Package imagelist finds the images a rendered chart runs and reads and writes the two lists that name them: the
// chart's images.txt (read by the air-gap bundle) and Chart.yaml's artifacthub.io/images annotation. Collect and
// Write are what `make generate` runs (ci/generate); tests/chart checks the committed lists against Collect.
//
// An image counts when a workload's pod template names it (containers, init containers, ephemeral containers) or
// when a container's env var listed in ImageEnvNames carries it: those are images a pod launches as workloads of
// its own (the validator's CUDA workload and its per-node validator pods), invisible in any pod template.
package imagelist

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ImageEnvNames are the container env vars whose literal value is an image the container launches as a workload:
// the validator's CUDA workload (CUDA_WORKLOAD_IMAGE) and the project's image it runs its validation pods with
// (VALIDATOR_IMAGE). Any other env var named *_IMAGE is an error until it is added here, so a new one cannot slip
// past the list.
var ImageEnvNames = []string{"CUDA_WORKLOAD_IMAGE", "VALIDATOR_IMAGE"}

// workloadKinds are the kinds whose pod template FromManifests reads, with a decoder to that template's spec.
var workloadKinds = map[schema.GroupKind]func([]byte) (*corev1.PodSpec, error){
	{Kind: "Pod"}: func(b []byte) (*corev1.PodSpec, error) {
		var o corev1.Pod
		return &o.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "batch", Kind: "Job"}: func(b []byte) (*corev1.PodSpec, error) {
		var o batchv1.Job
		return &o.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "batch", Kind: "CronJob"}: func(b []byte) (*corev1.PodSpec, error) {
		var o batchv1.CronJob
		return &o.Spec.JobTemplate.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "apps", Kind: "DaemonSet"}: func(b []byte) (*corev1.PodSpec, error) {
		var o appsv1.DaemonSet
		return &o.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "apps", Kind: "Deployment"}: func(b []byte) (*corev1.PodSpec, error) {
		var o appsv1.Deployment
		return &o.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "apps", Kind: "StatefulSet"}: func(b []byte) (*corev1.PodSpec, error) {
		var o appsv1.StatefulSet
		return &o.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
	{Group: "apps", Kind: "ReplicaSet"}: func(b []byte) (*corev1.PodSpec, error) {
		var o appsv1.ReplicaSet
		return &o.Spec.Template.Spec, yaml.Unmarshal(b, &o)
	},
}

// header is the part of every manifest FromManifests needs to decide whether to read it.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// FromManifests returns the images of a multi-document manifest stream (as `helm template` prints it, hooks
// included), sorted and unique. A workload container without an image, an image env var that is not a literal,
// or an unlisted *_IMAGE env var is an error naming the object, so nothing is silently left out.
func FromManifests(stream string) ([]string, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(stream)))
	seen := map[string]bool{}
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("split manifests: %w", err)
		}
		var h header
		if err := yaml.Unmarshal(doc, &h); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", sourceOf(doc), err)
		}
		decode, ok := workloadKinds[schema.FromAPIVersionAndKind(h.APIVersion, h.Kind).GroupKind()]
		if !ok {
			continue
		}
		what := fmt.Sprintf("%s %s (%s)", h.Kind, h.Metadata.Name, sourceOf(doc))
		spec, err := decode(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		images, err := podImages(spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		for _, img := range images {
			seen[img] = true
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for img := range seen {
			if !yield(img) {
				return
			}
		}
	}), nil
}

// podImages lists a pod spec's container images and the images its image env vars carry.
func podImages(spec *corev1.PodSpec) ([]string, error) {
	type container struct {
		name, image string
		env         []corev1.EnvVar
	}
	var all []container
	for _, c := range spec.InitContainers {
		all = append(all, container{c.Name, c.Image, c.Env})
	}
	for _, c := range spec.Containers {
		all = append(all, container{c.Name, c.Image, c.Env})
	}
	for _, c := range spec.EphemeralContainers {
		all = append(all, container{c.Name, c.Image, c.Env})
	}
	var out []string
	for _, c := range all {
		if c.image == "" {
			return nil, fmt.Errorf("container %s has no image", c.name)
		}
		out = append(out, c.image)
		for _, e := range c.env {
			listed := slices.Contains(ImageEnvNames, e.Name)
			switch {
			case !listed && strings.HasSuffix(e.Name, "_IMAGE"):
				return nil, fmt.Errorf("container %s: env %s looks like an image but is not in imagelist.ImageEnvNames: add it there (or rename it)", c.name, e.Name)
			case listed && e.ValueFrom != nil:
				return nil, fmt.Errorf("container %s: image env %s takes its value from elsewhere; it must be a literal so the image list can see it", c.name, e.Name)
			case listed && e.Value != "":
				out = append(out, e.Value)
			}
		}
	}
	return out, nil
}

// sourceOf is the `# Source:` template path helm writes above each manifest, for error messages.
func sourceOf(doc []byte) string {
	for line := range strings.Lines(string(doc)) {
		if src, ok := strings.CutPrefix(strings.TrimSpace(line), "# Source: "); ok {
			return src
		}
	}
	return "unknown template"
}
