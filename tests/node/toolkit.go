package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// BuildToolkit runs ci/build-toolkit.sh (the NVIDIA container toolkit's installer and the programs it installs,
// built from the upstream module at the chart's pinned version; a complete cache folder is reused) and returns the
// folder it prints. When the source cannot be downloaded (no module proxy) the error wraps ErrMissing.
func BuildToolkit(ctx context.Context, moduleDir string, log io.Writer) (string, error) {
	return buildUpstream(ctx, moduleDir, "build-toolkit.sh", log)
}

// toolkitArtifacts is where upstream's image holds the unpacked deb packages the installer copies onto the host
// (its --toolkit-source-root resolves to /artifacts/deb on a host without rpm, as the fixture host is).
const toolkitArtifacts = "/artifacts/deb"

// libnvidiaContainer are the files of libnvidia-container (a separate C project) that upstream's packages put beside
// the toolkit's Go programs, and that the installer refuses to install without. ci/build-toolkit.sh does not build
// them: the image carries placeholders that say so (nothing on this node's pod path runs them: the legacy prestart
// hook that calls nvidia-container-cli is only added for a container that asks for GPUs).
var libnvidiaContainer = []string{"/usr/bin/nvidia-container-cli", "/usr/lib/x86_64-linux-gnu/libnvidia-container.so.1",
	"/usr/lib/x86_64-linux-gnu/libnvidia-container-go.so.1"}

// ToolkitImage is the container toolkit image for ref, laid out as its contract row and upstream's Dockerfile say:
// the installer at /work/nvidia-ctk-installer (the entrypoint) and its /work/nvidia-toolkit link, /work first on
// PATH, user 0, busybox, the installer's artifacts under /artifacts/deb/usr/bin, the environment upstream sets, and
// glibc (upstream's distroless base has its own; the programs are cgo, linked against it). dir holds what
// ci/build-toolkit.sh built; fixtures (a folder here) receives the libnvidia-container placeholders.
func ToolkitImage(ref, dir, fixtures string) (GoImage, error) {
	row, ok := contracts.Lookup(ref)
	if !ok {
		return GoImage{}, fmt.Errorf("no contract row for %s", ref)
	}
	installer := row.Entrypoint[0]
	g := GoImage{Ref: ref, Entrypoint: row.Entrypoint, Cmd: row.Cmd, Shell: row.Shell != "", Path: []string{path.Dir(installer)},
		// as upstream's Dockerfile sets them
		Env:   []string{"NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=utility"},
		Links: map[string]string{},
		Files: map[string]string{
			installer:                         filepath.Join(dir, path.Base(installer)),
			"/lib64/ld-linux-x86-64.so.2":     "/lib64/ld-linux-x86-64.so.2",
			"/lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
		}}
	if row.User != "0" {
		return GoImage{}, fmt.Errorf("%s: the contract row's user is %s, the installer needs root", ref, row.User)
	}
	for _, b := range row.Binaries {
		if b != installer {
			g.Links[b] = path.Base(installer)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return GoImage{}, err
	}
	for _, e := range entries {
		if e.Name() != path.Base(installer) {
			g.Files[toolkitArtifacts+"/usr/bin/"+e.Name()] = filepath.Join(dir, e.Name())
		}
	}
	if err := os.MkdirAll(fixtures, 0o755); err != nil {
		return GoImage{}, err
	}
	for _, f := range libnvidiaContainer {
		local := filepath.Join(fixtures, path.Base(f))
		note := "#!/bin/sh\necho 'placeholder: libnvidia-container is not built by the real-node tier' >&2\nexit 1\n"
		if err := os.WriteFile(local, []byte(note), 0o755); err != nil {
			return GoImage{}, err
		}
		g.Files[toolkitArtifacts+f] = local
	}
	return g, nil
}
