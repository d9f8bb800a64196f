package chart

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// fluxDefaultTimeout is HelmReleaseSpec.Timeout's default, which install, upgrade and test fall back to.
const fluxDefaultTimeout = 5 * time.Minute

// The example files under docs/gitops, each checked by the test of the same name.
const (
	argoApplicationExample = "argocd-application.yaml"
	fluxOCIExample         = "flux-helmrelease-oci.yaml"
	fluxGitExample         = "flux-helmrelease-git.yaml"
)

// argoApplication holds exactly the Application fields Argo CD documents for what the example uses, plus
// ignoreDifferences so its absence can be asserted (there is no Argo CD Go module in this build): see
// https://argo-cd.readthedocs.io/en/stable/operator-manual/application.yaml and
// https://argo-cd.readthedocs.io/en/stable/user-guide/helm/. Decoded strictly, a misspelt or unknown field fails.
type argoApplication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Project string `json:"project"`
		Source  struct {
			RepoURL        string `json:"repoURL"`
			Chart          string `json:"chart,omitempty"`
			Path           string `json:"path,omitempty"`
			TargetRevision string `json:"targetRevision"`
			Helm           *struct {
				ReleaseName  string         `json:"releaseName,omitempty"`
				ValuesObject map[string]any `json:"valuesObject,omitempty"`
				Values       string         `json:"values,omitempty"`
				ValueFiles   []string       `json:"valueFiles,omitempty"`
			} `json:"helm,omitempty"`
		} `json:"source"`
		Destination struct {
			Server    string `json:"server,omitempty"`
			Name      string `json:"name,omitempty"`
			Namespace string `json:"namespace"`
		} `json:"destination"`
		ManagedNamespaceMetadata *struct {
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"managedNamespaceMetadata,omitempty"`
		SyncPolicy *struct {
			Automated *struct {
				Prune      bool `json:"prune,omitempty"`
				SelfHeal   bool `json:"selfHeal,omitempty"`
				AllowEmpty bool `json:"allowEmpty,omitempty"`
			} `json:"automated,omitempty"`
			SyncOptions []string `json:"syncOptions,omitempty"`
			Retry       *struct {
				Limit   int64 `json:"limit,omitempty"`
				Backoff *struct {
					Duration    string `json:"duration,omitempty"`
					Factor      int64  `json:"factor,omitempty"`
					MaxDuration string `json:"maxDuration,omitempty"`
				} `json:"backoff,omitempty"`
			} `json:"retry,omitempty"`
		} `json:"syncPolicy,omitempty"`
		IgnoreDifferences []map[string]any `json:"ignoreDifferences,omitempty"`
	} `json:"spec"`
}

// exampleDoc is one decoded document of an example file.
type exampleDoc struct {
	kind string
	obj  any // *corev1.Namespace, *sourcev1.OCIRepository, *sourcev1.GitRepository, *helmv2.HelmRelease, *argoApplication
}

// decodeStrict decodes one YAML document into out as the API server's strict field validation (kubectl apply
// --validate=strict) does: field names match case-sensitively, and unknown or duplicate fields are refused.
func decodeStrict(doc []byte, out any) error {
	body, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(body, out, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// decodeExample splits a multi-document YAML stream and decodes each document strictly into the Go type of its
// apiVersion and kind: Flux's own API types, Kubernetes' for a Namespace, the documented Argo CD fields for an
// Application.
func decodeExample(data []byte) ([]exampleDoc, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []exampleDoc
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			continue // comments only
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case sourcev1.GroupVersion.String() + " " + sourcev1.OCIRepositoryKind:
			obj = &sourcev1.OCIRepository{}
		case sourcev1.GroupVersion.String() + " " + sourcev1.GitRepositoryKind:
			obj = &sourcev1.GitRepository{}
		case helmv2.GroupVersion.String() + " " + helmv2.HelmReleaseKind:
			obj = &helmv2.HelmRelease{}
		case "argoproj.io/v1alpha1 Application":
			obj = &argoApplication{}
		default:
			return nil, fmt.Errorf("document %d: %s %s is not a kind these examples use", i, tm.APIVersion, tm.Kind)
		}
		if err := decodeStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		out = append(out, exampleDoc{kind: tm.Kind, obj: obj})
	}
}

func readExample(t *testing.T, name string) []exampleDoc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartrender.RepoRoot(), "docs", "gitops", name))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := decodeExample(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return docs
}

// only returns the one document of type T, failing unless there is exactly one.
func only[T any](t *testing.T, docs []exampleDoc) T {
	t.Helper()
	var found []T
	for _, d := range docs {
		if o, ok := d.obj.(T); ok {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T, found %d", zero, len(found))
	}
	return found[0]
}

// renderExampleValues renders the chart (as Flux's and Argo CD's helm would, for the newest supported Kubernetes)
// with an example's values and returns the values the chart then runs with (its defaults under the example's).
func renderExampleValues(t *testing.T, vals map[string]any) map[string]any {
	t.Helper()
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chartrender.Render(t.Context(), chrt, vals, chartrender.Newest); err != nil {
		t.Fatalf("the example's values do not render the chart: %v", err)
	}
	fresh, err := chartrender.Load(chartrender.ChartDir()) // rendering prunes disabled subcharts from chrt
	if err != nil {
		t.Fatal(err)
	}
	effective, err := chartutil.CoalesceValues(fresh, vals)
	if err != nil {
		t.Fatal(err)
	}
	return effective
}

// hookDeadline is how long a hook Job or Pod of the chart may live: the value at hooks.<key> (a timeoutSeconds)
// + 30 (activeDeadlineSeconds).
func hookDeadline(t *testing.T, vals map[string]any, key string) time.Duration {
	t.Helper()
	v, err := chartutil.Values(vals).PathValue("hooks." + key)
	if err != nil {
		t.Fatalf("hooks.%s: %v", key, err)
	}
	var seconds float64
	switch n := v.(type) {
	case float64:
		seconds = n
	case int64:
		seconds = float64(n)
	case int:
		seconds = float64(n)
	case json.Number:
		seconds, _ = n.Float64()
	default:
		t.Fatalf("hooks.%s is %T %v", key, v, v)
	}
	return time.Duration(seconds)*time.Second + 30*time.Second
}

func chartVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartrender.ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var md chart.Metadata
	if err := yaml.Unmarshal(data, &md); err != nil {
		t.Fatal(err)
	}
	return md.Version
}

// helmReleaseProblems names what an example HelmRelease gets wrong for a GPU cluster: Helm's timeouts must outlast
// the hooks' deadlines, the gate must be the wait, a failed install or upgrade must never be remediated (no
// rollback, no uninstall, no cleanup of a half-done rollout), helm test must run, drift must be corrected with no
// ignore rules, and the values must render the chart.
func helmReleaseProblems(t *testing.T, hr *helmv2.HelmRelease) []string {
	t.Helper()
	spec := hr.Spec
	if spec.Install == nil || spec.Upgrade == nil || spec.Test == nil || spec.DriftDetection == nil {
		return []string{"the HelmRelease must set install, upgrade, test and driftDetection"}
	}
	var vals map[string]any
	if spec.Values != nil {
		if err := json.Unmarshal(spec.Values.Raw, &vals); err != nil {
			t.Fatal(err)
		}
	}
	effective := renderExampleValues(t, vals)

	var problems []string
	defaultTimeout := metav1.Duration{Duration: fluxDefaultTimeout}
	if spec.Timeout != nil {
		defaultTimeout = *spec.Timeout
	}
	gate, plan, test := hookDeadline(t, effective, "validation.timeoutSeconds"), hookDeadline(t, effective, "preUpgrade.timeoutSeconds"), hookDeadline(t, effective, "test.timeoutSeconds")
	// the first install builds every node's driver: its gate has the longer installTimeoutSeconds
	firstGate := hookDeadline(t, effective, "validation.installTimeoutSeconds")
	for _, c := range []struct {
		action, key       string
		timeout, deadline time.Duration
	}{
		{"install", "validation.installTimeoutSeconds", spec.Install.GetTimeout(defaultTimeout).Duration, firstGate},
		{"install", "preUpgrade.timeoutSeconds", spec.Install.GetTimeout(defaultTimeout).Duration, plan},
		{"upgrade", "validation.timeoutSeconds", spec.Upgrade.GetTimeout(defaultTimeout).Duration, gate},
		{"upgrade", "preUpgrade.timeoutSeconds", spec.Upgrade.GetTimeout(defaultTimeout).Duration, plan},
		{"test", "test.timeoutSeconds", spec.Test.GetTimeout(defaultTimeout).Duration, test},
	} {
		if c.timeout <= c.deadline {
			problems = append(problems, fmt.Sprintf("%s timeout %s does not outlast hooks.%s + 30 = %s", c.action, c.timeout, c.key, c.deadline))
		}
	}
	if !spec.Install.DisableWait || !spec.Upgrade.DisableWait {
		problems = append(problems, "install and upgrade must set disableWait: the gate is the wait")
	}
	for _, a := range []struct {
		action string
		r      helmv2.Remediation
	}{{"install", spec.Install.GetRemediation()}, {"upgrade", spec.Upgrade.GetRemediation()}} {
		if a.r.GetRetries() != 0 || a.r.MustRemediateLastFailure() {
			problems = append(problems, fmt.Sprintf("%s remediation (retries %d, remediate last failure %v) would %s a half-done rollout",
				a.action, a.r.GetRetries(), a.r.MustRemediateLastFailure(), a.r.GetStrategy()))
		}
	}
	if spec.Upgrade.CleanupOnFail {
		problems = append(problems, "upgrade.cleanupOnFail deletes what a failed upgrade created")
	}
	if !spec.Test.Enable {
		problems = append(problems, "test.enable must be true")
	}
	if spec.DriftDetection.GetMode() != helmv2.DriftDetectionEnabled || len(spec.DriftDetection.Ignore) > 0 {
		problems = append(problems, fmt.Sprintf("driftDetection is %s with %d ignore rules, want enabled with none",
			spec.DriftDetection.GetMode(), len(spec.DriftDetection.Ignore)))
	}
	return problems
}

func checkHelmRelease(t *testing.T, hr *helmv2.HelmRelease) {
	t.Helper()
	for _, p := range helmReleaseProblems(t, hr) {
		t.Error(p)
	}
}

// checkNamespace checks the example's release namespace carries the Pod Security level the operands need.
func checkNamespace(t *testing.T, ns *corev1.Namespace, want string) {
	t.Helper()
	if ns.Name != want {
		t.Errorf("namespace %q, want %q", ns.Name, want)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s enforces Pod Security %q; the operands run privileged", ns.Name, ns.Labels["pod-security.kubernetes.io/enforce"])
	}
}

func TestFluxHelmReleaseFromOCIExample(t *testing.T) {
	t.Parallel()
	docs := readExample(t, fluxOCIExample)
	hr, repo, ns := only[*helmv2.HelmRelease](t, docs), only[*sourcev1.OCIRepository](t, docs), only[*corev1.Namespace](t, docs)
	checkNamespace(t, ns, hr.Namespace)
	checkHelmRelease(t, hr)

	ref := hr.Spec.ChartRef
	if ref == nil || hr.Spec.Chart != nil {
		t.Fatal("the HelmRelease must take its chart by chartRef from the OCIRepository")
	}
	refNS := ref.Namespace
	if refNS == "" {
		refNS = hr.Namespace
	}
	if ref.Kind != sourcev1.OCIRepositoryKind || ref.Name != repo.Name || refNS != repo.Namespace {
		t.Errorf("chartRef %s %s/%s does not name the OCIRepository %s/%s", ref.Kind, refNS, ref.Name, repo.Namespace, repo.Name)
	}
	if want := "oci://ghcr.io/kube-gpu-stack/charts/kube-gpu-stack"; repo.Spec.URL != want {
		t.Errorf("OCIRepository url %q, want %q", repo.Spec.URL, want)
	}
	if repo.Spec.Reference == nil || repo.Spec.Reference.Tag != chartVersion(t) {
		t.Errorf("OCIRepository ref %+v, want the chart's version %s pinned as a tag", repo.Spec.Reference, chartVersion(t))
	}
	if sel := repo.Spec.LayerSelector; sel == nil || sel.MediaType != "application/vnd.cncf.helm.chart.content.v1.tar+gzip" {
		t.Errorf("OCIRepository layerSelector %+v, want the Helm chart content layer", sel)
	}
}

func TestFluxHelmReleaseFromGitExample(t *testing.T) {
	t.Parallel()
	docs := readExample(t, fluxGitExample)
	hr, repo, ns := only[*helmv2.HelmRelease](t, docs), only[*sourcev1.GitRepository](t, docs), only[*corev1.Namespace](t, docs)
	checkNamespace(t, ns, hr.Namespace)
	checkHelmRelease(t, hr)

	if hr.Spec.Chart == nil || hr.Spec.ChartRef != nil {
		t.Fatal("the HelmRelease must take its chart by chart.spec from the GitRepository")
	}
	spec := hr.Spec.Chart.Spec
	if ref := spec.SourceRef; ref.Kind != sourcev1.GitRepositoryKind || ref.Name != repo.Name || (ref.Namespace != "" && ref.Namespace != repo.Namespace) {
		t.Errorf("chart.spec.sourceRef %+v does not name the GitRepository %s/%s", ref, repo.Namespace, repo.Name)
	}
	if spec.Chart != "./charts/kube-gpu-stack" {
		t.Errorf("chart.spec.chart %q, want ./charts/kube-gpu-stack", spec.Chart)
	}
	if _, err := os.Stat(filepath.Join(chartrender.RepoRoot(), spec.Chart, "Chart.yaml")); err != nil {
		t.Errorf("chart.spec.chart %q is not a chart in this repository: %v", spec.Chart, err)
	}
	if want := "https://github.com/kube-gpu-stack/kube-gpu-stack"; repo.Spec.URL != want {
		t.Errorf("GitRepository url %q, want %q", repo.Spec.URL, want)
	}
	if r := repo.Spec.Reference; r == nil || (r.Tag == "" && r.Commit == "" && r.SemVer == "") {
		t.Errorf("GitRepository ref %+v follows a branch; pin a tag or commit", r)
	}
	// The artifact must keep what the chart needs: the chart, which holds its library and operand subcharts.
	if repo.Spec.Ignore != nil {
		for _, keep := range []string{"!/charts/"} {
			if !strings.Contains(*repo.Spec.Ignore, keep) {
				t.Errorf("GitRepository ignore drops %s, which the chart needs", strings.TrimPrefix(keep, "!"))
			}
		}
	}
}

func TestArgoCDApplicationExample(t *testing.T) {
	t.Parallel()
	app := only[*argoApplication](t, readExample(t, argoApplicationExample))
	spec := app.Spec
	if len(spec.IgnoreDifferences) > 0 {
		t.Errorf("ignoreDifferences %v: the chart renders every field as the API server stores it, so none are needed", spec.IgnoreDifferences)
	}
	src := spec.Source
	if src.RepoURL != "ghcr.io/kube-gpu-stack/charts" || src.Chart != "kube-gpu-stack" || src.TargetRevision != chartVersion(t) {
		t.Errorf("source %s chart %s revision %s, want ghcr.io/kube-gpu-stack/charts chart kube-gpu-stack revision %s",
			src.RepoURL, src.Chart, src.TargetRevision, chartVersion(t))
	}
	if spec.Destination.Namespace != "gpu-operator" {
		t.Errorf("destination namespace %q, want gpu-operator", spec.Destination.Namespace)
	}
	if spec.SyncPolicy == nil {
		t.Fatal("no syncPolicy")
	}
	for _, opt := range []string{"CreateNamespace=true", "ServerSideApply=true"} {
		if !slices.Contains(spec.SyncPolicy.SyncOptions, opt) {
			t.Errorf("syncOptions %v lack %s", spec.SyncPolicy.SyncOptions, opt)
		}
	}
	if spec.SyncPolicy.Retry == nil || spec.SyncPolicy.Retry.Limit <= 0 {
		t.Error("syncPolicy.retry must bound its retries")
	}
	if m := spec.ManagedNamespaceMetadata; m == nil || m.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Error("the namespace Argo CD creates must enforce Pod Security privileged: the operands run privileged")
	}
	if src.Helm == nil || src.Helm.ValuesObject == nil {
		t.Fatal("the example sets its values in source.helm.valuesObject")
	}
	renderExampleValues(t, src.Helm.ValuesObject)
}

// TestExampleDecodingIsStrict is the check's control: a misspelt field, a field of the wrong type and an unknown
// kind must each be refused, naming what is wrong.
func TestExampleDecodingIsStrict(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ doc, want string }{
		"misspelt HelmRelease field": {`apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: x}
