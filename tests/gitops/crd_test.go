package gitops

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/install"
)

// The NFD CRDs the chart bundles, and the one the upgrade test changes.
var (
	nfdCRDs        = []string{"nodefeaturegroups.nfd.k8s-sigs.io", "nodefeaturerules.nfd.k8s-sigs.io", "nodefeatures.nfd.k8s-sigs.io"}
	changedCRD     = "nodefeaturerules.nfd.k8s-sigs.io"
	changedCRDFile = "files/crds/nodefeaturerules.yaml"
	crdResource    = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// TestBundledCRDsUpgradeWithTheChart: in bundled mode the NFD CRDs are ordinary templates, so `helm upgrade` (and
// Flux's upgrade, and Argo CD's sync) updates them: the chart is installed through the helm SDK, then upgraded
// with a chart whose NodeFeatureRule CRD differs, and the API server must serve the new CRD. helm.sh/resource-policy
// keep leaves them in place on uninstall (deleting a CRD deletes every object of its kind in the cluster).
func TestBundledCRDsUpgradeWithTheChart(t *testing.T) {
	crds := dynamicCRDs(t)
	removeNFDCRDs(t, crds) // a CRD without Helm's ownership marks would make the install refuse
	t.Cleanup(func() { removeNFDCRDs(t, crds) })
	target := install.Target{Kubeconfig: kube.Kubeconfig, Release: "crd-owner", Namespace: "gpu-crd-owner", Timeout: 2 * time.Minute, NoWait: true}
	// The CRDs do not need the hooks or running operands: no hooks, no wait.
	values := []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml")}
	set := []string{"hooks.validation.enabled=false", "hooks.test.enabled=false", "hooks.preUpgrade.enabled=false", "hooks.cleanup.enabled=false"}
	if _, err := target.Install(t.Context(), values, set...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Uninstall() })

	installed := getCRD(t, crds, changedCRD)
	if got := installed.GetAnnotations()["meta.helm.sh/release-name"]; got != target.Release {
		t.Fatalf("CRD %s is not the release's: meta.helm.sh/release-name %q", changedCRD, got)
	}
	const marker = " Changed by the upgrade test."
	if strings.Contains(schemaDescription(t, installed), marker) {
		t.Fatal("the installed CRD already carries the upgrade's change")
	}

	// the next chart version: the same values, the CRD's schema description changed
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	editChartFile(t, chrt, "node-feature-discovery", changedCRDFile, func(b []byte) []byte {
		const line = "description: Rules that customize nodes (labels, annotations, taints, extended resources) from their features."
		if !bytes.Contains(b, []byte(line)) {
			t.Fatalf("%s no longer has the description the test changes", changedCRDFile)
		}
		return bytes.Replace(b, []byte(line), []byte(strings.TrimSuffix(line, ".")+"."+marker), 1)
	})
	vals, err := chartrender.Values(values, set)
	if err != nil {
		t.Fatal(err)
	}
	cfg := helmConfig(t, target)
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Timeout = target.Namespace, target.Timeout
	if _, err := up.RunWithContext(t.Context(), target.Release, chrt, vals); err != nil {
		t.Fatalf("helm upgrade with the changed CRD: %v", err)
	}

	upgraded := getCRD(t, crds, changedCRD)
	if d := schemaDescription(t, upgraded); !strings.Contains(d, marker) {
		t.Errorf("helm upgrade did not update CRD %s: description %q", changedCRD, d)
	}
	if upgraded.GetGeneration() <= installed.GetGeneration() {
		t.Errorf("CRD %s: generation %d -> %d, want it moved", changedCRD, installed.GetGeneration(), upgraded.GetGeneration())
	}
	for _, name := range nfdCRDs {
		if name != changedCRD && getCRD(t, crds, name).GetGeneration() != 1 {
			t.Errorf("CRD %s changed though its template did not", name)
		}
	}

	if err := target.Uninstall(); err != nil {
		t.Fatal(err)
	}
	for _, name := range nfdCRDs {
		getCRD(t, crds, name) // kept
	}
}

// TestExternalNFDRendersNoCRD: with nfd.mode=external (or none) another chart owns the NFD CRDs, so this chart
// renders none, and two charts never own one CRD. Bundled mode is the control: it renders all three. The chart
// (and every subchart) has no crds/ folder, whose CRDs Helm would install once and never upgrade.
func TestExternalNFDRendersNoCRD(t *testing.T) {
	chrt, err := chartrender.Load(chartrender.ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	if files := chrt.CRDObjects(); len(files) > 0 {
		t.Errorf("the chart has files in a crds/ folder: %s", files[0].Filename)
	}
	for _, tc := range []struct {
		mode string
		set  []string
		want []string
	}{
		{"bundled", nil, nfdCRDs},
		{"external", nil, nil},
		// without NFD, GPU feature discovery cannot publish through its NodeFeature API
		{"none", []string{"gfd.useNodeFeatureAPI=false"}, nil},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var got []string
			for _, o := range renderObjects(t, nil, append([]string{"nfd.mode=" + tc.mode}, tc.set...)...) {
				if o.gvk.GroupKind() == crdKind {
					got = append(got, o.name)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("nfd.mode=%s renders CRDs %v, want %v", tc.mode, got, tc.want)
			}
		})
	}
}

// editChartFile replaces the bytes of one of a (sub)chart's files.
func editChartFile(t *testing.T, c *chart.Chart, subchart, name string, edit func([]byte) []byte) {
	t.Helper()
	for _, d := range c.Dependencies() {
		if d.Name() != subchart {
			continue
		}
		for _, f := range d.Files {
			if f.Name == name {
				f.Data = edit(f.Data)
				return
			}
		}
	}
	t.Fatalf("chart %s has no file %s", subchart, name)
}

// helmConfig is the helm SDK's configuration for a target, as `helm --kubeconfig --namespace` builds it.
func helmConfig(t *testing.T, target install.Target) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &target.Kubeconfig, &target.Namespace
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, target.Namespace, "secret", func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func dynamicCRDs(t *testing.T) dynamic.NamespaceableResourceInterface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn.Resource(crdResource)
}

func getCRD(t *testing.T, crds dynamic.NamespaceableResourceInterface, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := crds.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CRD %s: %v", name, err)
	}
	return u
}

func schemaDescription(t *testing.T, crd *unstructured.Unstructured) string {
	t.Helper()
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) == 0 {
		t.Fatalf("CRD %s has no versions", crd.GetName())
	}
	v, _ := versions[0].(map[string]any)
	d, _, _ := unstructured.NestedString(v, "schema", "openAPIV3Schema", "description")
	return d
}

// removeNFDCRDs deletes the NFD CRDs, if any, and waits until they are gone.
func removeNFDCRDs(t *testing.T, crds dynamic.NamespaceableResourceInterface) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range nfdCRDs {
		if err := crds.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete CRD %s: %v", name, err)
		}
	}
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, name := range nfdCRDs {
			if _, err := crds.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("NFD CRDs not gone: %v", err)
	}
}
