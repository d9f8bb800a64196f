// Command toolkit plays nvidia-ctk-installer (and its nvidia-toolkit link) in the container-toolkit image. It
// checks its container against the image's contract row (root, required env, mounts). The chart's command sources
// driver-ready (set -a) before exec'ing it, so the driver's paths arrive as environment: it fails, as the real
// installer does, unless DRIVER_ROOT_CTR_PATH names a mounted tree holding libcuda and libnvidia-ml. Then it writes its pid file and stays running, as the installer does
// after configuring the runtime.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/kube-gpu-stack/kube-gpu-stack/tests/node/standin/contract"
)

func main() {
	if err := check(); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-toolkit stand-in:", err)
		os.Exit(1)
	}
	if pid := os.Getenv("TOOLKIT_PID_FILE"); pid != "" {
		if err := os.MkdirAll(filepath.Dir(pid), 0o755); err == nil {
			_ = os.WriteFile(pid, []byte(fmt.Sprint(os.Getpid())), 0o644)
			defer os.Remove(pid)
		}
	}
	fmt.Println("nvidia-toolkit stand-in: driver root", os.Getenv("DRIVER_ROOT_CTR_PATH"), "ok; running")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}

func check() error {
	if err := contract.Check(); err != nil {
		return err
	}
	root := os.Getenv("DRIVER_ROOT_CTR_PATH")
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return fmt.Errorf("DRIVER_ROOT_CTR_PATH=%s: not a directory in this container (%v)", root, err)
	}
	for _, lib := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
		if !found(root, lib) {
			return fmt.Errorf("DRIVER_ROOT_CTR_PATH=%s holds no %s: not the driver's root", root, lib)
		}
	}
	return nil
}

func found(root, name string) bool {
	for _, dir := range []string{"usr/lib/x86_64-linux-gnu", "usr/lib64", "lib/x86_64-linux-gnu", "lib64", "usr/lib", "lib"} {
		if _, err := os.Stat(filepath.Join(root, dir, name)); err == nil {
			return true
		}
	}
	return false
}
