package imagelist

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/kube-gpu-stack/kube-gpu-stack/internal/chartrender"
)

// Set is what the chart's renders run: each image images.txt must list, with the renders that run it, and the
// user-supplied images (UserSupplied) they run, which it leaves out.
type Set struct {
	Rendered     map[string][]string // image -> the renders ("profile/kube version/alone") that run it
	UserSupplied []string
	Renders      int
}

// Images are the images images.txt and the annotation name, sorted.
func (s *Set) Images() []string { return slices.Sorted(maps.Keys(s.Rendered)) }

// Collect renders every profile of the repository at root for every supported Kubernetes version, alone and with
// the optional operands no profile enables (chartrender.EveryOptionalOperand), hooks and helm test Pods included,
// and returns the images they run. A profile that points global.imageRegistry at a mirror contributes the
// upstream images it mirrors (rendered with the mirror unset), and its mirrored render must be exactly those
// images moved to the mirror. Any render that fails, or runs an image an air-gapped copy could not reproduce, is
// an error: a partial set would mislead whoever writes or compares the list.
func Collect(ctx context.Context, root string) (*Set, error) {
	profiles, err := chartrender.Profiles(root)
	if err != nil {
		return nil, err
	}
	type job struct {
		profile     chartrender.Profile
		kubeVersion string
		set         []string
		where       string
	}
	var jobs []job
	for _, p := range profiles {
		for _, kv := range p.KubeVersions() {
			for _, set := range [][]string{nil, chartrender.EveryOptionalOperand} {
				where := p.Name + "/" + kv + "/alone"
				if set != nil {
					where = p.Name + "/" + kv + "/every-optional-operand"
				}
				jobs = append(jobs, job{p, kv, set, where})
			}
		}
	}

	var (
		mu           sync.Mutex
		errs         []error
		rendered     = map[string][]string{}
		userSupplied = map[string]bool{}
		hooks, tests bool
		renders      int
		wg           sync.WaitGroup
		slots        = make(chan struct{}, runtime.GOMAXPROCS(0))
	)
	chartDir := filepath.Join(root, "charts", "kube-gpu-stack")
	// The renders are independent and take most of the time: run them side by side.
	for _, j := range jobs {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			upstream, stream, n, err := renderJob(ctx, chartDir, j.profile.Files(), j.set, j.kubeVersion, j.where)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			renders += n
			hooks = hooks || strings.Contains(stream, "helm.sh/hook: pre-upgrade")
			tests = tests || strings.Contains(stream, "helm.sh/hook: test")
			for _, img := range upstream {
				if UserSupplied(img) {
					userSupplied[img] = true
					continue
				}
				rendered[img] = append(rendered[img], j.where)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, errors.Join(errs...)
	}
	if !hooks || !tests {
		return nil, fmt.Errorf("no render held a pre-upgrade hook (%v) or a helm test Pod (%v): the renderer drops hooks, so the image list would miss their images", hooks, tests)
	}
	for _, prefix := range UserSuppliedPrefixes {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(userSupplied)), func(img string) bool { return strings.HasPrefix(img, prefix) }) {
			errs = append(errs, fmt.Errorf("imagelist.UserSuppliedPrefixes has %s, which no profile renders: drop it", prefix))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for img := range rendered {
		slices.Sort(rendered[img])
	}
	return &Set{Rendered: rendered, UserSupplied: slices.Sorted(maps.Keys(userSupplied)), Renders: renders}, nil
}

// renderJob renders one profile (its values files plus set) and returns its upstream images, the stream they come from
// and how many renders that took (two for a profile with a mirror).
func renderJob(ctx context.Context, chartDir string, files, set []string, kubeVersion, where string) ([]string, string, int, error) {
	vals, err := chartrender.Values(files, set)
	if err != nil {
		return nil, "", 0, fmt.Errorf("%s: %w", where, err)
	}
	global, _ := vals["global"].(map[string]any)
	mirror, _ := global["imageRegistry"].(string)
	stream, err := renderReleased(ctx, chartDir, vals, kubeVersion, where)
	if err != nil {
		return nil, "", 0, err
	}
	images, err := renderedImages(stream, where)
	if err != nil || mirror == "" {
		return images, stream, 1, err
	}
	global["imageRegistry"] = ""
	where += " without its mirror"
	stream, err = renderReleased(ctx, chartDir, vals, kubeVersion, where)
	if err != nil {
		return nil, "", 0, err
	}
	upstream, err := renderedImages(stream, where)
	if err != nil {
		return nil, "", 0, err
	}
	return upstream, stream, 2, checkMirrored(where, mirror, upstream, images)
}

// renderReleased renders the chart at its released versions: the project's own image is tagged with the chart's
// appVersion, which chartrender.Load pins to a placeholder for stable goldens.
func renderReleased(ctx context.Context, chartDir string, vals map[string]any, kubeVersion, where string) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	if err := action.CheckDependencies(chrt, chrt.Metadata.Dependencies); err != nil {
		return "", err
	}
	out, err := chartrender.Render(ctx, chrt, vals, kubeVersion)
	if err != nil {
		return "", fmt.Errorf("render %s: %w", where, err)
	}
	return out, nil
}

// renderedImages lists a render's images, each a reference an air-gapped copy can reproduce exactly.
func renderedImages(stream, where string) ([]string, error) {
	images, err := FromManifests(stream)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	var errs []error
	for _, img := range images {
		if err := CheckReference(img); err != nil {
			errs = append(errs, fmt.Errorf("%s renders %w", where, err))
		}
	}
	return images, errors.Join(errs...)
}

// checkMirrored checks that a render through a mirror runs exactly the upstream images, each moved to the mirror.
func checkMirrored(where, mirror string, upstream, mirrored []string) error {
	var errs []error
	var moved []string
	for _, img := range upstream {
		moved = append(moved, mirror+strings.TrimPrefix(img, RegistryOf(img)))
	}
	for _, img := range mirrored {
		if !slices.Contains(moved, img) {
			errs = append(errs, fmt.Errorf("%s renders %s, which is none of its upstream images moved to %s", where, img, mirror))
		}
	}
	for i, img := range moved {
		if !slices.Contains(mirrored, img) {
			errs = append(errs, fmt.Errorf("%s does not take %s from its mirror (want %s)", where, upstream[i], img))
		}
	}
	return errors.Join(errs...)
}

// Write writes images.txt and Chart.yaml's artifacthub.io/images annotation of the chart in chartDir for the set.
func Write(chartDir string, s *Set) error {
	images := s.Images()
	if err := os.WriteFile(filepath.Join(chartDir, FileName), Format(images), 0o644); err != nil {
		return err
	}
	chartPath := filepath.Join(chartDir, "Chart.yaml")
	chartYAML, err := os.ReadFile(chartPath)
	if err != nil {
		return err
	}
	updated, err := SetChartAnnotation(chartYAML, ImagesAnnotation, FormatArtifactHubImages(images))
	if err != nil {
		return err
	}
	return os.WriteFile(chartPath, updated, 0o644)
}
