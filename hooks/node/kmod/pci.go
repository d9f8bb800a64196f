package kmod

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

// PCI vendor IDs as sysfs writes them.
const (
	VendorNVIDIA   = "0x10de"
	VendorMellanox = "0x15b3"
)

// VFIODrivers are the drivers vm-passthrough binds NVIDIA functions to (vfio-pci, or the Grace Hopper variant).
var VFIODrivers = []string{"vfio-pci", "nvgrace_gpu_vfio_pci"}

// PCIFunction is one function under sys/bus/pci/devices.
type PCIFunction struct {
	Address, Vendor string
	// Driver is the bound driver's name ("" when none).
	Driver string
}

// PCIFunctions lists the host's PCI functions from SysDir, in address order.
func (h Host) PCIFunctions() ([]PCIFunction, error) {
	dir := filepath.Join(h.SysDir, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list PCI functions: %w", err)
	}
	var out []PCIFunction
	for _, e := range entries {
		vendor, err := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil {
			continue // gone meanwhile, or not a function
		}
		f := PCIFunction{Address: e.Name(), Vendor: strings.TrimSpace(string(vendor))}
		if target, err := os.Readlink(filepath.Join(dir, e.Name(), "driver")); err == nil {
			f.Driver = filepath.Base(target)
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b PCIFunction) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// HasPCIVendor reports whether a function of vendor is present.
func (h Host) HasPCIVendor(vendor string) (bool, error) {
	fs, err := h.PCIFunctions()
	return slices.ContainsFunc(fs, func(f PCIFunction) bool { return f.Vendor == vendor }), err
}

// UnbindVFIO releases the NVIDIA functions a vm-passthrough role left bound to vfio-pci (or a variant), so the
// NVIDIA driver can take them: each is unbound from its driver and its driver_override cleared. It returns the
// addresses it released.
func (h Host) UnbindVFIO() ([]string, error) {
	fs, err := h.PCIFunctions()
	if err != nil {
		return nil, err
	}
	var done []string
	for _, f := range fs {
		if f.Vendor != VendorNVIDIA || !slices.Contains(VFIODrivers, f.Driver) {
			continue
		}
		dev := filepath.Join(h.SysDir, "bus", "pci", "devices", f.Address)
		if err := h.Kernel.UnbindDevice(dev); err != nil {
			return done, fmt.Errorf("unbind %s from %s: %w", f.Address, f.Driver, err)
		}
		// an override left set would bind the function to vfio-pci again on the next probe
		if err := clearDriverOverride(dev); err != nil {
			return done, err
		}
		done = append(done, f.Address)
	}
	return done, nil
}

func clearDriverOverride(dev string) error {
	p := filepath.Join(dev, "driver_override")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clear %s: %w", p, err)
	}
	_, err = f.WriteString("\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("clear %s: %w", p, err)
	}
	return nil
}

// UnloadNouveau removes the nouveau module when it is loaded, as the NVIDIA driver cannot load next to it; it
// reports whether it removed it.
func (h Host) UnloadNouveau() (bool, error) {
	if _, err := os.Stat(h.host("sys", "module", "nouveau", "refcnt")); err != nil {
		return false, nil
	}
	err := h.Kernel.DeleteModule("nouveau")
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EAGAIN):
		return false, fmt.Errorf("kernel module nouveau is in use (use count %d; a console or display server may hold it): blacklist it on the node (modprobe.blacklist=nouveau) and reboot: %w",
			h.refcnt("nouveau"), err)
	default:
		return false, fmt.Errorf("unload kernel module nouveau: %w", err)
	}
}

// MOFEDReadyFile is where the MOFED driver container says it is ready, in the manager's own root.
const MOFEDReadyFile = "/run/mellanox/drivers/.driver-ready"

// MOFEDReady reports whether the Mellanox OFED driver GPUDirect RDMA needs is up, and what it looked at: with a
// host MOFED, mlx5_core in the host's proc/modules; otherwise the MOFED driver container's ready file.
func (h Host) MOFEDReady(hostMOFED bool) (bool, string, error) {
	if hostMOFED {
		what := "kernel module mlx5_core in " + h.host("proc", "modules") + " (host MOFED)"
		b, err := os.ReadFile(h.host("proc", "modules"))
		if err != nil {
			return false, what, fmt.Errorf("read loaded modules: %w", err)
		}
		return slices.Contains(ModuleNames(b), "mlx5_core"), what, nil
	}
	p := h.own(MOFEDReadyFile)
	what := p + " (the MOFED driver container)"
	_, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, what, nil
	}
	return err == nil, what, err
}
