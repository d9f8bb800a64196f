// Command driver plays `nvidia-driver init` in the driver image. It checks its container against the image's
// contract row (root, required env, the host paths `init` needs) and then does what the real one does once its modules are loaded: it makes
// its own root the driver root on the host (rbind / onto /run/nvidia/driver, propagated back by the Bidirectional
// /run/nvidia mount), so nvidia-smi and the libraries in this image are what the node's driver root holds; and it
// shows the startup probe a loaded module (a tmpfs with nvidia/refcnt over this container's own /sys/module — the
// machine's kernel is not touched). On SIGTERM it unmounts the driver root again, as the real one does on exit.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/standin/contract"
)

const driverRoot = "/run/nvidia/driver"

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
	if err := syscall.Unmount(driverRoot, syscall.MNT_DETACH); err != nil {
		fail(fmt.Errorf("unmount %s: %w", driverRoot, err))
	}
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
