package gpumigrate

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// releaseFile is the vendored values.yaml of a GPU Operator release.
func releaseFile(tag string) string {
	return filepath.Join("testdata", "gpu-operator-"+tag, "values.yaml")
}

// migrateValues runs `migrate -f FILE [--from-version from] -o ... --report ...` on values written to a file, as a
// user would, and returns the result and the values file and report it wrote.
func migrateValues(t *testing.T, values map[string]any, from string) (r Result, valuesFile, report string) {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join(dir, "operator-values.yaml")
	body, err := sigsyaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, body, 0o600); err != nil {
		t.Fatal(err)
	}
	o := Options{File: in, FromVersion: from, Out: filepath.Join(dir, "values.yaml"), Report: filepath.Join(dir, "report.txt")}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if r, err = o.Run(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(o.Out)
	rep, _ := os.ReadFile(o.Report)
	return r, string(out), string(rep)
}

// fullCopy is a release's vendored values.yaml with a site's changes merged over it, as a site edits its copy.
func fullCopy(t *testing.T, tag, changes string) map[string]any {
	t.Helper()
	values := parse(t, releaseFile(tag)).Values
	if changes != "" {
		site, err := ParseFile([]byte(changes))
		if err != nil {
			t.Fatal(err)
		}
		mergeMaps(values, site.Values)
	}
	return values
}

// TestKnownReleasesAreVendored: migrate knows the defaults of each vendored release, oldest first, and each file
// says where it came from.
func TestKnownReleasesAreVendored(t *testing.T) {
	want := []string{"v23.9.2", "v24.3.0", "v24.6.2", "v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3", OperatorTag}
	if got := KnownVersions(); !slices.Equal(got, want) {
		t.Fatalf("known releases %v, want %v", got, want)
	}
	for _, tag := range want {
		data, err := os.ReadFile(releaseFile(tag))
		if err != nil {
			t.Fatal(err)
		}
		header := string(data[:300])
		for _, w := range []string{"github.com/NVIDIA/gpu-operator, tag " + tag, "(commit ", "deployments/gpu-operator/values.yaml"} {
			if !strings.Contains(header, w) {
				t.Errorf("%s: the header does not say %q", releaseFile(tag), w)
			}
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(releaseFile(tag)), "LICENSE")); err != nil {
			t.Errorf("%s: no LICENSE beside it", releaseFile(tag))
		}
		if len(releaseDefaults()[tag]) < 20 {
			t.Errorf("%s parsed to %d keys", tag, len(releaseDefaults()[tag]))
		}
	}
}

// TestRecognisesEachRelease: a full copy of a release's values.yaml, as it is or with a site's changes, is
// recognised as that release and the report says how; a file of the site's own settings is recognised as none,
// and the report says v26.7.0's keys are assumed and nothing is dropped.
func TestRecognisesEachRelease(t *testing.T) {
	for _, tag := range KnownVersions() {
		for name, values := range map[string]map[string]any{
			"as vendored":          parse(t, releaseFile(tag)).Values,
			"with the site corpus": corpusCopy(t, tag),
		} {
			t.Run(tag+" "+name, func(t *testing.T) {
				src := Recognise(values)
				if src.Version != tag || !strings.HasPrefix(src.How, "recognised: ") || !strings.Contains(src.How, tag+"'s defaults") {
					t.Errorf("recognised as %q (%s), want %s", src.Version, src.How, tag)
				}
			})
		}
	}
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, f := range files {
		src := Recognise(parse(t, f).Values)
		if src.Version != "" || src.Doubt != "" {
			t.Errorf("%s, a file of a site's own settings, is recognised as %q (%s; %s)", f, src.Version, src.How, src.Doubt)
		}
		for _, w := range []string{"no known release's defaults recognised", OperatorTag, "every value is kept", "--from-version"} {
			if !strings.Contains(src.How, w) {
				t.Errorf("%s: the report's line %q does not say %q", f, src.How, w)
			}
		}
	}
}

// A full copy of a release migrate does not know (here v25.10.1's file with every image version moved, as a patch
// release moves them) is recognised as none; its defaults would pin that release's images, so the report asks for
// --from-version as a decision instead of a line easy to miss.
func TestFullCopyOfAnUnknownReleaseIsADecision(t *testing.T) {
	values := fullCopy(t, "v25.10.1", "")
	for p, v := range imageVersionPaths("", releaseDefaults()["v25.10.1"]) {
		setPath(values, p, v+"-next")
	}
	r, _, _ := migrateValues(t, values, "")
	if r.Source.Version != "" {
		t.Fatalf("a copy of an unknown release is read as %s: %s", r.Source.Version, r.Source.How)
	}
	if e := entry(t, r, "(source) GPU Operator release"); e.Action != Decision || !strings.Contains(e.Why, "--from-version") {
		t.Errorf("the unknown release's copy: %s (%s), want a decision naming --from-version", e.Action, e.Why)
	}
}

