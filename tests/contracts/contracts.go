// Package contracts records what each third-party image the chart runs expects from the pod that runs it: its
// entrypoint and binaries, its user, the env vars it reads (and which it needs), the files it reads from other
// operands and the host paths it needs. Every fact is taken from the image's upstream source at the pinned tag and
// names that source in a comment; what could not be read there says so in the row's Unverified field.
//
// The table serves two readers: the chart tests, which check every rendered container of a third-party image
// against its row (Check), and the stand-in images of the real-node tier, which play an image by its row.
package contracts

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// EnvVar is one env var an image reads.
type EnvVar struct {
	// Required: the image fails, or does the wrong thing on every node, without it.
	Required bool
	// Binaries limits Required to these binaries of the image (base names); empty means every binary.
	Binaries []string
	// Avoid is set when setting the var changes a behaviour the chart relies on; it says why. A container that sets
	// it violates the contract.
	Avoid string
}

// File is a file an image reads that another operand writes.
type File struct {
	Path   string // path inside the container
	Format string // what the reader expects in it
	From   string // who writes it
	When   string // read only by containers that set this env var to "true"; empty: always
}

// HostPath is a host path an image needs mounted.
type HostPath struct {
	// Container is where the image looks for it.
	Container string
	// Host is the host path it must come from; empty when any host location will do (a distribution's kubelet
	// directory, the driver root of a host or containerized driver).
	Host string
	// When limits the need to containers that set this env var to "true".
	When string
	// Binaries limits the need to these binaries of the image (base names); empty means every binary.
	Binaries []string
	// Subcommand limits the need to containers whose command line holds this word (the driver's init, say).
	Subcommand string
	// Why says what the image does with it.
	Why string
}

// Contract is one row of the table: one image repository and the tags it covers.
type Contract struct {
	// Repository is the image repository without its registry ("nvidia/k8s-device-plugin"), so mirrors match too.
	Repository string
	// Tags matches the tags the row covers (anchored): driver, GDS and GDRCopy tags carry an OS suffix.
	Tags *regexp.Regexp
	// Source is the upstream repository and tag (or commit) the facts come from.
	Source string
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD; what runs when the pod renders no command.
	Entrypoint, Cmd []string
	// Binaries are the image's executables (absolute paths) a pod may run; the PATH holds their directories.
	Binaries []string
	// Shell is the POSIX shell the image carries ("/bin/sh", a busybox with its applets, or bash with a distro's
	// tools); empty when there is none, so a rendered `sh -c` cannot run.
	Shell string
	// User is the user the image runs as (Dockerfile USER; "0" for root, including an image with no USER).
	User string
	// NeedsRoot: the image's work (loading modules, writing /sys, host files) fails for any other user.
	NeedsRoot bool
	// Rootless are the image's binaries (base names) that need no root although the image's main one does.
	Rootless []string
	// Env are the env vars the image reads (urfave/cli EnvVars/Sources, os.Getenv, entrypoint scripts).
	Env map[string]EnvVar
	// ReadsFiles are files it reads that other operands write.
	ReadsFiles []File
	// HostPaths are the host paths it needs mounted.
	HostPaths []HostPath
	// NoAPI: the image never talks to the Kubernetes API (no client library, no kubectl, no read of a
	// service-account token), so a container of it must get no token: its pod does not automount one (our own
	// containers there mount theirs, gpu-stack-lib.apiAccessMount) and it mounts none itself.
	NoAPI bool
	// Unverified lists what could not be read from the upstream source at the tag, and why. Checks that rest on
	// an unverified fact are skipped: EnvUnverified skips the env checks.
	Unverified    string
	EnvUnverified bool
}

// RuntimeEnv are env vars the chart may set on any container although the image does not read them: the NVIDIA
// container runtime (and its CDI mode) reads them from the container's spec to decide which GPUs and driver
// capabilities to inject, before the image's process starts (nvidia-container-toolkit v1.20.0
// internal/config/image/envvars.go).
var RuntimeEnv = map[string]string{
	"NVIDIA_VISIBLE_DEVICES":     "read by the NVIDIA container runtime: which GPUs to inject (void: none)",
	"NVIDIA_DRIVER_CAPABILITIES": "read by the NVIDIA container runtime: which driver libraries to inject",
	"NVIDIA_MIG_MONITOR_DEVICES": "read by the NVIDIA container runtime: expose MIG monitor capabilities",
	"NVIDIA_MIG_CONFIG_DEVICES":  "read by the NVIDIA container runtime: expose MIG config capabilities",
	"NVIDIA_DISABLE_REQUIRE":     "read by the NVIDIA container runtime: skip the image's CUDA version check",
}