spec:
  interval: 10m
  upgrade: {remediaton: {retries: 0}}`, `unknown field "spec.upgrade.remediaton"`},
		"field of the wrong type": {`apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata: {name: x}
spec: {interval: 10m, url: oci://example.com/c, insecure: "yes"}`, "insecure"},
		"Argo CD field not documented": {`apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: x}
spec: {project: default, source: {repoURL: r, targetRevision: "1"}, destination: {namespace: gpu}, syncPolicy: {automated: {selfheal: true}}}`,
			`unknown field "spec.syncPolicy.automated.selfheal"`},
		"unknown kind": {`apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata: {name: x}`, "not a kind these examples use"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodeExample([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decoding gave %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestHelmReleaseChecksNameUnsafeSettings is the HelmRelease check's control: the OCI example with Flux's defaults
// put back (5m timeouts, Helm's wait, no test, no drift detection) and with a raised gate timeout, rollback and
// uninstall remediation, cleanup on failure and an ignore rule must be named, each of them.
func TestHelmReleaseChecksNameUnsafeSettings(t *testing.T) {
	t.Parallel()
	base := only[*helmv2.HelmRelease](t, readExample(t, fluxOCIExample))

	defaults := base.DeepCopy()
	defaults.Spec.Timeout, defaults.Spec.Install.Timeout, defaults.Spec.Upgrade.Timeout, defaults.Spec.Test.Timeout = nil, nil, nil, nil
	defaults.Spec.Install.DisableWait, defaults.Spec.Test.Enable = false, false
	defaults.Spec.DriftDetection.Mode = ""
	// 5m outlasts the default gate (240 + 30 s) but not one raised to 300 s
	defaults.Spec.Values.Raw = []byte(`{"hooks":{"validation":{"timeoutSeconds":300}}}`)

	unsafe := base.DeepCopy()
	unsafe.Spec.Upgrade.Remediation = &helmv2.UpgradeRemediation{Retries: 2}
	uninstall := helmv2.UninstallRemediationStrategy
	unsafe.Spec.Install.Remediation = &helmv2.InstallRemediation{RemediateLastFailure: new(true)}
	unsafe.Spec.Upgrade.Remediation.Strategy = &uninstall
	unsafe.Spec.Upgrade.CleanupOnFail = true
	unsafe.Spec.DriftDetection.Ignore = []helmv2.IgnoreRule{{Paths: []string{"/spec/template/spec/containers/0/image"}}}

	for name, tc := range map[string]struct {
		hr   *helmv2.HelmRelease
		want []string
	}{
		"defaults": {defaults, []string{
			"install timeout 5m0s does not outlast hooks.validation.installTimeoutSeconds + 30 = 25m30s",
			"upgrade timeout 5m0s does not outlast hooks.validation.timeoutSeconds + 30 = 5m30s",
			"install and upgrade must set disableWait: the gate is the wait",
			"test.enable must be true",
			"driftDetection is disabled with 0 ignore rules, want enabled with none",
		}},
		"unsafe": {unsafe, []string{
			"install remediation (retries 0, remediate last failure true) would uninstall a half-done rollout",
			"upgrade remediation (retries 2, remediate last failure true) would uninstall a half-done rollout",
			"upgrade.cleanupOnFail deletes what a failed upgrade created",
			"driftDetection is enabled with 1 ignore rules, want enabled with none",
		}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := helmReleaseProblems(t, tc.hr); !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}
