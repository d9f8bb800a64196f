package validation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostdriver"
	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// Files the driver's own containers write in the validations directory.
const (
	// DriverCtrReadyFile is written by the driver container's startup probe once the driver answers; it lists
	// GDRCOPY_ENABLED, GDS_ENABLED and GPU_DIRECT_RDMA_ENABLED.
	DriverCtrReadyFile = ".driver-ctr-ready"
	// CCManagerCtrReadyFile is written by the CC manager once the GPUs' CC mode is set.
	CCManagerCtrReadyFile = ".cc-manager-ctr-ready"
)

// driverModule is a kernel module the driver container loads when a feature is on.
type driverModule struct {
	component string // the validator subcommand that checks it alone
	env       string // its switch in .driver-ctr-ready
	module    string // its name in /proc/modules
	file      string // the status file it writes
}

var driverModules = []driverModule{
	{component: "gdrcopy", env: "GDRCOPY_ENABLED", module: "gdrdrv", file: "gdrcopy-ready"},
	{component: "gds", env: "GDS_ENABLED", module: "nvidia_fs", file: "nvidia-fs-ready"},
	{component: "rdma", env: "GPU_DIRECT_RDMA_ENABLED", module: "nvidia_peermem", file: "nvidia-peermem-ready"},
}

// Where the operands that source driver-ready (toolkit, device plugin, MPS control daemon, MIG manager) mount the
// driver install dir and the host's /: driver-ready names these, not the validator's own mounts.
const (
	ConsumerDriverRoot = "/driver-root"
	ConsumerHostRoot   = "/host"
)

// driverInfo is where the driver lives, as driver-ready tells the operands that source it.
type driverInfo struct {
	host bool
	// root is the driver's root in this container (HostRoot or DriverInstallDir).
	root hostfs.Root
	// rootHostPath is the same root on the host ("/" or the driver install dir).
	rootHostPath string
	// devRootHostPath and devRootCtr are where /dev/nvidia* live, on the host and here.
	devRootHostPath, devRootCtr string
	// consumerRoot and consumerDevRoot are the driver root and the dev root in the consumers' containers.
	consumerRoot, consumerDevRoot string
	// smiDir is nvidia-smi's directory relative to root.
	smiDir  string
	version string
	gpus    int
}

// env is driver-ready's content: KEY=VALUE lines that `sh` sources (set -a; . driver-ready).
func (d *driverInfo) env() []byte {
	var b bytes.Buffer
	for _, kv := range [][2]string{
		{"IS_HOST_DRIVER", fmt.Sprint(d.host)},
		{"NVIDIA_DRIVER_ROOT", d.rootHostPath},
		{"DRIVER_ROOT_CTR_PATH", d.consumerRoot},
		{"NVIDIA_DEV_ROOT", d.devRootHostPath},
		{"DEV_ROOT_CTR_PATH", d.consumerDevRoot},
	} {
		fmt.Fprintf(&b, "%s=%s\n", kv[0], shellQuote(kv[1]))
	}
	return b.Bytes()
}

func (d *driverInfo) String() string {
	kind := "containerized driver"
	if d.host {
		kind = "host driver"
	}
	s := fmt.Sprintf("%s under %s", kind, d.root)
	if d.version != "" {
		s += ", version " + d.version
	}
	if d.gpus > 0 {
		s += fmt.Sprintf(", %d GPU(s)", d.gpus)
	}
	return s
}

// driverCheck proves the driver answers, on the host or in its container, and writes driver-ready; then waits for
// the extra modules the driver container was asked to load.
func (o *Options) driverCheck() check {
	var found *driverInfo // once found, later attempts only wait for the extra modules
	return check{
		name: "driver",
		owns: []string{"driver-ready", "gdrcopy-ready", "nvidia-fs-ready", "nvidia-peermem-ready"},
		attempt: func(ctx context.Context, p progress) result {
			if found == nil {
				d, r := o.findDriver(ctx, p)
				if d == nil {
					return r
				}
				p.Logf("%s answers", d)
				if err := o.linkDevChar(p, d); err != nil {
					return failed("%v", err)
				}
				found = d
			}
			files := []file{{name: "driver-ready", data: found.env()}}
			if found.host {
				return ready(files...)
			}
			return o.driverModules(files)
		},
	}
}