// DriverReadyEnv are the variables of /run/nvidia/validations/driver-ready, the file the validator writes and the
// chart's wrappers source (`set -a; . driver-ready`) before exec'ing an operand (hooks/node/validation/driver.go).
var DriverReadyEnv = []string{"IS_HOST_DRIVER", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH", "NVIDIA_DEV_ROOT", "DEV_ROOT_CTR_PATH"}

// TokenDir is where a pod's service-account token is mounted (client-go's in-cluster config reads it there).
const TokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// GetsToken: a container of the pod holds the pod's service-account token, automounted or mounted by name.
func GetsToken(pod corev1.PodSpec, c corev1.Container) bool {
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		return true
	}
	// the token's directory or one above it (a container's / is not a mount that could hold it)
	for _, m := range c.VolumeMounts {
		p := path.Clean(m.MountPath)
		if p == TokenDir || p != "/" && strings.HasPrefix(TokenDir, p+"/") {
			return true
		}
	}
	return false
}

// DriverReadyFile is where the validator writes driver-ready.
const DriverReadyFile = "/run/nvidia/validations/driver-ready"

// Lookup returns the row for an image reference (registry ignored, digest ignored), or false when no row covers it.
func Lookup(imageRef string) (Contract, bool) {
	repo, tag := splitRef(imageRef)
	for _, c := range Table {
		if c.Repository == repo && c.Tags.MatchString(tag) {
			return c, true
		}
	}
	return Contract{}, false
}

// splitRef cuts a reference into its registry-less repository and its tag.
func splitRef(ref string) (repo, tag string) {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref, tag = ref[:i], ref[i+1:]
	}
	if first, rest, ok := strings.Cut(ref, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		ref = rest
	}
	return ref, tag
}

// Run is what a container runs, resolved against the image: the program exec'd and, for a shell script, the
// programs it calls.
type Run struct {
	Argv     []string // the full command line (command+args, or the image's entrypoint+cmd)
	Program  string   // the program the container ends up running (a shell script's exec'd program)
	Script   string   // the shell script, when Argv is `sh -c SCRIPT`
	Programs []string // every program the script calls (shell builtins and utilities left out)
}

var shells = []string{"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/busybox/sh"}

// shellKeywords prefix a command in a shell script; the command follows them.
var shellKeywords = []string{"exec", "until", "while", "do", "if", "then", "else", "!"}

// shellUtilities are the builtins and utilities a script may call from the image's shell (busybox applets or a
// distro's tools): not the image's own programs, and their arguments are not commands.
var shellUtilities = []string{"[", "[[", "test", "echo", "sleep", "grep", "set", ".", "source", "trap", "exit", "wait",
	"true", "false", "cat", "lsmod", "export", "done", "fi", "}", "]"}

// Resolve returns what a container runs.
func (c Contract) Resolve(ctr corev1.Container) Run {
	argv := slices.Concat(ctr.Command, ctr.Args)
	switch {
	case len(ctr.Command) == 0 && len(ctr.Args) == 0:
		argv = slices.Concat(c.Entrypoint, c.Cmd)
	case len(ctr.Command) == 0:
		argv = slices.Concat(c.Entrypoint, ctr.Args)
	}
	r := Run{Argv: argv}
	if len(argv) == 0 {
		return r
	}
	r.Program = argv[0]
	if slices.Contains(shells, argv[0]) && len(argv) >= 3 && strings.HasPrefix(argv[1], "-") && strings.Contains(argv[1], "c") {
		r.Script = argv[2]
		for _, cmd := range regexp.MustCompile(`;|&&|\|\||\||\n|&`).Split(r.Script, -1) {
			words := strings.Fields(cmd)
			exec := false
			for len(words) > 0 && slices.Contains(shellKeywords, words[0]) {
				exec = exec || words[0] == "exec"
				words = words[1:]
			}
			// a `for NAME in WORDS` clause lists words, not a command
			if len(words) == 0 || words[0] == "for" || slices.Contains(shellUtilities, words[0]) || strings.Contains(words[0], "=") || strings.HasPrefix(words[0], "$") {
				continue
			}
			if exec {
				r.Program = words[0]
			}
			r.Programs = append(r.Programs, words[0])
		}
		if r.Program == argv[0] && len(r.Programs) > 0 {
			r.Program = r.Programs[len(r.Programs)-1]
		}
	}
	return r
}

// HasBinary reports whether the image holds a program by the name or path a command gives it.
func (c Contract) HasBinary(name string) bool {
	for _, b := range c.Binaries {
		if b == name || (!strings.Contains(name, "/") && path.Base(b) == name) {
			return true
		}
	}
	return false
}

