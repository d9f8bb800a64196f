package imagelist

import (
	"slices"
	"strings"
	"testing"
)

const workloads = `---
# Source: chart/templates/pod.yaml
apiVersion: v1
kind: Pod
metadata:
  name: test-pod
  annotations:
    helm.sh/hook: test
spec:
  initContainers:
  - name: init
    image: reg.example.com/init:v1
  containers:
  - name: main
    image: reg.example.com/main:v1
    env:
    - name: CUDA_WORKLOAD_IMAGE
      value: reg.example.com/cuda:12
    - name: VALIDATOR_IMAGE
      value: reg.example.com/validator:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    - name: VALIDATOR_IMAGE_PULL_POLICY
      value: reg.example.com/not-an-image:v1
  ephemeralContainers:
  - name: debug
    image: reg.example.com/debug:v1
---
# Source: chart/templates/job.yaml
apiVersion: batch/v1
kind: Job
metadata:
  name: hook
spec:
  template:
    spec:
      containers:
      - name: c
        image: reg.example.com/job:v1
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: cron
spec:
  schedule: "* * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: c
            image: reg.example.com/cron:v1
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ds
spec:
  template:
    spec:
      initContainers:
      - name: i
        image: reg.example.com/ds-init:v1
      containers:
      - name: c
        image: reg.example.com/main:v1
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: deploy
spec:
  template:
    spec:
      containers:
      - name: c
        image: reg.example.com/deploy:v1
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: sts
spec:
  template:
    spec:
      containers:
      - name: c
        image: reg.example.com/sts:v1
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: rs
spec:
  template:
    spec:
      containers:
      - name: c
        image: reg.example.com/rs:v1
---
# a ConfigMap and a foreign Job kind carry image-like strings that no pod of this chart runs
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
data:
  image: reg.example.com/configmap:v1
---
apiVersion: example.com/v1
kind: Job
metadata:
  name: foreign
spec:
  template:
    spec:
      containers:
      - name: c
        image: reg.example.com/foreign:v1
---
# Source: chart/templates/empty.yaml
`

func TestFromManifestsCollectsEveryWorkloadImage(t *testing.T) {
	got, err := FromManifests(workloads)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"reg.example.com/cron:v1",
		"reg.example.com/cuda:12",
		"reg.example.com/debug:v1",
		"reg.example.com/deploy:v1",
		"reg.example.com/ds-init:v1",
		"reg.example.com/init:v1",
		"reg.example.com/job:v1",
		"reg.example.com/main:v1",
		"reg.example.com/rs:v1",
		"reg.example.com/sts:v1",
		"reg.example.com/validator:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	}
	if !slices.Equal(got, want) {
		t.Errorf("FromManifests:\n got %q\nwant %q", got, want)
	}
}

