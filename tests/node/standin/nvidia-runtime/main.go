// Command nvidia-runtime plays nvidia-container-runtime's legacy mode for the test node's `nvidia` runtime handler
// (the real one needs libnvidia-container, which is not built here; the device plugin's test runs the real runtime
// in CDI mode): on `create`, when the container's NVIDIA_VISIBLE_DEVICES is set and not void/none, it bind-mounts the
// driver root's nvidia-smi and NVIDIA libraries into the bundle's config.json and adds the /dev/nvidia* devices,
// then execs runc with the arguments it was given. What it injects is listed in <this binary>.json:
// {"runc": "/usr/sbin/runc", "driverRoot": DIR, "files": [...], "devices": [...]}.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

type config struct {
	Runc       string   `json:"runc"`
	DriverRoot string   `json:"driverRoot"`
	Files      []string `json:"files"`   // paths inside driverRoot, mounted at the same path in the container
	Devices    []string `json:"devices"` // device nodes (e.g. a fixture's dev/nvidia0), created at /dev/<name>
}

func main() {
	cfg, err := load()
	if err != nil {
		fail(err)
	}
	if bundle := bundleArg(os.Args[1:]); bundle != "" && hasArg(os.Args[1:], "create") {
		if err := inject(cfg, filepath.Join(bundle, "config.json")); err != nil {
			fail(err)
		}
	}
	fail(syscall.Exec(cfg.Runc, append([]string{"runc"}, os.Args[1:]...), os.Environ()))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nvidia-runtime stand-in:", err)
	os.Exit(1)
}

func load() (config, error) {
	self, err := os.Executable()
	if err != nil {
		return config{}, err
	}
	raw, err := os.ReadFile(self + ".json")
	if err != nil {
		return config{}, err
	}
	var c config
	return c, json.Unmarshal(raw, &c)
}

func bundleArg(args []string) string {
	for i, a := range args {
		if (a == "--bundle" || a == "-b") && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			return v
		}
	}
	return ""
}

func hasArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// inject edits the OCI spec in place. The spec is kept as generic JSON so that fields this program does not know
// survive unchanged.
func inject(c config, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	process, _ := spec["process"].(map[string]any)
	env, _ := process["env"].([]any)
	visible := ""
	for _, e := range env {
		if s, _ := e.(string); strings.HasPrefix(s, "NVIDIA_VISIBLE_DEVICES=") {
			visible = strings.TrimPrefix(s, "NVIDIA_VISIBLE_DEVICES=")
		}
	}
	if visible == "" || visible == "void" || visible == "none" {
		return nil
	}
	mounts, _ := spec["mounts"].([]any)
	for _, f := range c.Files {
		mounts = append(mounts, map[string]any{
			"destination": f, "type": "bind", "source": filepath.Join(c.DriverRoot, f),
			"options": []any{"rbind", "ro", "nosuid", "nodev"},
		})
	}
	linux, _ := spec["linux"].(map[string]any)
	if linux == nil {
		linux = map[string]any{}
		spec["linux"] = linux
	}
	devices, _ := linux["devices"].([]any)
	resources, _ := linux["resources"].(map[string]any)
	if resources == nil {
		resources = map[string]any{}
		linux["resources"] = resources
	}
	allow, _ := resources["devices"].([]any)
	for _, d := range c.Devices {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err != nil {
			return fmt.Errorf("device %s: %w", d, err)
		}
		major, minor := int64(st.Rdev>>8&0xfff), int64(st.Rdev&0xff|(st.Rdev>>12)&0xfff00)
		devices = append(devices, map[string]any{"path": "/dev/" + filepath.Base(d), "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0})
		allow = append(allow, map[string]any{"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"})
	}
	spec["mounts"], linux["devices"], resources["devices"] = mounts, devices, allow
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}
