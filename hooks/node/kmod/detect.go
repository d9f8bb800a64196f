package kmod

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostdriver"
)

// Detection is what the driver manager reads of a node before it acts, gathered without changing anything.
type Detection struct {
	// HostDriver is the host's own nvidia-smi when it runs ("" when none); HostLookup says what was found.
	HostDriver string
	HostLookup hostdriver.Result
	// DriverPodFiles are what a containerized driver left (state file, pid file, driver root mounts).
	DriverPodFiles []string
	// Modules are the loaded NVIDIA modules; Nouveau says whether nouveau is loaded.
	Modules []Module
	Nouveau bool
	// DeviceUsers have a /dev/nvidia* device open.
	DeviceUsers []Process
	// NVIDIAFunctions are the NVIDIA PCI functions, with their drivers.
	NVIDIAFunctions []PCIFunction
}

// Detect reads the node as the driver manager's first step does, and more: nothing is changed (the host's
// nvidia-smi, if any, is run).
func (h Host) Detect(ctx context.Context) (Detection, error) {
	var d Detection
	var err error
	if d.HostLookup, err = h.HostDriver(ctx); err != nil {
		return d, err
	}
	if d.HostLookup.Present() {
		d.HostDriver = d.HostLookup.Path
	}
	if d.DriverPodFiles, err = h.DriverPodFiles(); err != nil {
		return d, err
	}
	if d.Modules, err = h.Loaded(); err != nil {
		return d, err
	}
	_, statErr := os.Stat(h.host("sys", "module", "nouveau", "refcnt"))
	d.Nouveau = statErr == nil
	if d.DeviceUsers, err = h.DeviceUsers(); err != nil {
		return d, err
	}
	fs, err := h.PCIFunctions()
	if err != nil {
		return d, err
	}
	for _, f := range fs {
		if f.Vendor == VendorNVIDIA {
			d.NVIDIAFunctions = append(d.NVIDIAFunctions, f)
		}
	}
	return d, nil
}

// Verdict is the driver manager's reading of the node in one line.
func (d Detection) Verdict() string {
	switch {
	case d.HostDriver != "" && len(d.DriverPodFiles) == 0:
		return "host driver: the driver manager would mark the node pre-installed and keep the driver container from starting"
	case len(d.NVIDIAFunctions) == 0 && len(d.Modules) == 0 && d.HostDriver == "":
		return "no NVIDIA GPU and no NVIDIA driver found"
	case len(d.Modules) == 0:
		return "no NVIDIA driver loaded: a driver container would install one"
	}
	return "NVIDIA driver loaded by a driver container"
}

// Write prints the detection as a report, one fact a line.
func (d Detection) Write(w io.Writer, h Host) {
	none := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	host := "none (" + d.HostLookup.String() + ")"
	if d.HostDriver != "" {
		host = "found: " + d.HostDriver
	}
	var mods, users, fns []string
	for _, m := range d.Modules {
		s := fmt.Sprintf("%s (use count %d", m.Name, m.Refcnt)
		if len(m.Holders) > 0 {
			s += ", held by " + strings.Join(m.Holders, " ")
		}
		mods = append(mods, s+")")
	}
	for _, p := range d.DeviceUsers {
		users = append(users, p.String())
	}
	for _, f := range d.NVIDIAFunctions {
		drv := f.Driver
		if drv == "" {
			drv = "no driver"
		}
		fns = append(fns, f.Address+" ("+drv+")")
	}
	nouveau := "not loaded"
	if d.Nouveau {
		nouveau = "loaded"
	}
	fmt.Fprintf(w, "host driver:                %s\n", host)
	fmt.Fprintf(w, "driver container's files:   %s\n", none(d.DriverPodFiles))
	fmt.Fprintf(w, "NVIDIA modules loaded:      %s\n", none(mods))
	fmt.Fprintf(w, "nouveau:                    %s\n", nouveau)
	fmt.Fprintf(w, "/dev/nvidia* held open by:  %s\n", none(users))
	fmt.Fprintf(w, "NVIDIA PCI functions:       %s\n", none(fns))
	fmt.Fprintf(w, "verdict:                    %s\n", d.Verdict())
}
