//go:build !cgo

package build

import (
	"fmt"
	"os"
	"testing"
)

func child(string) int {
	fmt.Fprintln(os.Stderr, "this test binary was built without cgo: it cannot load NVML")
	return 2
}

// TestNVMLNeedsCgo stands for the tests that load the library through go-nvml, which needs cgo: this test binary
// was built without it (no C compiler, or CGO_ENABLED=0).
func TestNVMLNeedsCgo(t *testing.T) {
	if os.Getenv("CI") == "true" {
		t.Fatal("the test binary was built without cgo: go-nvml cannot load the simulated NVML (CI=true: this is a failure)")
	}
	t.Skip("SKIP: the test binary was built without cgo, so go-nvml cannot load the simulated NVML (CI=true makes this a failure)")
}
