package chart

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/ci/imagelist"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/airgap/registrytest"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/admin/imagebuild"
	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/internal/airgaptest"
)

// TestAirgapBundleMirrorRender: with the chart's real images.txt, an in-process "upstream" registry on 127.0.0.1
// seeded with a small random image under every listed name, the bundle built from it (the project's own image from
// a local layout), mirrored into a second in-process "private" registry, and then every profile rendered from the
// bundle's chart archive with the values file the mirror wrote (global.imageRegistry the private registry,
// global.imageDigests every bundled image's digest): every image a pod runs or launches (image env vars such as
// CUDA_WORKLOAD_IMAGE) must name its bundled digest, and resolve there, by digest, to the bundled image.
// Nothing reaches a registry outside the machine.
func TestAirgapBundleMirrorRender(t *testing.T) {
	t.Parallel()
	m := airgaptest.BundleAndMirror(t, chartrender.ChartDir())
	t.Log(lineWith(m.BundleLog, "wrote "))
	t.Log(lineWith(m.MirrorLog, " pushed, "))

	var mu sync.Mutex
	checked, userSupplied := map[string]bool{}, map[string]bool{}
	t.Run("render", func(t *testing.T) {
		for _, p := range profiles(t) {
			for name, set := range map[string][]string{"alone": nil, "every-optional-operand": everythingOn} {
				t.Run(p.name+"/"+name, func(t *testing.T) {
					t.Parallel()
					chrt, err := loader.Load(m.ChartFile)
					if err != nil {
						t.Fatal(err)
					}
					if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
						t.Fatal(err)
					}
					vals, err := chartrender.Values(append(slices.Clone(p.files), filepath.Join(filepath.Dir(m.ChartFile), airgap.ValuesFile)), set)
					if err != nil {
						t.Fatal(err)
					}
					stream, err := chartrender.Render(context.Background(), chrt, vals, newestKube)
					if err != nil {
						t.Fatal(err)
					}
					refs, err := imagelist.FromManifests(stream)
					if err != nil {
						t.Fatal(err)
					}
					if len(refs) == 0 {
						t.Fatal("renders no image")
					}
					for _, ref := range refs {
						if imagelist.UserSupplied(ref) { // the cluster's own registry (OpenShift's Driver Toolkit), never mirrored
							mu.Lock()
							userSupplied[ref] = true
							mu.Unlock()
							continue
						}
						path, ok := strings.CutPrefix(ref, m.Private+"/")
						if !ok {
							t.Errorf("%s does not come from the private registry %s", ref, m.Private)
							continue
						}
						if airgaptest.UserSupplied(path) {
							mu.Lock()
							userSupplied[ref] = true
							mu.Unlock()
							continue
						}
						if !strings.Contains(ref, "@sha256:") {
							t.Errorf("%s is not pinned by digest", ref)
						}
						m.CheckInPrivate(t, ref)
						mu.Lock()
						checked[ref] = true
						mu.Unlock()
					}
				})
			}
		}
	})
	t.Logf("%d image references from %d profiles resolve in the private registry by digest (%d user-supplied left out: %v)",
		len(checked), len(profiles(t)), len(userSupplied), sortedKeys(userSupplied))
}

// lineWith returns the first line of s containing substr.
func lineWith(s, substr string) string {
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, substr) {
			return line
		}
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}

