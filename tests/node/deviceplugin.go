package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/contracts"
	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/simnvml/config"
)

// BuildDevicePlugin runs ci/build-device-plugin.sh (NVIDIA's device plugin, GPU feature discovery and their config
// manager, built from the newest upstream module the proxy serves; a complete cache folder is reused) and returns
// the folder it prints. When the source cannot be downloaded (no module proxy) the error wraps ErrMissing.
func BuildDevicePlugin(ctx context.Context, moduleDir string, log io.Writer) (string, error) {
	return buildUpstream(ctx, moduleDir, "build-device-plugin.sh", log)
}

// DevicePluginRow is the image reference whose contract row (the chart's pinned version) lays out the device
// plugin's image: the source build is of another version (ci/build-device-plugin.sh says why), the layout is the
// same.
const DevicePluginRow = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"

// DevicePluginImage is the device plugin image for ref, laid out as its contract row and upstream's Dockerfile say:
// the binaries ci/build-device-plugin.sh built into dir under /usr/bin, the entrypoint nvidia-device-plugin, user 0,
// busybox (the chart runs the plugin through `sh -c`), the environment upstream sets, and glibc (upstream's
// distroless base has its own; the programs are cgo, linked against it).
func DevicePluginImage(ref, dir string) (GoImage, error) {
	row, ok := contracts.Lookup(DevicePluginRow)
	if !ok {
		return GoImage{}, fmt.Errorf("no contract row for %s", DevicePluginRow)
	}
	if row.User != "0" {
		return GoImage{}, fmt.Errorf("%s: the contract row's user is %s, the plugin needs root", DevicePluginRow, row.User)
	}
	g := GoImage{Ref: ref, Entrypoint: row.Entrypoint, Cmd: row.Cmd, Shell: row.Shell != "", Path: []string{"/usr/bin"},
		// as upstream's Dockerfile sets them
		Env: []string{"NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"},
		Files: map[string]string{
			"/lib64/ld-linux-x86-64.so.2":     "/lib64/ld-linux-x86-64.so.2",
			"/lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
		}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return GoImage{}, err
	}
	for _, e := range entries {
		i := slices.IndexFunc(row.Binaries, func(b string) bool { return path.Base(b) == e.Name() })
		if i < 0 {
			return GoImage{}, fmt.Errorf("%s: %s is not a binary of the image's contract row", dir, e.Name())
		}
		g.Files[row.Binaries[i]] = filepath.Join(dir, e.Name())
	}
	return g, nil
}

// driverLibDir is where a host driver's libraries lie on the fixture host, below its root.
const driverLibDir = "usr/lib/x86_64-linux-gnu"

// SimulatedGPUs gives the fixture host under root the simulated GPUs of cfg, as an installed host driver would
// have them: a /dev/nvidia<minor> character device each (major 195; HostTree makes nvidia0 and nvidiactl), and in
// usr/lib/x86_64-linux-gnu the simulated NVML (lib, tests/node/simnvml) as libnvidia-ml.so.<driver version> with
// cfg embedded in it (CDI and the toolkit mount that one file, without the folder around it), its soname link, and
// an empty libcuda.so.<driver version> with its link: the CDI generation insists on finding libcuda, and nothing
// here loads it.
func SimulatedGPUs(root, lib string, cfg config.Config) error {
	for _, g := range cfg.GPUs {
		dev := filepath.Join(root, "dev", fmt.Sprintf("nvidia%d", g.Minor))
		if _, err := os.Lstat(dev); err == nil {
			continue
		}
		if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, int(195<<8|g.Minor)); err != nil {
			return fmt.Errorf("mknod %s: %w", dev, err)
		}
	}
	dir := filepath.Join(root, driverLibDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	nvml := "libnvidia-ml.so." + cfg.DriverVersion
	if err := cfg.Embed(lib, filepath.Join(dir, nvml)); err != nil {
		return err
	}
	cuda := "libcuda.so." + cfg.DriverVersion
	if err := os.WriteFile(filepath.Join(dir, cuda), nil, 0o644); err != nil {
		return err
	}
	for link, target := range map[string]string{config.LibraryName: nvml, "libcuda.so.1": cuda} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			return err
		}
	}
	return nil
}
