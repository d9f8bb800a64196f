package imagebuild

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/cmd/incluster"
)

// goBuild cross-compiles incluster.MainPackage (the commands the cluster runs, without the admin's, so that the
// helm SDK and the registry client stay out of the image) for platform into the file bin, static and
// reproducible: no cgo, no file paths, no VCS stamp, no build ID, no symbol tables.
func (o *Options) goBuild(ctx context.Context, platform *v1.Platform, bin string) error {
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, incluster.MainPackage}
	cmd := exec.CommandContext(ctx, o.GoCommand, args...)
	cmd.Dir = o.ModuleDir
	variant, _ := goarchEnv(platform) // checked by Validate
	cmd.Env = append(os.Environ(), append([]string{"CGO_ENABLED=0", "GOOS=" + platform.OS, "GOARCH=" + platform.Architecture}, variant...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s for %s (CGO_ENABLED=0): %v\n%s", o.GoCommand, strings.Join(args, " "), platform, err,
			strings.TrimSpace(out.String()))
	}
	return nil
}