// Check returns the ways a rendered container breaks the image's contract, as readable sentences; none when it
// keeps it. volumes are the pod's volumes; scripts are the texts of chart scripts the container runs (a ConfigMap
// mounted into it, such as a probe), so env vars only those scripts read count as read.
func (c Contract) Check(ctr corev1.Container, volumes []corev1.Volume, scripts ...string) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	run := c.Resolve(ctr)
	prog := path.Base(run.Program)

	// The command exists in the image.
	switch {
	case len(run.Argv) == 0:
		bad("runs nothing: no command is rendered and the image has no entrypoint")
	case run.Script != "":
		if c.Shell == "" {
			bad("runs %q, but the image has no shell", run.Argv[0])
		}
		for _, p := range run.Programs {
			if !c.HasBinary(p) {
				bad("its script calls %q, which the image does not hold (it has %v)", p, c.Binaries)
			}
		}
	case !c.HasBinary(run.Argv[0]):
		bad("runs %q, which the image does not hold (it has %v)", run.Argv[0], c.Binaries)
	}

	// The user.
	if c.NeedsRoot && !slices.Contains(c.Rootless, prog) && ctr.SecurityContext != nil {
		if u := ctr.SecurityContext.RunAsUser; u != nil && *u != 0 {
			bad("runs as user %d, but the image needs root", *u)
		}
		if n := ctr.SecurityContext.RunAsNonRoot; n != nil && *n {
			bad("sets runAsNonRoot, but the image needs root")
		}
	}

	// Env: what the chart sets, and what the image needs.
	set := map[string]bool{}
	for _, e := range ctr.Env {
		set[e.Name] = true
	}
	if strings.Contains(run.Script, DriverReadyFile) && strings.Contains(run.Script, "set -a") {
		for _, name := range DriverReadyEnv {
			set[name] = true
		}
	}
	if !c.EnvUnverified {
		chartText := strings.Join(slices.Concat(run.Argv, scripts, probeText(ctr)), "\n")
		for _, e := range ctr.Env {
			if _, ok := c.Env[e.Name]; ok {
				continue
			}
			if _, ok := RuntimeEnv[e.Name]; ok {
				continue
			}
			if strings.Contains(chartText, "$"+e.Name) || strings.Contains(chartText, "${"+e.Name) {
				continue
			}
			bad("sets env %s, which the image does not read", e.Name)
		}
		for _, name := range sortedKeys(c.Env) {
			v := c.Env[name]
			if v.Required && (len(v.Binaries) == 0 || slices.Contains(v.Binaries, prog)) && !set[name] {
				bad("does not set env %s, which %s requires", name, prog)
			}
			if v.Avoid != "" && set[name] {
				bad("sets env %s: %s", name, v.Avoid)
			}
		}
	}

	// Files and host paths.
	vols := map[string]corev1.Volume{}
	for _, v := range volumes {
		vols[v.Name] = v
	}
	for _, f := range c.ReadsFiles {
		if f.When != "" && !envTrue(ctr, f.When) {
			continue
		}
		if _, ok := mountFor(ctr, f.Path); !ok {
			bad("mounts nothing at %s, which the image reads (%s, written by %s)", f.Path, f.Format, f.From)
		}
	}
	for _, h := range c.HostPaths {
		if h.When != "" && !envTrue(ctr, h.When) || len(h.Binaries) > 0 && !slices.Contains(h.Binaries, prog) ||
			h.Subcommand != "" && !slices.Contains(run.Argv, h.Subcommand) {
			continue
		}
		m, ok := mountFor(ctr, h.Container)
		if !ok {
			bad("mounts nothing at %s, which the image needs (%s)", h.Container, h.Why)
			continue
		}
		v, ok := vols[m.Name]
		if !ok || v.HostPath == nil {
			bad("mounts %s from volume %s, not from the host (%s)", h.Container, m.Name, h.Why)
			continue
		}
		if h.Host == "" {
			continue
		}
		rest := strings.TrimPrefix(strings.TrimPrefix(h.Container, m.MountPath), "/")
		got := path.Join(v.HostPath.Path, m.SubPath, rest)
		if got != h.Host {
			bad("mounts host %s at %s, but the image needs host %s there (%s)", got, h.Container, h.Host, h.Why)
		}
	}
	return out
}

// mountFor returns the container's mount that covers a path (the deepest one).
func mountFor(ctr corev1.Container, p string) (corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	found := false
	for _, m := range ctr.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if (p == mp || strings.HasPrefix(p, mp+"/")) && (!found || len(mp) > len(strings.TrimSuffix(best.MountPath, "/"))) {
			best, found = m, true
		}
	}
	return best, found
}

func envTrue(ctr corev1.Container, name string) bool {
	for _, e := range ctr.Env {
		if e.Name == name {
			return e.Value == "true"
		}
	}
	return false
}

// probeText is the text of the container's probe and lifecycle commands: chart scripts that may read its env.
func probeText(ctr corev1.Container) []string {
	var out []string
	for _, p := range []*corev1.Probe{ctr.StartupProbe, ctr.LivenessProbe, ctr.ReadinessProbe} {
		if p != nil && p.Exec != nil {
			out = append(out, p.Exec.Command...)
		}
	}
	if l := ctr.Lifecycle; l != nil {
		for _, h := range []*corev1.LifecycleHandler{l.PostStart, l.PreStop} {
			if h != nil && h.Exec != nil {
				out = append(out, h.Exec.Command...)
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// HasProgram reports whether a container of the image ends up running the named program (base name).
func HasProgram(c Contract, ctr corev1.Container, name string) bool {
	return path.Base(c.Resolve(ctr).Program) == name
}