// findDriver locates the driver (a host install first, as the driver DaemonSet stands down on such nodes) and
// probes it with nvidia-smi and NVML. A host driver is what hostdriver.Lookup says, the driver manager's own
// lookup: an nvidia-smi under the host root that runs (here chrooted into it, through Runner). One that fails is
// a leftover of an uninstalled driver, and the driver container's driver is looked for instead.
func (o *Options) findDriver(ctx context.Context, p progress) (*driverInfo, result) {
	host := hostfs.Root(o.HostRoot)
	hd, err := hostdriver.Lookup(ctx, host, o.runIn, o.smiArgs()...)
	if err != nil {
		return nil, failed("%v", err)
	}
	if hd.Present() {
		d := &driverInfo{host: true, root: host, rootHostPath: "/", devRootHostPath: "/", devRootCtr: o.HostRoot, smiDir: hd.Dir,
			consumerRoot: ConsumerHostRoot, consumerDevRoot: ConsumerHostRoot}
		return o.probeNVML(p, d)
	}
	ctrReady, err := hostfs.Root(o.OutputDir).Exists(DriverCtrReadyFile)
	if err != nil {
		return nil, failed("%v", err)
	}
	if !ctrReady {
		return nil, waiting("no host driver (%s) and the driver container is not ready (no %s in %s)", hd, DriverCtrReadyFile, o.OutputDir)
	}
	drv := hostfs.Root(o.DriverInstallDir)
	dir, _, err := drv.FindExecutable("nvidia-smi", hostfs.BinDirs)
	if err != nil {
		return nil, waiting("the driver container is ready (%s) but its root has no nvidia-smi: %v", DriverCtrReadyFile, err)
	}
	d := &driverInfo{root: drv, rootHostPath: o.DriverInstallDirHostPath, smiDir: dir,
		devRootHostPath: "/", devRootCtr: o.HostRoot, consumerRoot: ConsumerDriverRoot, consumerDevRoot: ConsumerHostRoot}
	// device nodes are normally created on the host's /dev; a driver container that keeps its own has them there
	if own, _ := drv.Exists("dev/nvidiactl"); own {
		d.devRootHostPath, d.devRootCtr, d.consumerDevRoot = o.DriverInstallDirHostPath, o.DriverInstallDir, ConsumerDriverRoot
	}
	return o.probeDriver(ctx, p, d)
}

// runIn runs a program of root chrooted in it, through Runner (hostdriver.RunFunc).
func (o *Options) runIn(ctx context.Context, root hostfs.Root, path string, args []string) ([]byte, error) {
	return o.Runner.Run(ctx, Command{Root: root.String(), Path: path, Args: args})
}

// smiArgs are nvidia-smi's arguments: none (it queries every GPU), or only --version with SkipGPUInit.
func (o *Options) smiArgs() []string {
	if o.SkipGPUInit {
		return []string{"--version"}
	}
	return nil
}

func (o *Options) probeDriver(ctx context.Context, p progress, d *driverInfo) (*driverInfo, result) {
	smi := Command{Root: d.root.String(), Path: "/" + d.smiDir + "/nvidia-smi", Args: o.smiArgs()}
	out, err := o.Runner.Run(ctx, smi)
	if err != nil {
		return nil, waiting("nvidia-smi under %s failed: %s", filepath.Join(d.root.String(), d.smiDir), describeRun(out, err))
	}
	return o.probeNVML(p, d)
}

// probeNVML counts the GPUs and reads the driver version through the driver's NVML, once its nvidia-smi answered.
func (o *Options) probeNVML(p progress, d *driverInfo) (*driverInfo, result) {
	if o.SkipGPUInit { // no GPU is touched: NVML would initialise them
		return d, result{}
	}
	lib, err := d.root.FindLibrary("libnvidia-ml.so.1")
	if err != nil {
		return nil, waiting("nvidia-smi answers but NVML is missing: %v", err)
	}
	d.gpus, d.version, err = o.NVML.Probe(lib)
	if errors.Is(err, ErrNVMLNotBuiltIn) { // the static image: nvidia-smi answered, which is the check
		p.Logf("%v", err)
		return d, result{}
	}
	if err != nil {
		return nil, waiting("%v", err)
	}
	return d, result{}
}