// TestImagePushThenInstall is the README's install-from-a-clone path: the image `image build` writes (here a small
// random multi-arch index in the same layout) pushed by `image push` into an in-process registry on 127.0.0.1, then
// the chart rendered with exactly the --set flags the push printed: every pod that runs the project's image (hooks,
// validators, driver managers) must name the pushed index (by digest; the driver manager by its pinned tag), and the
// registry must serve that index for it. A second push changes nothing.
func TestImagePushThenInstall(t *testing.T) {
	t.Parallel()
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := imagebuild.DefaultRepository + ":0.1.0"
	layoutDir := registrytest.OwnImageLayout(t, idx, ref)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	reg := airgaptest.Registry(t) + "/mirror"
	var out strings.Builder
	o := imagebuild.PushOptions{Layout: layoutDir, Registry: reg, Insecure: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out.Reset()
		if err := o.Run(context.Background(), &out); err != nil {
			t.Fatal(err)
		}
	}
	line := lineWith(out.String(), "install with: ")
	if !strings.Contains(out.String(), "pushed "+reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0@"+want.String()) || line == "" {
		t.Fatalf("push output:\n%s", out.String())
	}
	var set []string
	for _, f := range strings.Fields(strings.TrimPrefix(line, "install with: ")) {
		if f != "--set" {
			set = append(set, f)
		}
	}
	stream, err := chartrender.RenderRepo(context.Background(), []string{profileFile("container-only")}, set)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := imagelist.FromManifests(stream)
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, r := range refs {
		if !strings.Contains(r, "kube-gpu-stack/kube-gpu-stack") {
			continue
		}
		own++
		// the driver manager keeps its own pinned tag (driver.manager.image: a chart-only release must not roll the
		// driver pods), so it names the pushed tag rather than the digest; every other use pins the digest
		if r != reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0@"+want.String() && r != reg+"/kube-gpu-stack/kube-gpu-stack:0.1.0" {
			t.Errorf("project image %s, want the pushed one", r)
			continue
		}
		d, err := remote.Head(must(name.ParseReference(r, name.Insecure)))
		if err != nil || d.Digest != want {
			t.Errorf("%s: the registry serves %v (%v), want %s", r, d, err, want)
		}
	}
	if own == 0 {
		t.Fatal("no pod runs the project's image")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestImageDigestsPinWithoutReinstalling: global.imageDigests pins the image it names (repository:tag as the chart
// names it, the driver's with its OS) and leaves others alone; an image's own digest wins; and the pin changes no
// driver config digest, so pinning the tag a node runs reinstalls no driver.
func TestImageDigestsPinWithoutReinstalling(t *testing.T) {
	t.Parallel()
	const (
		dsName = "nvidia-driver-daemonset-ubuntu2204"
		pin    = "sha256:" + "ab" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"
	)
	files := []string{profileFile("container-only")}
	plain := daemonSet(t, render(t, newestKube, files), dsName)
	driver := plain.Spec.Template.Spec.Containers[0]
	tag := driver.Image[strings.LastIndex(driver.Image, ":")+1:]
	key := "nvidia/driver:" + tag
	pinned := daemonSet(t, render(t, newestKube, files, "global.imageDigests."+strings.NewReplacer(".", `\.`).Replace(key)+"="+pin), dsName)
	if got := pinned.Spec.Template.Spec.Containers[0].Image; got != driver.Image+"@"+pin {
		t.Errorf("pinned driver image %s, want %s@%s", got, driver.Image, pin)
	}
	if got, want := digestOf(pinned), digestOf(plain); got != want || want == "" {
		t.Errorf("DRIVER_CONFIG_DIGEST %q with the pin, %q without: a pin must reinstall nothing", got, want)
	}
	for i, c := range pinned.Spec.Template.Spec.InitContainers {
		if c.Image != plain.Spec.Template.Spec.InitContainers[i].Image {
			t.Errorf("init container %s: %s, want %s: only the named image is pinned", c.Name, c.Image, plain.Spec.Template.Spec.InitContainers[i].Image)
		}
	}
	own := daemonSet(t, render(t, newestKube, files, "global.imageDigests."+strings.NewReplacer(".", `\.`).Replace(key)+"="+pin,
		"driver.image.digest=sha256:"+strings.Repeat("cd", 32)), dsName)
	if got := own.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(got, "@sha256:"+strings.Repeat("cd", 32)) {
		t.Errorf("with the image's own digest: %s, want it kept", got)
	}
}

func digestOf(ds *appsv1.DaemonSet) string {
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if v := containerEnv(c)["DRIVER_CONFIG_DIGEST"]; v != "" {
			return v
		}
	}
	return ""
}
