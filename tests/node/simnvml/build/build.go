// Package build builds the simulated NVML (tests/node/simnvml) as the shared library go-nvml loads.
package build

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// Package is the library's Go package.
const Package = "github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml"

// ErrNoCgo means this machine cannot build the library: no C compiler, or cgo turned off.
var ErrNoCgo = errors.New("cgo cannot build here")

// ldflags: -s -w as the repository's other binaries; the soname is the name go-nvml opens, so a library found
// through a link or the loader's cache names itself as NVML does.
var ldflags = "-s -w -extldflags=-Wl,-soname," + config.LibraryName

// DefaultCacheDir is where Build keeps libraries when given no folder: the cache of the real-node tier's other
// builds (ci/build-node.sh, ci/build-toolkit.sh).
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "kube-gpu-stack"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".cache", "kube-gpu-stack"), nil
}

// Build builds the library (once per content: a folder of cacheDir named by a hash of the package's sources, the
// Go version and the flags holds it; empty cacheDir is DefaultCacheDir) and returns its path, a file named
// libnvidia-ml.so.1. Put a config.FileName beside a copy of it, or set config.EnvVar, before loading it. It
// runs the go command in moduleDir, this module's root. The error wraps ErrNoCgo when the machine cannot build cgo.
func Build(ctx context.Context, moduleDir, cacheDir string) (string, error) {
	if cacheDir == "" {
		d, err := DefaultCacheDir()
		if err != nil {
			return "", err
		}
		cacheDir = d
	}
	if err := checkCgo(ctx, moduleDir); err != nil {
		return "", err
	}
	key, err := sourceKey(ctx, moduleDir)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "simnvml-"+key)
	lib := filepath.Join(dir, config.LibraryName)
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, "simnvml-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := goCommand(ctx, moduleDir, "build", "-trimpath", "-buildmode=c-shared", "-ldflags="+ldflags,
		"-o", filepath.Join(tmp, config.LibraryName), Package)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -buildmode=c-shared %s: %v: %s", Package, err, out)
	}
	// go build writes a C header beside the library; only the library is kept
	if err := os.Remove(filepath.Join(tmp, "libnvidia-ml.so.h")); err != nil {
		return "", err
	}
	// a concurrent build of the same key may have won: its library is as good as this one
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(lib); statErr != nil {
			return "", err
		}
	}
	return lib, nil
}

func goCommand(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if os.Getenv("CGO_CFLAGS") == "" {
		// as the Makefile: go-nvml's header marks some functions deprecated, which gcc would warn about
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	return cmd
}

// checkCgo fails, wrapping ErrNoCgo, when go env says cgo is off (it is without a C compiler) or its compiler is
// missing.
func checkCgo(ctx context.Context, moduleDir string) error {
	out, err := goCommand(ctx, moduleDir, "env", "CC").Output()
	if err != nil {
		return fmt.Errorf("go env CC: %w", err)
	}
	cc := strings.Fields(string(out))
	if len(cc) == 0 {
		return fmt.Errorf("%w: go env CC is empty", ErrNoCgo)
	}
	if _, err := exec.LookPath(cc[0]); err != nil {
		return fmt.Errorf("%w: no C compiler (%s): %v", ErrNoCgo, cc[0], err)
	}
	return nil
}

// sourceKey hashes what the library is built from: the files of the package and of every package of this module
// it imports (go list -deps), the versions of other modules' packages, the Go version, the C flags and ldflags.
func sourceKey(ctx context.Context, moduleDir string) (string, error) {
	cmd := goCommand(ctx, moduleDir, "list", "-deps", "-json=Dir,Standard,Module,GoFiles,CgoFiles,CFiles,HFiles", Package)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -deps %s: %v: %s", Package, err, stderr.String())
	}
	h := sha256.New()
	version, err := goCommand(ctx, moduleDir, "env", "GOVERSION", "GOARCH", "CGO_CFLAGS").Output()
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s\n%s\n", version, ldflags)
	var files []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir      string
			Standard bool
			Module   *struct {
				Path, Version string
				Main          bool
			}
			GoFiles, CgoFiles, CFiles, HFiles []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", err
		}
		if p.Standard || p.Module == nil {
			continue
		}
		if !p.Module.Main {
			fmt.Fprintf(h, "%s@%s\n", p.Module.Path, p.Module.Version)
			continue
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.CFiles, p.HFiles) {
			files = append(files, filepath.Join(p.Dir, f))
		}
	}
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(moduleDir, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}
