package kmod

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FixtureKernel is a Kernel that acts on a fixture host tree instead of the running kernel, the way Linux would:
// for tests only (unit tests through kmodtest, and the driver-manager binary in a real container on a test node,
// where the real kernel has no NVIDIA modules). A module is removable only when nothing holds or uses it, and
// removing it takes it out of proc/modules and sys/module and releases the modules it used, and loading it back
// (LoadModule, for a module it removed) restores both; an unmount takes the mount out of the fixture's mount table;
// an unbind writes the function's address to its driver's unbind file and takes the function's driver link away.
type FixtureKernel struct {
	// Root is the fixture host root: proc/modules and sys/module live there (Host.Root).
	Root string
	// OwnRoot is the root the unmount targets are under (Host.OwnRoot).
	OwnRoot string
	// MountInfo is the fixture's mount table, a path in this process's filesystem; its mount points are paths under
	// OwnRoot.
	MountInfo string
	// FailUnload, when n > 0, makes the n-th DeleteModule call fail with EBUSY, as if a user had opened the module
	// between the manager's check and its removal.
	FailUnload int
	// FailLoad makes every LoadModule fail, as modprobe does when the module files are gone.
	FailLoad bool

	deletes int
	// removed are the modules DeleteModule took out, with the modules each used, so LoadModule can put them back.
	removed map[string][]string
}

// NewFixtureKernel returns the fixture kernel of a Host whose Root, OwnRoot and MountInfo point into a fixture.
func NewFixtureKernel(h Host) *FixtureKernel {
	return &FixtureKernel{Root: h.Root, OwnRoot: h.OwnRoot, MountInfo: h.own(h.MountInfo)}
}

func (k *FixtureKernel) path(p ...string) string {
	return filepath.Join(append([]string{k.Root}, p...)...)
}

// DeleteModule removes a module whose use count is 0: EAGAIN while other modules hold it, EBUSY while it is
// otherwise in use, ENOENT when it is not loaded.
func (k *FixtureKernel) DeleteModule(name string) error {
	if k.deletes++; k.deletes == k.FailUnload {
		return unix.EBUSY
	}
	dir := k.path("sys", "module", name)
	b, err := os.ReadFile(filepath.Join(dir, "refcnt"))
	if err != nil {
		return unix.ENOENT
	}
	if holders, _ := os.ReadDir(filepath.Join(dir, "holders")); len(holders) > 0 {
		return unix.EAGAIN
	}
	if c, _ := strconv.Atoi(strings.TrimSpace(string(b))); c > 0 {
		return unix.EBUSY
	}
	// The modules it used are those that list it as a holder (sys/module/<m>/holders/<name>): each loses that
	// holder and one use.
	deps, _ := filepath.Glob(k.path("sys", "module", "*", "holders", name))
	var used []string
	for _, h := range deps {
		dep := filepath.Base(filepath.Dir(filepath.Dir(h)))
		if err := os.Remove(h); err != nil {
			return err
		}
		if err := k.addRefcnt(dep, -1); err != nil {
			return err
		}
		used = append(used, dep)
	}
	if err := k.dropFromProcModules(name); err != nil {
		return err
	}
	if k.removed == nil {
		k.removed = map[string][]string{}
	}
	k.removed[name] = used
	return os.RemoveAll(dir)
}

// LoadModule puts back a module DeleteModule removed, using the modules it used before (root is not read: the
// fixture has no module files). A module this kernel never removed is not found (ENOENT), as modprobe says.
func (k *FixtureKernel) LoadModule(_, name string) error {
	if k.FailLoad {
		return fmt.Errorf("modprobe %s: module files not found: %w", name, unix.ENOENT)
	}
	if _, err := os.Stat(k.path("sys", "module", name, "refcnt")); err == nil {
		return nil // loaded already
	}
	used, ok := k.removed[name]
	if !ok {
		return fmt.Errorf("modprobe %s: module not found: %w", name, unix.ENOENT)
	}
	if err := k.Load(name, used...); err != nil {
		return err
	}
	delete(k.removed, name)
	return nil
}

