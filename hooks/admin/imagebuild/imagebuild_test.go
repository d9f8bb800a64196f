package imagebuild

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const testEpoch = 1700000000 // 2023-11-14: not 0, so the tests see the mtimes come from SourceDateEpoch

// snapshots holds copies of the module's build inputs: the builds read a frozen source (edits to the working tree
// during a run cannot make two builds differ), and two copies at different paths show the path does not leak in.
var snapshots string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		panic(err)
	}
	snapshots = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// snapshot copies go.mod, go.sum, hooks/ and the chart's Chart.yaml into a new directory under snapshots. Reading
// them here also lets `go test` see the inputs, so a cached result is dropped when the source changes.
func snapshot(t *testing.T, name string) string {
	t.Helper()
	dst := filepath.Join(snapshots, name)
	for _, f := range []string{"go.mod", "go.sum", ChartFile} {
		data, err := os.ReadFile(filepath.Join("../../..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.CopyFS(filepath.Join(dst, "hooks"), os.DirFS("../../../hooks")); err != nil {
		t.Fatal(err)
	}
	return dst
}

func testOptions(t *testing.T, moduleDir string) *Options {
	t.Helper()
	o := &Options{ModuleDir: moduleDir, Version: "0.0.0-test", SourceDateEpoch: testEpoch, Platforms: []string{hostPlatform}}
	if err := o.Complete(); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return o
}

// hostPlatform is the one platform the tests build: reproducibility does not depend on the architecture, the host's
// binary can run, and a cross build of the whole tree for two architectures took about 1,000 s on a cold 2-core
// machine (`make image` and the release build every platform; BenchmarkBuildEveryPlatform measures it).
var hostPlatform = "linux/" + runtime.GOARCH

// Compiling the binary is the slow part: one build serves every test.
var shared struct {
	once      sync.Once
	moduleDir string
	index     v1.ImageIndex
	took      time.Duration
	err       error
}

func builtIndex(t *testing.T) v1.ImageIndex {
	t.Helper()
	shared.once.Do(func() {
		shared.moduleDir = snapshot(t, "first")
		start := time.Now()
		shared.index, shared.err = testOptions(t, shared.moduleDir).Build(t.Context())
		shared.took = time.Since(start)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.index
}

func TestBuildIsReproducible(t *testing.T) {
	first, err := builtIndex(t).Digest()
	if err != nil {
		t.Fatal(err)
	}
	// the same source at another path: only the files may matter
	second := filepath.Join(snapshots, "second")
	if err := os.CopyFS(second, os.DirFS(shared.moduleDir)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	again, err := testOptions(t, second).Build(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	digest, err := again.Digest()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("index %s; first build %s, second %s", first, shared.took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if first != digest {
		a, _ := Describe(builtIndex(t))
		b, _ := Describe(again)
		t.Fatalf("two builds of the same source differ: %s vs %s\nfirst:  %+v\nsecond: %+v", first, digest, a, b)
	}
}

func TestIndexHoldsThePlatform(t *testing.T) {
	index := builtIndex(t)
	if mt, err := index.MediaType(); err != nil || mt != types.OCIImageIndex {
		t.Fatalf("index media type %s, %v", mt, err)
	}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		if d.MediaType != types.OCIManifestSchema1 || d.Platform == nil {
			t.Fatalf("index entry %s: media type %s, platform %v", d.Digest, d.MediaType, d.Platform)
		}
		platforms = append(platforms, d.Platform.String())
	}
	if !slices.Equal(platforms, []string{hostPlatform}) {
		t.Fatalf("platforms %v, want %v", platforms, hostPlatform)
	}
	images, err := Describe(index)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range images {
		t.Logf("%s %s: %.1f MB compressed", img.Platform, img.Digest, float64(img.CompressedSize)/1e6)
	}
}

// file is one tar entry of a layer, with its content.
type file struct {
	hdr  *tar.Header
	data []byte
}

// layerFiles reads a layer's tar stream, in order.
func layerFiles(t *testing.T, l v1.Layer) ([]string, map[string]file) {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	files := map[string]file{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		files[h.Name] = file{hdr: h, data: data}
	}
}

func TestImageRunsAsNonRootWithOneStaticBinary(t *testing.T) {
	index := builtIndex(t)
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		arch := d.Platform.Architecture
		t.Run(d.Platform.String(), func(t *testing.T) {
			img, err := index.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Config.User != "65532" || cfg.OS != "linux" || cfg.Architecture != arch {
				t.Fatalf("config: user %q, os %s, arch %s", cfg.Config.User, cfg.OS, cfg.Architecture)
			}
			if !slices.ContainsFunc(cfg.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH="+BinDir+":") }) {
				t.Fatalf("env %v: PATH does not start with %s", cfg.Config.Env, BinDir)
			}
			if len(cfg.Config.Entrypoint) > 0 || len(cfg.Config.Cmd) > 0 {
				t.Fatalf("entrypoint %v, cmd %v: the chart sets the command", cfg.Config.Entrypoint, cfg.Config.Cmd)
			}
			for k, v := range map[string]string{
				"org.opencontainers.image.version":  "0.0.0-test",
				"org.opencontainers.image.source":   "https://github.com/kube-gpu-stack/kube-gpu-stack",
				"org.opencontainers.image.licenses": "Apache-2.0",
			} {
				if cfg.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cfg.Config.Labels[k], v)
				}
			}
			if want := time.Unix(testEpoch, 0).UTC(); !cfg.Created.Time.Equal(want) {
				t.Errorf("created %s, want %s", cfg.Created.Time, want)
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 2 {
				t.Fatalf("%d layers, want /etc and the binaries", len(layers))
			}
			all := map[string]file{}
			for _, l := range layers {
				if mt, _ := l.MediaType(); mt != types.OCILayer {
					t.Fatalf("layer media type %s, want %s", mt, types.OCILayer)
				}
				names, files := layerFiles(t, l)
				if !slices.IsSorted(names) {
					t.Fatalf("tar entries not sorted: %v", names)
				}
				for name, f := range files {
					if !f.hdr.ModTime.Equal(time.Unix(testEpoch, 0)) || f.hdr.Uname != "" || f.hdr.Gname != "" {
						t.Fatalf("%s: mtime %s, owner names %q/%q", name, f.hdr.ModTime, f.hdr.Uname, f.hdr.Gname)
					}
					all[name] = f
				}
			}
			if p := string(all["etc/passwd"].data); !strings.Contains(p, "\nnonroot:x:65532:65532:") {
				t.Fatalf("/etc/passwd has no nonroot 65532:\n%s", p)
			}
			if g := string(all["etc/group"].data); !strings.Contains(g, "\nnonroot:x:65532:") {
				t.Fatalf("/etc/group has no nonroot 65532:\n%s", g)
			}
			if tmp := all["tmp/"].hdr; tmp == nil || tmp.Mode != 0o1777 {
				t.Fatalf("/tmp: %+v", tmp)
			}
			// one binary; the other names the chart calls link to it
			f, ok := all["usr/local/bin/kube-gpu-stack"]
			if !ok {
				t.Fatal("no /usr/local/bin/kube-gpu-stack")
			}
			if f.hdr.Mode != 0o755 || f.hdr.Uid != 0 || f.hdr.Gid != 0 || f.hdr.Typeflag != tar.TypeReg {
				t.Fatalf("/usr/local/bin/kube-gpu-stack: mode %o, owner %d:%d, type %c", f.hdr.Mode, f.hdr.Uid, f.hdr.Gid, f.hdr.Typeflag)
			}
			assertStaticELF(t, "kube-gpu-stack", f.data, machines[arch])
			var links []string
			for name, l := range all {
				if strings.HasPrefix(name, "usr/local/bin/") && name != "usr/local/bin/kube-gpu-stack" && l.hdr.Typeflag != tar.TypeDir {
					if l.hdr.Typeflag != tar.TypeSymlink || l.hdr.Linkname != "kube-gpu-stack" {
						t.Errorf("/%s: type %c to %q, want a link to kube-gpu-stack", name, l.hdr.Typeflag, l.hdr.Linkname)
					}
					links = append(links, strings.TrimPrefix(name, "usr/local/bin/"))
				}
			}
			slices.Sort(links)
			if want := []string{"driver-manager", "validator"}; !slices.Equal(links, want) {
				t.Fatalf("links in /usr/local/bin: %v, want %v (the names the chart calls)", links, want)
			}
			if arch == runtime.GOARCH && runtime.GOOS == "linux" {
				runHelp(t, f.data, links)
			}
		})
	}
}

// assertStaticELF checks the binary is an ELF executable for machine that needs no dynamic loader or libraries.
func assertStaticELF(t *testing.T, name string, data []byte, machine elf.Machine) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: not ELF: %v", name, err)
	}
	defer f.Close()
	if f.Machine != machine || f.Type != elf.ET_EXEC || f.Class != elf.ELFCLASS64 {
		t.Fatalf("%s: machine %s, type %s, class %s; want %s ET_EXEC ELFCLASS64", name, f.Machine, f.Type, f.Class, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("%s: has %s: dynamically linked", name, p.Type)
		}
	}
	if f.Section(".dynamic") != nil || f.Section(".interp") != nil {
		t.Fatalf("%s: has a .dynamic or .interp section", name)
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("%s: imports %v", name, libs)
	}
}

// runHelp runs the host's binary with --help under its own name and through each link, as the image holds them:
// it starts without any file from a base image, and the name it is started as picks the command.
func runHelp(t *testing.T, data []byte, links []string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kube-gpu-stack"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if err := os.Symlink("kube-gpu-stack", filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(argv ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), filepath.Join(dir, argv[0]), argv[1:]...)
		cmd.Env = []string{"PATH=/nonexistent"}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, name := range append([]string{"kube-gpu-stack"}, links...) {
		if out, err := run(name, "--help"); err != nil || !strings.Contains(out, "Usage:\n  "+name+" [command]") {
			t.Fatalf("%s --help: %v\n%s", name, err, out)
		}
	}
	// the commands the chart runs, by link and by first argument
	for _, argv := range [][]string{
		{"kube-gpu-stack", "check"}, {"kube-gpu-stack", "cleanup"}, {"kube-gpu-stack", "pre-upgrade"}, {"kube-gpu-stack", "seed-label"},
		{"validator", "wait"}, {"validator", "cleanup"}, {"validator", "health"}, {"validator", "metrics"}, {"validator", "driver"},
		{"driver-manager", "uninstall-driver"},
		{"driver-manager", "uncordon-when-valid"}, {"kube-gpu-stack", "validator", "driver"}, {"kube-gpu-stack", "driver-manager", "detect"},
	} {
		path := strings.Join(argv, " ")
		if argv[0] == "kube-gpu-stack" && len(argv) == 3 {
			path = strings.Join(argv[1:], " ")
		}
		if out, err := run(append(argv, "--help")...); err != nil || !strings.Contains(out, "Usage:\n  "+path) {
			t.Errorf("%s --help: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	// the admin's commands are not in the image
	for _, admin := range []string{"plan", "migrate", "image", "airgap"} {
		if out, err := run("kube-gpu-stack", admin); err == nil || !strings.Contains(out, `unknown command "`+admin+`"`) {
			t.Errorf("kube-gpu-stack %s: %v\n%s", admin, err, out)
		}
	}
}

func TestWriteLayoutNamesTheIndex(t *testing.T) {
	index := builtIndex(t)
	o := testOptions(t, shared.moduleDir)
	dir := filepath.Join(t.TempDir(), "image")
	for range 2 { // the second write replaces the first layout
		if err := o.WriteLayout(dir, index); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	digest, _ := index.Digest()
	if len(top.Manifests) != 1 || top.Manifests[0].Digest != digest || top.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json lists %+v, want the one index %s", top.Manifests, digest)
	}
	if got := top.Manifests[0].Annotations[RefNameAnnotation]; got != "ghcr.io/kube-gpu-stack/kube-gpu-stack:0.0.0-test" {
		t.Fatalf("%s = %q", RefNameAnnotation, got)
	}

	// the layout reads back whole: every blob the index names is there, and nothing else
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	back, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	inner, err := back.ImageIndex(digest)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Describe(index)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Describe(inner)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("read back %+v, want %+v", got, want)
	}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	// index, manifest, config, /etc layer, binary layer
	if len(blobs) != 5 {
		t.Fatalf("%d blobs, want 5", len(blobs))
	}

	// a directory holding something else is not overwritten
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := o.WriteLayout(other, index); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("WriteLayout into a non-layout directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, "notes.txt")); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkBuildEveryPlatform is the release's build: every default platform, from a cold or warm build cache as
// the machine has it. It logs each platform's compressed size (the goal: at most 15 MB).
func BenchmarkBuildEveryPlatform(b *testing.B) {
	for b.Loop() {
		o := &Options{ModuleDir: "../../..", Version: "0.0.0-bench", SourceDateEpoch: testEpoch}
		if err := o.Complete(); err != nil {
			b.Fatal(err)
		}
		index, err := o.Build(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		images, err := Describe(index)
		if err != nil {
			b.Fatal(err)
		}
		for _, img := range images {
			b.Logf("%s: %s compressed", img.Platform, megabytes(img.CompressedSize))
		}
	}
}