func TestFromManifestsRefusesWhatItCannotList(t *testing.T) {
	pod := func(container string) string {
		return "# Source: chart/templates/p.yaml\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n" + container
	}
	for _, tc := range []struct {
		name, stream string
		wantErr      []string
	}{
		{"no image", pod("  - name: c\n"), []string{"Pod p", "chart/templates/p.yaml", "container c has no image"}},
		{"unlisted image env", pod("  - name: c\n    image: r.io/a:1\n    env:\n    - name: SIDECAR_IMAGE\n      value: r.io/b:1\n"),
			[]string{"Pod p", "SIDECAR_IMAGE", "ImageEnvNames"}},
		{"image env from a ConfigMap", pod("  - name: c\n    image: r.io/a:1\n    env:\n    - name: CUDA_WORKLOAD_IMAGE\n      valueFrom:\n        configMapKeyRef: {name: x, key: y}\n"),
			[]string{"Pod p", "CUDA_WORKLOAD_IMAGE", "literal"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromManifests(tc.stream)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestFormatThenParse(t *testing.T) {
	refs := []string{"z.io/b:1", "a.io/x/y:2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "z.io/b:1", "localhost:5000/c:3"}
	text := string(Format(refs))
	if !strings.HasPrefix(text, Header) {
		t.Errorf("Format does not start with the header:\n%s", text)
	}
	wantBody := "a.io/x/y:2@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nlocalhost:5000/c:3\nz.io/b:1\n"
	if body := strings.TrimPrefix(text, Header); body != wantBody {
		t.Errorf("Format body:\n%s\nwant sorted and unique:\n%s", body, wantBody)
	}
	got, err := Parse(text + "\n  # an indented comment\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Fields(wantBody); !slices.Equal(got, want) {
		t.Errorf("Parse: got %q, want %q", got, want)
	}
}

func TestParseNamesTheBadLine(t *testing.T) {
	for _, tc := range []struct{ line, why string }{
		{"nvcr.io/nvidia/driver", "no tag"},
		{"busybox:1.36", "names no registry"},
		{"library/busybox:1.36", "names no registry"},
		{"nvcr.io/Nvidia/driver:1", "uppercase"},
	} {
		_, err := Parse("# header\n\nnvcr.io/ok:1\n" + tc.line + "\n")
		if err == nil {
			t.Errorf("%q (%s): accepted", tc.line, tc.why)
			continue
		}
		if !strings.HasPrefix(err.Error(), FileName+":4: ") {
			t.Errorf("%q: error %q does not name line 4", tc.line, err)
		}
	}
}

func TestArtifactHubNamesAreShortAndUnique(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	const d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	got := ArtifactHubImages([]string{
		"nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
		"nvcr.io/nvidia/driver:595.91.07-rhel9",
		"nvcr.io/nvidia/driver:570.195.03-rhel9",
		"nvcr.io/nvidia/driver:570.195.03-rhel9", // duplicates collapse
		"ghcr.io/a/tool@" + d1,
		"ghcr.io/a/tool@" + d2,
		"ghcr.io/a/agent:1",
		"quay.io/b/agent:1",
	})
	want := []ArtifactHubImage{
		{"a-agent-1", "ghcr.io/a/agent:1"},
		{"tool-111111111111", "ghcr.io/a/tool@" + d1},
		{"tool-222222222222", "ghcr.io/a/tool@" + d2},
		{"driver-570.195.03-rhel9", "nvcr.io/nvidia/driver:570.195.03-rhel9"},
		{"driver-595.91.07-rhel9", "nvcr.io/nvidia/driver:595.91.07-rhel9"},
		{"k8s-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"},
		{"b-agent-1", "quay.io/b/agent:1"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("ArtifactHubImages:\n got %v\nwant %v", got, want)
	}
}

func TestArtifactHubValueRoundTrips(t *testing.T) {
	refs := []string{"nvcr.io/nvidia/driver:595.91.07-rhel9", "r.io/x:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	value := FormatArtifactHubImages(refs)
	want := "- name: driver\n  image: nvcr.io/nvidia/driver:595.91.07-rhel9\n- name: x\n  image: r.io/x:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
	if value != want {
		t.Errorf("FormatArtifactHubImages:\n%s\nwant:\n%s", value, want)
	}
	parsed, err := ParseArtifactHubImages(value)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(parsed, ArtifactHubImages(refs)) {
		t.Errorf("parsed %v, want %v", parsed, ArtifactHubImages(refs))
	}
	if _, err := ParseArtifactHubImages("- name: x\n  image: r.io/x:1\n  imag: typo\n"); err == nil {
		t.Error("an unknown field was accepted")
	}
}

const chartYAML = `apiVersion: v2
name: demo
annotations:
  artifacthub.io/license: Apache-2.0
  artifacthub.io/images: |
    - name: old
      image: r.io/old:1

    - name: older
      image: r.io/older:1

  artifacthub.io/links: |
    - name: source
      url: https://example.com
dependencies:
  - name: lib
    version: 0.1.0
`

func TestSetChartAnnotationReplacesOnlyThatValue(t *testing.T) {
	value := "- name: new\n  image: r.io/new:2\n"
	got, err := SetChartAnnotation([]byte(chartYAML), ImagesAnnotation, value)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(chartYAML,
		"    - name: old\n      image: r.io/old:1\n\n    - name: older\n      image: r.io/older:1\n",
		"    - name: new\n      image: r.io/new:2\n", 1)
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	again, err := SetChartAnnotation(got, ImagesAnnotation, value)
	if err != nil || string(again) != string(got) {
		t.Errorf("setting the same value again changed the file (err %v):\n%s", err, again)
	}
	ann, err := ChartAnnotations(got)
	if err != nil {
		t.Fatal(err)
	}
	if ann["artifacthub.io/links"] != "- name: source\n  url: https://example.com\n" || ann["artifacthub.io/license"] != "Apache-2.0" {
		t.Errorf("other annotations changed: %q", ann)
	}
}

func TestSetChartAnnotationAddsAMissingOne(t *testing.T) {
	in := "apiVersion: v2\nannotations:\n  artifacthub.io/license: Apache-2.0\n\ndependencies: []\n"
	got, err := SetChartAnnotation([]byte(in), ImagesAnnotation, "- name: a\n  image: r.io/a:1\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "apiVersion: v2\nannotations:\n  artifacthub.io/license: Apache-2.0\n  artifacthub.io/images: |\n    - name: a\n      image: r.io/a:1\n\ndependencies: []\n"
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if _, err := SetChartAnnotation([]byte("apiVersion: v2\nname: x\n"), ImagesAnnotation, "- a\n"); err == nil ||
		!strings.Contains(err.Error(), "annotations") {
		t.Errorf("a Chart.yaml without annotations: err %v, want one naming the missing mapping", err)
	}
}

func TestUserSupplied(t *testing.T) {
	for ref, want := range map[string]bool{
		"nvcr.io/nvaie/vgpu-manager:595.91.07-ubuntu22.04":                                                true,
		"image-registry.openshift-image-registry.svc:5000/openshift/driver-toolkit:418.94.202502251302-0": true,
		"nvcr.io/nvidia/driver:595.91.07-ubuntu22.04":                                                     false,
		"mirror.example.com/nvaie/vgpu-manager:1":                                                         false,
	} {
		if got := UserSupplied(ref); got != want {
			t.Errorf("UserSupplied(%s) = %v, want %v", ref, got, want)
		}
	}
}
