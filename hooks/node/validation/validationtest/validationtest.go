// Package validationtest builds a fixture GPU host's driver root for tests of the validator and of the stack on a
// real node: a stand-in nvidia-smi that is dynamically linked against glibc, as the real one is, its stand-in
// libnvidia-ml.so.1, copies of this machine's dynamic loader and libc, and stand-in /dev/nvidia* devices. It
// builds with the system's C compiler (gcc, or $CC).
package validationtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// The stand-in devices' numbers: NVIDIA's fixed major 195 (nvidia0 is minor 0, nvidiactl 255); nvidia-uvm's
// major is dynamic on a real host, so any free one serves.
const (
	NvidiaMajor    = 195
	NvidiaCtlMinor = 255
	UVMMajor       = 511
)

// GPUName is the name the stand-in NVML reports; nvidia-smi prints it in its GPU line.
const GPUName = "NVIDIA Stand-In H100"

// LoaderLine prefixes the line in which the stand-in nvidia-smi prints the program the kernel ran
// (/proc/self/exe): the stand-in itself when the kernel loaded its interpreter, the loader when the stand-in was
// run through an explicit loader ("<root>/lib64/ld-linux-x86-64.so.2 --library-path ... nvidia-smi").
const LoaderLine = "stand-in loaded by: "

// DriverRoot is a fixture driver root as BuildFixtureDriverRoot wrote it. Paths other than Dir are relative to
// Dir, as a driver install names them.
type DriverRoot struct {
	Dir string
	// NvidiaSMI is the stand-in nvidia-smi (usr/bin/nvidia-smi).
	NvidiaSMI string
	// NVML is the stand-in libnvidia-ml.so.1, in LibDir.
	NVML string
	// Interpreter is nvidia-smi's ELF interpreter (PT_INTERP) as an absolute path in the root
	// (/lib64/ld-linux-x86-64.so.2 on x86_64); a copy of this machine's loader is there.
	Interpreter string
	// LibDir holds the copy of this machine's libc.so.6 (e.g. usr/lib/x86_64-linux-gnu).
	LibDir string
	// Devices are dev/nvidia0, dev/nvidiactl and dev/nvidia-uvm.
	Devices []string
	// CharDevices is true when Devices are character devices (mknod succeeded: root with CAP_MKNOD), false when
	// they are regular files.
	CharDevices bool
}

const nvmlSource = `
const char *nvmlStandInGPU(void) { return "` + GPUName + `"; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
`

// nvidia-smi links libnvidia-ml.so.1 without an rpath: it starts only where a loader is told where that library
// is (the nvidia runtime's injected copy, or --library-path).
const smiSource = `
#include <stdio.h>
#include <string.h>
#include <unistd.h>
extern const char *nvmlStandInGPU(void);
int main(int argc, char **argv) {
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	exe[n < 0 ? 0 : n] = 0;
	if (argc > 1 && strcmp(argv[1], "--version") == 0) {
		printf("NVIDIA-SMI version  : 595.91.07 (stand-in)\n");
	} else {
		printf("GPU 0: %s (UUID: GPU-5ad1f5a0-0000-4000-8000-000000000000)\n", nvmlStandInGPU());
	}
	printf("` + LoaderLine + `%s\n", exe);
	return 0;
}
`

// BuildFixtureDriverRoot writes a driver root under dir (created if needed): the dynamically linked stand-in
// nvidia-smi and libnvidia-ml.so.1, this machine's loader at nvidia-smi's PT_INTERP and its libc.so.6, and the
// stand-in devices.
func BuildFixtureDriverRoot(dir string) (*DriverRoot, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return nil, fmt.Errorf("building the stand-in nvidia-smi needs a C compiler: %w", err)
	}
	libc, err := machineLibc(cc)
	if err != nil {
		return nil, err
	}
	d := &DriverRoot{Dir: dir, NvidiaSMI: "usr/bin/nvidia-smi", LibDir: libDirFor(libc)}
	d.NVML = filepath.Join(d.LibDir, "libnvidia-ml.so.1")
	src, err := os.MkdirTemp("", "stand-in-src")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	for _, p := range []string{d.LibDir, "usr/bin", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(src, "nvml.c"), []byte(nvmlSource), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "smi.c"), []byte(smiSource), 0o644); err != nil {
		return nil, err
	}
	if err := run(cc, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", filepath.Join(dir, d.NVML), filepath.Join(src, "nvml.c")); err != nil {
		return nil, err
	}
	if err := run(cc, "-o", filepath.Join(dir, d.NvidiaSMI), filepath.Join(src, "smi.c"), "-L"+filepath.Join(dir, d.LibDir), "-l:libnvidia-ml.so.1"); err != nil {
		return nil, err
	}
	if d.Interpreter, err = hostfs.Interpreter(filepath.Join(dir, d.NvidiaSMI)); err != nil {
		return nil, err
	}
	if d.Interpreter == "" {
		return nil, errors.New("the stand-in nvidia-smi came out statically linked: it must be dynamic, as the real one is")
	}
	if err := copyFile(d.Interpreter, filepath.Join(dir, d.Interpreter), 0o755); err != nil {
		return nil, fmt.Errorf("copy the loader: %w", err)
	}
	if err := copyFile(libc, filepath.Join(dir, d.LibDir, "libc.so.6"), 0o755); err != nil {
		return nil, fmt.Errorf("copy libc: %w", err)
	}
	d.CharDevices = true
	for _, dev := range []struct {
		name         string
		major, minor uint32
	}{{"nvidia0", NvidiaMajor, 0}, {"nvidiactl", NvidiaMajor, NvidiaCtlMinor}, {"nvidia-uvm", UVMMajor, 0}} {
		p := filepath.Join("dev", dev.name)
		d.Devices = append(d.Devices, p)
		full := filepath.Join(dir, p)
		_ = os.Remove(full)
		if d.CharDevices {
			if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(dev.major, dev.minor))); err == nil {
				continue
			}
			// not root, or no CAP_MKNOD: every device becomes a regular file, so the set stays uniform
			d.CharDevices = false
			for _, made := range d.Devices[:len(d.Devices)-1] {
				_ = os.Remove(filepath.Join(dir, made))
				if err := os.WriteFile(filepath.Join(dir, made), nil, 0o666); err != nil {
					return nil, err
				}
			}
		}
		if err := os.WriteFile(full, nil, 0o666); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Inject copies the stand-in nvidia-smi and libnvidia-ml.so.1 into ctrRoot at the same paths, as the nvidia
// runtime's CDI spec mounts them into a container; the loader and libc stay behind, as in the project's static
// image.
func (d *DriverRoot) Inject(ctrRoot string) error {
	for _, p := range []string{d.NvidiaSMI, d.NVML} {
		if err := copyFile(filepath.Join(d.Dir, p), filepath.Join(ctrRoot, p), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func machineLibc(cc string) (string, error) {
	out, err := exec.Command(cc, "-print-file-name=libc.so.6").Output()
	if err != nil {
		return "", fmt.Errorf("find this machine's libc: %w", err)
	}
	p := filepath.Clean(strings.TrimSpace(string(out)))
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s does not know where libc.so.6 is (%q)", cc, p)
	}
	return filepath.EvalSymlinks(p)
}

// libDirFor is libc's directory relative to /, when the validator looks there (hostfs.LibDirs), else usr/lib.
func libDirFor(libc string) string {
	rel := strings.TrimPrefix(filepath.Dir(libc), "/")
	if slices.Contains(hostfs.LibDirs, rel) {
		return rel
	}
	return "usr/lib"
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	_ = os.Remove(to)
	return os.WriteFile(to, b, mode)
}
