package e2e

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/airgaptest"
)

// TestAirgapInstallFromPrivateRegistry: the chart archive from the air-gapped bundle, pushed with Helm's registry
// client as an OCI chart into the private registry the bundle's images were mirrored into, installs with
// `helm install oci://…` and the mirror's values-airgap.yaml (that registry, every image pinned to the digest
// bundled); every container of every pod the release
// runs (operands, init containers, sidecars, hook pods) takes its image from there, and each is there, by digest,
// as bundled. Both registries are in-process on 127.0.0.1.
func TestAirgapInstallFromPrivateRegistry(t *testing.T) {
	e := use(t)
	e.stand.Reset()
	m := airgaptest.BundleAndMirror(t, chartrender.ChartDir())
	md, err := chartutil.LoadChartfile(filepath.Join(chartrender.ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(m.ChartFile)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := client.Push(archive, m.Private+"/charts/kube-gpu-stack:"+md.Version)
	if err != nil {
		t.Fatalf("helm push: %v", err)
	}
	t.Logf("chart pushed as %s (%s)", pushed.Ref, pushed.Manifest.Digest)

	tg := e.target()
	tg.Chart, tg.ChartVersion = "oci://"+m.Private+"/charts/kube-gpu-stack", md.Version
	// as the mirror's output says: its values-airgap.yaml names the registry and pins every image to the digest
	// bundled (the chart's default pins are upstream's digests, which the registry seeded here does not hold)
	rel, err := tg.Install(t.Context(), []string{filepath.Join(chartrender.RepoRoot(), "values", "container-only.yaml"),
		filepath.Join(filepath.Dir(m.ChartFile), airgap.ValuesFile)})
	if err != nil {
		t.Fatalf("helm install from %s: %v", tg.Chart, err)
	}
	defer e.uninstall(t)
	if rel.Chart.Metadata.Version != md.Version {
		t.Errorf("installed chart version %s, want %s", rel.Chart.Metadata.Version, md.Version)
	}

	pods, err := e.kube.Client.CoreV1().Pods(tg.Namespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]string{}
	for _, p := range pods.Items {
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			images[c.Image] = p.Name + "/" + c.Name
		}
	}
	if len(pods.Items) == 0 || len(images) < 5 {
		t.Fatalf("%d pods with %d images: the release runs nothing to check", len(pods.Items), len(images))
	}
	for img, where := range images {
		if !strings.HasPrefix(img, m.Private+"/") {
			t.Errorf("%s runs %s, not from the private registry %s", where, img, m.Private)
			continue
		}
		m.CheckInPrivate(t, img)
	}
	t.Logf("%d pods, %d distinct images, all from the private registry by digest", len(pods.Items), len(images))
}
