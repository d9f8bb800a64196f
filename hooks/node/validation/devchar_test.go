package validation

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// mknod creates a character device under root; creating devices needs root (CAP_MKNOD).
func mknod(t *testing.T, root, rel string, major, minor uint32) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatalf("mknod %s (the /dev/char tests create character devices and run as root): %v", p, err)
	}
}

// links returns the /dev/char links as "name -> target".
func (e *env) links() []string {
	e.t.Helper()
	entries, err := os.ReadDir(e.devChar)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		target, err := os.Readlink(filepath.Join(e.devChar, en.Name()))
		if err != nil {
			e.t.Fatalf("%s: %v", en.Name(), err)
		}
		out = append(out, en.Name()+" -> "+target)
	}
	return out
}

func gpuDevices(t *testing.T, root string) {
	mknod(t, root, "dev/nvidia0", 195, 0)
	mknod(t, root, "dev/nvidiactl", 195, 255)
	mknod(t, root, "dev/nvidia-uvm", 511, 0)
	mknod(t, root, "dev/nvidia-caps/nvidia-cap1", 508, 1)
	writeFile(t, root, "dev/nvidia-not-a-device", "", 0o644)
}

func TestDriverCheckLinksTheGPUsInDevChar(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating character devices needs root")
	}
	hostLinks := []string{"195:0 -> ../nvidia0", "195:255 -> ../nvidiactl", "508:1 -> ../nvidia-caps/nvidia-cap1", "511:0 -> ../nvidia-uvm"}

	t.Run("host driver: links relative to the host's /dev/char, idempotent, stale ones corrected", func(t *testing.T) {
		e := newEnv(t, nil)
		installDriver(t, e.host)
		gpuDevices(t, e.host)
		e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
		if err := os.Symlink("/old/nvidia0", filepath.Join(e.devChar, "195:0")); err != nil {
			t.Fatal(err)
		}
		o := e.options("driver")
		o.SkipGPUInit = true
		for range 2 {
			if err := e.run(o); err != nil {
				t.Fatalf("%v\n%s", err, e.log.String())
			}
			if got := e.links(); !slices.Equal(got, hostLinks) {
				t.Fatalf("links %v, want %v", got, hostLinks)
			}
		}
	})

	t.Run("containerized driver with its own dev: the driver root's dev on the host", func(t *testing.T) {
		e := newEnv(t, nil)
		installDriver(t, e.driver)
		gpuDevices(t, e.driver)
		writeFile(t, e.out, DriverCtrReadyFile, "", 0o644)
		e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
		o := e.options("driver")
		o.SkipGPUInit = true
		o.DriverInstallDirHostPath = "/run/nvidia/driver"
		if err := e.run(o); err != nil {
			t.Fatalf("%v\n%s", err, e.log.String())
		}
		want := []string{"195:0 -> /run/nvidia/driver/dev/nvidia0", "195:255 -> /run/nvidia/driver/dev/nvidiactl",
			"508:1 -> /run/nvidia/driver/dev/nvidia-caps/nvidia-cap1", "511:0 -> /run/nvidia/driver/dev/nvidia-uvm"}
		if got := e.links(); !slices.Equal(got, want) {
			t.Fatalf("links %v, want %v", got, want)
		}
	})

	t.Run("containerized driver with the devices in the host's /dev", func(t *testing.T) {
		e := newEnv(t, nil)
		installDriver(t, e.driver)
		gpuDevices(t, e.host)
		writeFile(t, e.out, DriverCtrReadyFile, "", 0o644)
		e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
		o := e.options("driver")
		o.SkipGPUInit = true
		if err := e.run(o); err != nil {
			t.Fatalf("%v\n%s", err, e.log.String())
		}
		if got := e.links(); !slices.Equal(got, hostLinks) {
			t.Fatalf("links %v, want %v", got, hostLinks)
		}
	})

	t.Run("DISABLE_DEV_CHAR_SYMLINK_CREATION", func(t *testing.T) {
		e := newEnv(t, nil)
		installDriver(t, e.host)
		gpuDevices(t, e.host)
		e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
		o := e.options("driver")
		o.SkipGPUInit = true
		o.DisableDevCharSymlinks = true
		if err := e.run(o); err != nil {
			t.Fatal(err)
		}
		if got := e.links(); len(got) != 0 {
			t.Fatalf("links %v", got)
		}
	})

	t.Run("a file in the way fails the check", func(t *testing.T) {
		e := newEnv(t, nil)
		installDriver(t, e.host)
		gpuDevices(t, e.host)
		writeFile(t, e.devChar, "195:0", "", 0o644)
		e.runner.answers["/usr/bin/nvidia-smi"] = answer{}
		o := e.options("driver")
		o.SkipGPUInit = true
		if err := e.run(o); err == nil {
			t.Fatal("passed with a file in the way of a /dev/char link")
		}
		if _, ok := e.status("driver-ready"); ok {
			t.Fatal("driver-ready written")
		}
	})
}
