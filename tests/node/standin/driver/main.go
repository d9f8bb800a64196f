// Command driver plays `nvidia-driver init` in the driver image. It checks its container against the image's
// contract row (root, required env, the host paths `init` needs) and then does what the real one does once its modules are loaded: it makes
// its own root the driver root on the host (rbind / onto /run/nvidia/driver, propagated back by the Bidirectional
// /run/nvidia mount), so nvidia-smi and the libraries in this image are what the node's driver root holds; and it
// shows the startup probe a loaded module (a tmpfs with nvidia/refcnt over this container's own /sys/module — the
// machine's kernel is not touched). On SIGTERM it plays the upstream shutdown's order: the daemons
// (nvidia-persistenced, nv-fabricmanager, ...) stop first, whatever still uses the GPUs, then the modules are
// unloaded, and the driver root is unmounted only once the unload succeeded. Each step is appended to ShutdownLog
// on the host, with its time and the pod (the container's host name), for the real-node tests to judge the order
// against the GPU pods' ends.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/standin/contract"
)

const (
	driverRoot = "/run/nvidia/driver"
	// ShutdownLog is on the host's /run/nvidia (the driver container's Bidirectional mount).
	ShutdownLog = "/run/nvidia/driver-stand-in-shutdown.log"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "init" {
		fail(fmt.Errorf("usage: nvidia-driver init (got %q)", os.Args[1:]))
	}
	if err := check(); err != nil {
		fail(err)
	}
	if err := install(); err != nil {
		fail(err)
	}
	fmt.Println("nvidia-driver stand-in: driver root mounted at", driverRoot)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := shutdown(); err != nil {
		fail(err)
	}
}

// shutdown is the upstream `_shutdown` order: daemons, unload, then the unmount only after a successful unload.
func shutdown() error {
	record("daemons-stopped")
	if err := os.RemoveAll("/sys/module/nvidia"); err != nil {
		record("unload-failed")
		return fmt.Errorf("unload: %w", err)
	}
	record("modules-unloaded")
	if err := syscall.Unmount(driverRoot, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", driverRoot, err)
	}
	record("driver-root-unmounted")
	return nil
}

// record appends "TIME POD EVENT" to ShutdownLog; a failed write is reported, never fatal (the stop goes on).
func record(event string) {
	pod, _ := os.Hostname()
	f, err := os.OpenFile(ShutdownLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), pod, event)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-driver stand-in: record", event+":", err)
	}
	fmt.Println("nvidia-driver stand-in:", event)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "nvidia-driver stand-in:", err)
	os.Exit(1)
}

func check() error {
	if err := contract.Check(); err != nil {
		return err
	}
	if v := os.Getenv("NVIDIA_VISIBLE_DEVICES"); v != "void" {
		return fmt.Errorf("NVIDIA_VISIBLE_DEVICES=%q; the driver container must not get GPUs injected (void)", v)
	}
	return nil
}

func install() error {
	if err := os.MkdirAll(driverRoot, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("/", driverRoot, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("rbind / onto %s: %w", driverRoot, err)
	}
	if err := syscall.Mount("tmpfs", "/sys/module", "tmpfs", 0, "size=1m"); err != nil {
		return fmt.Errorf("mount a module list over this container's /sys/module: %w", err)
	}
	if err := os.MkdirAll("/sys/module/nvidia", 0o755); err != nil {
		return err
	}
	return os.WriteFile("/sys/module/nvidia/refcnt", []byte("1\n"), 0o644)
}