// driverModules waits for the modules .driver-ctr-ready switches on; driver-ready is written meanwhile, as the
// driver itself works.
func (o *Options) driverModules(files []file) result {
	raw, err := os.ReadFile(filepath.Join(o.OutputDir, DriverCtrReadyFile))
	if errors.Is(err, fs.ErrNotExist) { // the driver container is restarting: driver-ready stays, as it was true
		return waiting("the driver container stopped (%s is gone) before its modules were checked", DriverCtrReadyFile)
	}
	if err != nil {
		return failed("read %s: %v", DriverCtrReadyFile, err)
	}
	switches := parseEnv(raw)
	var wanted []driverModule
	for _, m := range driverModules {
		if strings.EqualFold(switches[m.env], "true") {
			wanted = append(wanted, m)
		}
	}
	if len(wanted) == 0 {
		return ready(files...)
	}
	mods, err := hostfs.Root(o.HostRoot).LoadedModules()
	if err != nil {
		return failed("%v", err)
	}
	var missing []string
	for _, m := range wanted {
		if mods[m.module] {
			files = append(files, file{name: m.file})
		} else {
			missing = append(missing, fmt.Sprintf("%s (%s=true)", m.module, m.env))
		}
	}
	r := ready(files...)
	if len(missing) > 0 {
		r = waiting("driver ready; kernel module %s not loaded yet (%s)", strings.Join(missing, ", "),
			path.Join(o.HostRoot, "proc/modules"))
		r.files = files
	}
	return r
}

// moduleCheck is a standalone check of one of the driver's extra modules (rdma, gds, gdrcopy).
func (o *Options) moduleCheck(component string) check {
	var m driverModule
	for _, dm := range driverModules {
		if dm.component == component {
			m = dm
		}
	}
	return check{
		name: component,
		owns: []string{m.file},
		attempt: func(context.Context, progress) result {
			mods, err := hostfs.Root(o.HostRoot).LoadedModules()
			if err != nil {
				return failed("%v", err)
			}
			if !mods[m.module] {
				return waiting("kernel module %s is not loaded (%s)", m.module, path.Join(o.HostRoot, "proc/modules"))
			}
			return ready(file{name: m.file})
		},
	}
}

// parseEnv reads KEY=VALUE lines (optionally "export "), as the driver container writes .driver-ctr-ready and
// the driver check writes driver-ready, and `KEY: value` lines, as a GPU Operator driver writes .driver-ctr-ready
// (met during a takeover); comments, blank lines and lines without a key are skipped. A KEY=VALUE value reads as
// `sh` assigns it (shellWord), so what shellQuote wrote comes back as it was; a `KEY: value` one as a YAML scalar
// (one pair of quotes taken off).
func parseEnv(raw []byte) map[string]string {
	env := map[string]string{}
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		eq, colon := strings.IndexByte(line, '='), yamlColon(line)
		if colon >= 0 && (eq < 0 || colon < eq) {
			if k := line[:colon]; k != "" && !strings.ContainsAny(k, " \t") {
				env[k] = yamlScalar(strings.TrimSpace(line[colon+1:]))
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if k = strings.TrimSpace(k); !ok || k == "" || strings.ContainsAny(k, " \t") {
			continue
		}
		env[k] = shellWord(strings.TrimSpace(v))
	}
	return env
}

// yamlColon is where a `KEY: value` line's colon is (followed by white space or the line's end), or -1.
func yamlColon(line string) int {
	for i := 0; i < len(line); i++ {
		if line[i] == ':' && (i+1 == len(line) || line[i+1] == ' ' || line[i+1] == '\t') {
			return i
		}
	}
	return -1
}

// yamlScalar is a plain or quoted YAML scalar's text.
func yamlScalar(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// shellWord reads an assignment's value as `sh` does: '...' literally, "..." with \ escaping $ ` " and \, and
// unquoted text with \ escaping the next character, up to unquoted white space; an unterminated quote runs to
// the end of the line.
func shellWord(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return b.String() + s[i+1:]
			}
			b.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("$`\"\\", s[i+1]) >= 0 {
					i++
				}
				b.WriteByte(s[i])
			}
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case ' ', '\t':
			return b.String()
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// shellQuote leaves plain paths as they are and single-quotes anything else.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-:+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