// A v25.x values.yaml's default vfioManager image is nvcr.io/nvidia/cuda:13.0.1-base-ubi9, a CUDA base image
// without vfio-manage: converted as a site's setting it became this chart's vfio-manager image, and every
// vm-passthrough node failed. A full copy's defaults are dropped, so the chart runs its own image, and the report
// says why each was dropped.
func TestFullV25CopyRunsNoCUDAVfioManager(t *testing.T) {
	for name, changes := range map[string]string{
		"as vendored": "",
		// a site that mirrors the VFIO manager keeps its pull secret, not the CUDA image
		"with a change in the vfioManager block": `{vfioManager: {imagePullSecrets: [corp-pull]}, sandboxWorkloads: {enabled: true}}`,
	} {
		t.Run(name, func(t *testing.T) {
			r, values, report := migrateValues(t, fullCopy(t, "v25.10.1", changes), "")
			if img, set := getPath(r.Values, "vfioManager.image"); set {
				t.Errorf("vfioManager.image = %v: the v25.10.1 default CUDA image was carried over", img)
			}
			if strings.Contains(values, "cuda") {
				t.Errorf("the values name a CUDA image:\n%s", values)
			}
			for _, key := range []string{"vfioManager.image", "vfioManager.version", "vfioManager.repository"} {
				if !slices.ContainsFunc(r.Report, func(e Entry) bool {
					return (e.Key == key || strings.HasPrefix(key, e.Key+".")) && e.Action == Dropped && strings.Contains(e.Why, "the GPU Operator v25.10.1 default")
				}) {
					t.Errorf("the report does not drop %s as the v25.10.1 default", key)
				}
			}
			if !strings.Contains(report, "GPU Operator release: v25.10.1 (recognised: ") {
				t.Errorf("the report does not say v25.10.1 was recognised:\n%s", report)
			}
		})
	}
	r, _, _ := migrateValues(t, fullCopy(t, "v25.10.1", `{vfioManager: {imagePullSecrets: [corp-pull]}}`), "")
	if ps, _ := getPath(r.Values, "vfioManager.imagePullSecrets"); !equal(ps, []any{"corp-pull"}) {
		t.Errorf("the site's vfioManager.imagePullSecrets became %v", ps)
	}
}

// Every operand image tag of a full v24.x copy is that release's default: none may be pinned over this chart's
// tested tags (the operator's 24.9.2 device plugin v0.17.0, toolkit v1.17.4-ubuntu20.04, ...).
func TestFullV24CopyPinsNoOperandTag(t *testing.T) {
	r, values, report := migrateValues(t, fullCopy(t, "v24.9.2", ""), "")
	var pinned []string
	for _, p := range leaves("", r.Values) {
		if strings.Contains(p, "image.") || strings.HasSuffix(p, ".image") {
			pinned = append(pinned, p)
		}
	}
	if len(pinned) > 0 {
		t.Errorf("a full v24.9.2 copy pins %v:\n%s", pinned, values)
	}
	for p, v := range imageVersionPaths("", releaseDefaults()["v24.9.2"]) {
		if strings.Contains(values, v) {
			t.Errorf("the values carry %s's v24.9.2 default %s:\n%s", p, v, values)
		}
	}
	if !strings.Contains(report, "the GPU Operator v24.9.2 default") || !strings.Contains(report, "GPU Operator release: v24.9.2 (recognised: ") {
		t.Errorf("the report does not name the v24.9.2 defaults:\n%s", report)
	}
	// the site's own tag is still its setting
	r, _, _ = migrateValues(t, fullCopy(t, "v24.9.2", `{driver: {version: "550.163.01"}, toolkit: {version: v1.17.8}}`), "")
	for path, want := range map[string]string{"driver.image.tag": "550.163.01", "toolkit.image.tag": "v1.17.8"} {
		if got, _ := getPath(r.Values, path); got != want {
			t.Errorf("%s = %v, want the site's %s", path, got, want)
		}
	}
}

