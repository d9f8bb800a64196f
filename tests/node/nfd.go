package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// BuildNFD runs ci/build-nfd.sh (Node Feature Discovery's daemons built from the upstream module at the chart's
// pinned version; a complete cache folder is reused) and returns the folder it prints. When the source cannot be
// downloaded (no module proxy) the error wraps ErrMissing.
func BuildNFD(ctx context.Context, moduleDir string, log io.Writer) (string, error) {
	return buildUpstream(ctx, moduleDir, "build-nfd.sh", log)
}

// buildUpstream runs a ci/ build script of an upstream operand, which prints its folder and exits 3 when the
// source cannot be downloaded (then the error wraps ErrMissing).
func buildUpstream(ctx context.Context, moduleDir, script string, log io.Writer) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(moduleDir, "ci", script))
	var stderr strings.Builder
	cmd.Stderr = io.MultiWriter(log, &stderr)
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		return "", fmt.Errorf("%w: ci/%s: %s", ErrMissing, script, lastLine(stderr.String()))
	}
	if err != nil {
		return "", fmt.Errorf("ci/%s: %w: %s", script, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// NFDImage is the NFD image for ref, laid out as its contract row says (upstream's Dockerfile: the binaries in
// /usr/bin, user 65534, no entrypoint: the chart names the binary), holding the binaries ci/build-nfd.sh built into
// dir. Upstream's image also carries nfd-topology-updater, kubectl-nfd, nfd and an example worker config; the chart
// runs none of them and mounts its own config over that folder.
func NFDImage(ref, dir string) (GoImage, error) {
	row, ok := contracts.Lookup(ref)
	if !ok {
		return GoImage{}, fmt.Errorf("no contract row for %s", ref)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return GoImage{}, err
	}
	g := GoImage{Ref: ref, Entrypoint: row.Entrypoint, Cmd: row.Cmd, User: row.User + ":" + row.User,
		// as upstream's Dockerfile sets it
		Env: []string{"GRPC_GO_LOG_SEVERITY_LEVEL=INFO"}, Files: map[string]string{}}
	for _, e := range entries {
		i := slices.IndexFunc(row.Binaries, func(b string) bool { return path.Base(b) == e.Name() })
		if i < 0 {
			return GoImage{}, fmt.Errorf("%s: %s is not a binary of the image's contract row", dir, e.Name())
		}
		g.Files[row.Binaries[i]] = filepath.Join(dir, e.Name())
	}
	return g, nil
}
