package validationtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestBuildFixtureDriverRoot(t *testing.T) {
	d, err := BuildFixtureDriverRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d.Interpreter == "" || !strings.HasPrefix(d.Interpreter, "/") {
		t.Fatalf("interpreter %q", d.Interpreter)
	}
	// the root's own loader runs it, with the root's libraries
	lib := filepath.Join(d.Dir, d.LibDir)
	out, err := exec.Command(filepath.Join(d.Dir, d.Interpreter), "--library-path", lib, filepath.Join(d.Dir, d.NvidiaSMI)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "GPU 0: "+GPUName) || !strings.Contains(string(out), LoaderLine+filepath.Join(d.Dir, d.Interpreter)) {
		t.Fatalf("%v:\n%s", err, out)
	}
	// without a library path it cannot find the stand-in NVML: nothing outside the root is used by accident
	if out, err := exec.Command(filepath.Join(d.Dir, d.NvidiaSMI)).CombinedOutput(); err == nil {
		t.Fatalf("ran without its NVML:\n%s", out)
	}
	want := map[string]uint64{"dev/nvidia0": unix.Mkdev(NvidiaMajor, 0), "dev/nvidiactl": unix.Mkdev(NvidiaMajor, NvidiaCtlMinor), "dev/nvidia-uvm": unix.Mkdev(UVMMajor, 0)}
	if len(d.Devices) != len(want) {
		t.Fatalf("devices %v", d.Devices)
	}
	for _, dev := range d.Devices {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(d.Dir, dev), &st); err != nil {
			t.Fatal(err)
		}
		isChar := st.Mode&unix.S_IFMT == unix.S_IFCHR
		if isChar != d.CharDevices || (isChar && st.Rdev != want[dev]) {
			t.Fatalf("%s: mode %o rdev %d, CharDevices %v", dev, st.Mode, st.Rdev, d.CharDevices)
		}
	}
	if os.Geteuid() == 0 && !d.CharDevices {
		t.Log("running as root without CAP_MKNOD: the devices are regular files")
	}
}
