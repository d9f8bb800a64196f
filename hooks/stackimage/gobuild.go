package stackimage

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// goBuild cross-compiles the commands for platform into dir (one file per command), static and reproducible:
// no cgo, no file paths, no VCS stamp, no build ID, no symbol tables.
func (o *Options) goBuild(ctx context.Context, platform *v1.Platform, commands []string, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", dir + string(os.PathSeparator)}
	for _, c := range commands {
		args = append(args, "./"+CommandsDir+"/"+c)
	}
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