// Load adds a loaded module to the fixture tree as Linux shows it: sys/module/<name> with a use count of 0, and a
// line in proc/modules; each module in deps gets name as a holder and one more use.
func (k *FixtureKernel) Load(name string, deps ...string) error {
	if err := os.MkdirAll(k.path("sys", "module", name, "holders"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(k.path("sys", "module", name, "refcnt"), []byte("0\n"), 0o644); err != nil {
		return err
	}
	for _, d := range deps {
		if err := os.Symlink("../../"+name, k.path("sys", "module", d, "holders", name)); err != nil {
			return err
		}
		if err := k.addRefcnt(d, 1); err != nil {
			return err
		}
	}
	// proc/modules: name, size, use count, the modules using it ("used by"), state, address
	b, err := os.ReadFile(k.path("proc", "modules"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var lines []string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 3 && slices.Contains(deps, f[0]) {
			c, _ := strconv.Atoi(f[2])
			f[2] = strconv.Itoa(c + 1)
			f[3] = strings.TrimPrefix(f[3], "-") + name + ","
			line = strings.Join(f, " ") + "\n"
		}
		lines = append(lines, line)
	}
	lines = append(lines, name+" 1234 0 - Live 0x0000000000000000\n")
	return os.WriteFile(k.path("proc", "modules"), []byte(strings.Join(lines, "")), 0o644)
}

// dropFromProcModules rewrites proc/modules as Linux shows it after name is gone: its own line removed, and name
// taken out of the "used by" column (the fourth) of every module it used, whose use count (the third) drops by one.
func (k *FixtureKernel) dropFromProcModules(name string) error {
	mods, err := os.ReadFile(k.path("proc", "modules"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var keep []string
	for line := range strings.Lines(string(mods)) {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == name {
			continue
		}
		if len(f) > 3 {
			users := slices.DeleteFunc(strings.Split(strings.Trim(f[3], ",-"), ","), func(u string) bool { return u == "" })
			if i := slices.Index(users, name); i >= 0 {
				users = slices.Delete(users, i, i+1)
				f[3] = "-"
				if len(users) > 0 {
					f[3] = strings.Join(users, ",") + ","
				}
				if c, err := strconv.Atoi(f[2]); err == nil && c > 0 {
					f[2] = strconv.Itoa(c - 1)
				}
				line = strings.Join(f, " ") + "\n"
			}
		}
		keep = append(keep, line)
	}
	return os.WriteFile(k.path("proc", "modules"), []byte(strings.Join(keep, "")), 0o644)
}

func (k *FixtureKernel) addRefcnt(module string, n int) error {
	p := k.path("sys", "module", module, "refcnt")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("module %s is not loaded in the fixture: %w", module, err)
	}
	c, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return os.WriteFile(p, []byte(strconv.Itoa(c+n)+"\n"), 0o644)
}

// Unmount removes the latest mount at target (a path under OwnRoot) from the mount table: EINVAL when target
// is not a mount point.
func (k *FixtureKernel) Unmount(target string) error {
	mp, err := filepath.Rel(k.OwnRoot, target)
	if err != nil || strings.HasPrefix(mp, "..") {
		return unix.EINVAL
	}
	mp = filepath.Join("/", mp)
	b, err := os.ReadFile(k.MountInfo)
	if err != nil {
		return err
	}
	lines := slices.Collect(strings.Lines(string(b)))
	for i := len(lines) - 1; i >= 0; i-- {
		if f := strings.Fields(lines[i]); len(f) > 4 && unescapeMountPath(f[4]) == mp {
			lines = slices.Delete(lines, i, i+1)
			return os.WriteFile(k.MountInfo, []byte(strings.Join(lines, "")), 0o644)
		}
	}
	return unix.EINVAL
}

// UnbindDevice writes the function's address to its driver's unbind file, as the kernel's sysfs takes it, and
// removes the function's driver link, as the kernel would.
func (k *FixtureKernel) UnbindDevice(dev string) error {
	if err := (System{}).writeUnbind(dev, true); err != nil {
		return err
	}
	return os.Remove(filepath.Join(dev, "driver"))
}
