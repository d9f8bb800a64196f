package validation

import (
	"strings"
	"testing"
)

// FuzzDriverReady: driver-ready and .driver-ctr-ready are read by parseEnv whatever they hold; and what the driver
// check writes to driver-ready (shell-quoted paths, which the operands source with `sh`) reads back as written,
// for any path without a line break.
func FuzzDriverReady(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte, path string) {
		for k := range parseEnv(raw) {
			if k == "" || strings.ContainsAny(k, "\n") {
				t.Fatalf("key %q", k)
			}
		}
		if strings.ContainsAny(path, "\n\r") {
			return
		}
		d := &driverInfo{host: true, rootHostPath: path, consumerRoot: ConsumerHostRoot, devRootHostPath: path, consumerDevRoot: "/x y"}
		env := parseEnv(d.env())
		if env["NVIDIA_DRIVER_ROOT"] != path || env["NVIDIA_DEV_ROOT"] != path || env["IS_HOST_DRIVER"] != "true" || env["DEV_ROOT_CTR_PATH"] != "/x y" {
			t.Fatalf("driver-ready for root %q:\n%s\nreads back as %q", path, d.env(), env)
		}
	})
}
