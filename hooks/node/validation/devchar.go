package validation

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultDevCharDir is where the chart mounts the host's /dev/char.
const DefaultDevCharDir = "/host-dev-char"

// devCharLinks creates, in the host's /dev/char, the <major>:<minor> links to the driver's character devices
// (/dev/nvidia*, /dev/nvidia-caps/*), as `nvidia-ctk system create-dev-char-symlinks` does. runc resolves a
// container's device cgroup rules through /dev/char; without the links a systemd daemon-reload rewrites the rules
// without the GPUs and running containers lose them. The targets are host paths: "../nvidia0" when the devices
// live in the host's /dev, the driver root's dev dir on the host when the driver container keeps its own.
// It returns the links it created or corrected; links already right are left alone.
func (o *Options) devCharLinks(d *driverInfo) ([]string, error) {
	devDir := filepath.Join(d.devRootCtr, "dev")
	var devs []string
	for _, pattern := range []string{"nvidia*", "nvidia-caps/*"} {
		m, err := filepath.Glob(filepath.Join(devDir, pattern))
		if err != nil {
			return nil, err
		}
		devs = append(devs, m...)
	}
	slices.Sort(devs)
	var made []string
	for _, dev := range devs {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return made, fmt.Errorf("stat %s: %w", dev, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue // nvidia-caps itself, or anything that is not a device
		}
		rel, err := filepath.Rel(devDir, dev)
		if err != nil {
			return made, err
		}
		target := filepath.Join(d.devRootHostPath, "dev", rel)
		if d.devRootHostPath == "/" {
			target = filepath.Join("..", rel) // relative to /dev/char, as udev writes them
		}
		name := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		link := filepath.Join(o.DevCharDir, name)
		if cur, err := os.Readlink(link); err == nil && cur == target {
			continue
		}
		if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
			return made, fmt.Errorf("%s exists and is not a symlink: not replaced", link)
		}
		// a stale link (another device root before) is replaced through a rename, so it never goes missing
		tmp := link + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			return made, fmt.Errorf("create /dev/char link %s -> %s: %w", name, target, err)
		}
		if err := os.Rename(tmp, link); err != nil {
			_ = os.Remove(tmp)
			return made, fmt.Errorf("create /dev/char link %s -> %s: %w", name, target, err)
		}
		made = append(made, name+" -> "+target)
	}
	return made, nil
}

// linkDevChar runs devCharLinks unless disabled or the host's /dev/char is not mounted, and logs what it did.
func (o *Options) linkDevChar(p progress, d *driverInfo) error {
	if o.DisableDevCharSymlinks {
		return nil
	}
	if fi, err := os.Stat(o.DevCharDir); err != nil || !fi.IsDir() {
		p.Logf("%s is not mounted: no /dev/char links created", o.DevCharDir)
		return nil
	}
	made, err := o.devCharLinks(d)
	if err != nil {
		return fmt.Errorf("%w (DISABLE_DEV_CHAR_SYMLINK_CREATION=true skips the /dev/char links)", err)
	}
	if len(made) > 0 {
		p.Logf("created /dev/char links: %s", strings.Join(made, ", "))
	}
	return nil
}
