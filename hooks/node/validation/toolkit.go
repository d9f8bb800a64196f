package validation

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// toolkitCheck runs in a container the nvidia runtime started with NVIDIA_VISIBLE_DEVICES=all: nvidia-smi and
// NVML work there only if the toolkit injected the driver.
func (o *Options) toolkitCheck() check {
	return check{
		name: "toolkit",
		owns: []string{"toolkit-ready"},
		attempt: func(ctx context.Context, p progress) result {
			smi, r := o.injectedNvidiaSMI()
			if smi == nil {
				return r
			}
			out, err := o.Runner.Run(ctx, *smi)
			if err != nil {
				return waiting("nvidia-smi in a container of the nvidia runtime failed (%s): %s (the container toolkit did not inject the driver)",
					smi, describeRun(out, err))
			}
			p.Logf("%s: %s", smi, firstLine(out))
			n, version, err := o.NVML.Probe("libnvidia-ml.so.1")
			if errors.Is(err, ErrNVMLNotBuiltIn) {
				p.Logf("nvidia-smi answers in a container of the nvidia runtime; %v", err)
				return ready(file{name: "toolkit-ready"})
			}
			if err != nil {
				return waiting("%v in a container of the nvidia runtime", err)
			}
			p.Logf("%d GPU(s), driver %s, visible in a container of the nvidia runtime", n, version)
			return ready(file{name: "toolkit-ready"})
		},
	}
}

// injectedNvidiaSMI returns how to run the nvidia-smi the runtime injected into this container. The real one is
// linked against glibc, and the project's image is static: it has no loader and no libc. So a dynamic nvidia-smi
// runs through the loader and libc of the driver root driver-ready names, with the library path starting at the
// injected libnvidia-ml's directory: the program and NVML are the injected ones, so a pass still proves the
// injection. Chrooting into the driver root instead would run that root's own nvidia-smi and libraries and prove
// nothing about the toolkit. A static nvidia-smi, or an image that has the loader, runs directly.
func (o *Options) injectedNvidiaSMI() (*Command, result) {
	ctr := hostfs.Root(o.CtrRoot)
	_, smi, err := ctr.FindExecutable("nvidia-smi", hostfs.BinDirs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, waiting("nvidia-smi was not injected into this container of the nvidia runtime (%v): the container toolkit did not inject the driver", err)
	}
	if err != nil {
		return nil, failed("%v", err)
	}
	interp, err := hostfs.Interpreter(smi)
	if err != nil {
		return nil, waiting("the injected %s is not a readable program: %v", smi, err)
	}
	if interp == "" {
		return &Command{Path: smi}, result{}
	}
	if own, _ := ctr.Exists(interp); own {
		return &Command{Path: smi}, result{}
	}
	root, err := o.readyDriverRoot()
	if err != nil {
		return nil, waiting("the injected %s needs the loader %s, which this image lacks, and %v", smi, interp, err)
	}
	loader, err := root.Path(interp)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(loader); err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a file", loader)
		}
	}
	if err != nil {
		return nil, waiting("the injected %s needs the loader %s, not found in the driver root %s: %v", smi, interp, root, err)
	}
	libc, err := root.FindLibrary("libc.so.6")
	if err != nil {
		return nil, waiting("the injected %s needs libc, not found in the driver root: %v", smi, err)
	}
	nvml, err := ctr.FindLibrary("libnvidia-ml.so.1")
	if err != nil {
		return nil, waiting("nvidia-smi was injected but libnvidia-ml.so.1 was not (%v): the container toolkit did not inject the driver", err)
	}
	return &Command{Path: loader, Args: []string{"--library-path", filepath.Dir(nvml) + ":" + filepath.Dir(libc), smi}}, result{}
}

// readyDriverRoot is the driver root driver-ready names, as this container mounts it: the host's / for a host
// driver, the driver install dir for a containerized one.
func (o *Options) readyDriverRoot() (hostfs.Root, error) {
	raw, err := os.ReadFile(filepath.Join(o.OutputDir, "driver-ready"))
	if err != nil {
		return "", fmt.Errorf("driver-ready, which names the driver root, cannot be read: %w", err)
	}
	if strings.EqualFold(parseEnv(raw)["IS_HOST_DRIVER"], "true") {
		return hostfs.Root(o.HostRoot), nil
	}
	return hostfs.Root(o.DriverInstallDir), nil
}
