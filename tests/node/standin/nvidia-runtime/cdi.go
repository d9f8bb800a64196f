package main

import (
	"encoding/json"
	"fmt"
	"os"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// injectCDI applies the CDI devices the OCI spec at path names in its annotations (cdi.k8s.io/<key>: vendor/class=name
// lists), resolved against the CDI specs in the default folders; a spec without such annotations is left as it is.
func injectCDI(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	_, devices, err := cdi.ParseAnnotations(spec.Annotations)
	if err != nil {
		return fmt.Errorf("the container's CDI annotations: %w", err)
	}
	if len(devices) == 0 {
		return nil
	}
	cache, err := cdi.NewCache(cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("CDI specs: %w", err)
	}
	if unresolved, err := cache.InjectDevices(&spec, devices...); err != nil {
		return fmt.Errorf("inject CDI devices %v (unresolved: %v): %w", devices, unresolved, err)
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