// A changed version of an operand whose default image the operator swapped (v25.x vfioManager: a CUDA tag) is no
// tag of this chart's image: it is not carried over, and the report says why.
func TestVersionOfAnotherImageIsADecision(t *testing.T) {
	r, _, _ := migrateValues(t, fullCopy(t, "v25.10.1", `{vfioManager: {version: 13.0.2-base-ubi9}}`), "")
	if tag, set := getPath(r.Values, "vfioManager.image.tag"); set {
		t.Errorf("vfioManager.image.tag = %v: a CUDA tag on this chart's vfio-manager image", tag)
	}
	e := entry(t, r, "vfioManager.version")
	if e.Action != Decision || !strings.Contains(e.Why, "nvcr.io/nvidia/cuda") || !strings.Contains(e.Why, "k8s-driver-manager") {
		t.Errorf("vfioManager.version: %s (%s), want a decision naming both images", e.Action, e.Why)
	}
}

// --from-version names the release; an unknown one fails naming those migrate knows, one that does not match the
// file is used but the report says what the file looks like.
func TestFromVersion(t *testing.T) {
	for _, v := range []string{"v99.1.0", "25.3.2", "latest"} {
		o := Options{File: releaseFile("v25.10.1"), FromVersion: v}
		err := o.Validate()
		if err == nil {
			t.Fatalf("--from-version %s accepted", v)
		}
		for _, w := range append(KnownVersions(), "--from-version "+v) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("--from-version %s: the error does not say %q: %v", v, w, err)
			}
		}
	}

	r, _, report := migrateValues(t, fullCopy(t, "v25.10.1", ""), "25.10.1")
	if r.Source.Version != "v25.10.1" || !strings.Contains(report, "GPU Operator release: v25.10.1 (given with --from-version)") {
		t.Errorf("--from-version 25.10.1: source %+v; report:\n%s", r.Source, report)
	}
	if _, set := getPath(r.Values, "vfioManager"); set {
		t.Errorf("--from-version 25.10.1 kept vfioManager %v", r.Values["vfioManager"])
	}

	r, _, _ = migrateValues(t, fullCopy(t, "v25.10.1", ""), OperatorTag)
	if r.Source.Version != OperatorTag || !strings.Contains(r.Source.How, "look like v25.10.1's") {
		t.Errorf("--from-version %s on a v25.10.1 copy: %+v, want a note that it looks like v25.10.1", OperatorTag, r.Source)
	}
	if e := entry(t, r, "(source) GPU Operator release"); e.Action != Decision || !strings.Contains(e.Why, "check --from-version") {
		t.Errorf("--from-version %s on a v25.10.1 copy: %s (%s), want a decision", OperatorTag, e.Action, e.Why)
	}
}

// Every key of a full copy is still accounted for: dropped as the release's default, or converted.
func TestEveryKeyOfAFullCopyIsReported(t *testing.T) {
	for _, tag := range KnownVersions() {
		values := corpusCopy(t, tag)
		r := ConvertClusterFrom(Cluster{Input: Input{Values: values}}, Recognise(values))
		for _, k := range leaves("", values) {
			if !accounted(r.Report, k) {
				t.Errorf("%s: input key %s is not in the report", tag, k)
			}
		}
		for _, e := range r.Report {
			if e.Action == Unknown {
				t.Errorf("%s: %s has no place: %s", tag, e.Key, e.Why)
			}
		}
	}
}

// A block the site configured keeps its switch as it ran: the v26.7.0 operator's ServiceMonitor is on by default,
// and a site that set its interval scrapes through it; dropping `enabled` as a default would lose it.
func TestConfiguredBlockKeepsItsSwitch(t *testing.T) {
	r, _, _ := migrateValues(t, fullCopy(t, OperatorTag, `{dcgmExporter: {serviceMonitor: {interval: 30s}}}`), "")
	wantValues(t, r, `{dcgmExporter: {enabled: true, serviceMonitor: {enabled: true, interval: 30s}}}`)
	r, _, _ = migrateValues(t, fullCopy(t, OperatorTag, ""), "")
	if len(r.Values) != 0 {
		t.Errorf("the v26.7.0 defaults as they are converted to %v", r.Values)
	}
}

// The operator points the exporter at the standalone DCGM (nvidia-dcgm:5555); this chart refuses dcgm.enabled
// without that address, so migrate writes it.
func TestStandaloneDCGMPointsTheExporterAtIt(t *testing.T) {
	wantValues(t, convertYAML(t, `dcgm: {enabled: true}`), `{dcgm: {enabled: true}, dcgmExporter: {remoteHostEngine: "nvidia-dcgm:5555"}}`)
	wantValues(t, convertYAML(t, `dcgm: {enabled: false}`), `{dcgm: {enabled: false}}`)
}
