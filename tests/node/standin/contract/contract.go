// Package contract lets a stand-in image check, from inside its container, that the pod the chart rendered gives
// it what the upstream image needs: its row of the operand contract table (tests/contracts), looked up by the image
// reference the stand-in was built for.
package contract

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
)

// Image is the reference the stand-in was built for (set with -ldflags -X by tests/node's image build).
var Image string

// Check compares this process with the row: the binary it runs as is one of the image's, it runs as root where the
// image needs root, every required env var is set, and every host path the row names for this container is there.
func Check() error {
	row, ok := contracts.Lookup(Image)
	if !ok {
		return fmt.Errorf("no contract row for %q", Image)
	}
	self := filepath.Base(os.Args[0])
	var bins []string
	for _, b := range row.Binaries {
		bins = append(bins, filepath.Base(b))
	}
	if !slices.Contains(bins, self) {
		return fmt.Errorf("%s: run as %q, which the image does not have (it has %v)", Image, os.Args[0], row.Binaries)
	}
	if row.NeedsRoot && !slices.Contains(row.Rootless, self) && os.Geteuid() != 0 {
		return fmt.Errorf("%s: runs as uid %d; the image's work needs root", Image, os.Geteuid())
	}
	for name, ev := range row.Env {
		if ev.Required && (len(ev.Binaries) == 0 || slices.Contains(ev.Binaries, self)) && os.Getenv(name) == "" {
			return fmt.Errorf("%s: required env %s is not set", Image, name)
		}
	}
	args := strings.Join(os.Args[1:], " ")
	for _, hp := range row.HostPaths {
		if hp.When != "" && !strings.EqualFold(os.Getenv(hp.When), "true") {
			continue
		}
		if len(hp.Binaries) > 0 && !slices.Contains(hp.Binaries, self) {
			continue
		}
		if hp.Subcommand != "" && !slices.Contains(strings.Fields(args), hp.Subcommand) {
			continue
		}
		if _, err := os.Stat(hp.Container); err != nil {
			return fmt.Errorf("%s: %s is not mounted (%s): %v", Image, hp.Container, hp.Why, err)
		}
	}
	return nil
}
