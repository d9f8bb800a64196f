package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-gpu-stack/kube-gpu-stack/hooks/node/hostfs"
)

// NVMLLibrary is the library the agent loads from the driver's root.
const NVMLLibrary = "libnvidia-ml.so.1"

// ErrNVMLNotBuiltIn is what a static build (CGO_ENABLED=0, the project's image) returns: go-nvml needs cgo to load
// NVML, so such a build cannot watch the GPUs and says so on the Node (Unknown), never guessing healthy.
var ErrNVMLNotBuiltIn = errors.New("NVML not built in: this validator is a static build (CGO_ENABLED=0), which cannot load libnvidia-ml; run a cgo build of the validator to watch GPU health")

// Monitor watches the node's GPUs: it probes every GPU afresh and reports the verdict, then reports again each
// time an event changes it, until ctx ends (nil) or NVML fails (the error).
type Monitor interface {
	Watch(ctx context.Context, lib string, p Policy, logf func(string, ...any), report func(Verdict) error) error
}

// Options configure the agent.
type Options struct {
	// NodeName is the Node written; Client the API.
	NodeName string
	Client   kubernetes.Interface
	Policy   Policy
	// HostRoot and DriverInstallDir are searched, in that order, for NVML: a host driver, else the driver
	// container's (defaults /host and /run/nvidia/driver).
	HostRoot, DriverInstallDir string
	// Monitor defaults to the build's own: go-nvml with cgo, ErrNVMLNotBuiltIn without.
	Monitor Monitor

	// Source is where the agent reads the GPUs: SourceNVML, SourceDCGMExporter, or SourceAuto (the default):
	// NVML in a cgo build, the DCGM exporter in a static one (when ExporterURL is set).
	Source string
	// ExporterURL is the /metrics of the DCGM exporter on this node (the chart's node-local Service).
	ExporterURL string
	// ScrapeInterval (default 15s) and ScrapeTimeout (default 10s) pace the exporter's scrapes; StaleAfter (default
	// 2m) is how long failed scrapes keep the last verdict before it turns Unknown.
	ScrapeInterval, ScrapeTimeout, StaleAfter time.Duration

	// static: Monitor is a static build's, which cannot load NVML wherever the library is.
	static bool
}

// Complete fills defaults.
func (o *Options) Complete() {
	if o.HostRoot == "" {
		o.HostRoot = "/host"
	}
	if o.DriverInstallDir == "" {
		o.DriverInstallDir = "/run/nvidia/driver"
	}
	if o.Policy.ConditionType == "" {
		o.Policy.ConditionType = DefaultConditionType
	}
	if o.Monitor == nil {
		o.Monitor, o.static = defaultMonitor(), staticBuild
	}
	if o.Source == "" {
		o.Source = SourceAuto
	}
	if o.Source == SourceAuto && o.static && o.ExporterURL != "" {
		o.Source = SourceDCGMExporter
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = 15 * time.Second
	}
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = 10 * time.Second
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = 2 * time.Minute
	}
}

// Sources of the agent (global.health.nodeCondition.source).
const (
	SourceAuto         = "auto"
	SourceNVML         = "nvml"
	SourceDCGMExporter = "dcgm-exporter"
)

// Validate names what is missing.
func (o *Options) Validate() error {
	if o.NodeName == "" {
		return errors.New("NODE_NAME is required: the agent writes its node's condition")
	}
	if o.Client == nil {
		return errors.New("no API client")
	}
	switch o.Source {
	case SourceAuto, SourceNVML:
	case SourceDCGMExporter:
		if o.ExporterURL == "" {
			return errors.New("the dcgm-exporter source needs the exporter's URL (HEALTH_DCGM_EXPORTER_URL)")
		}
	default:
		return fmt.Errorf("unknown source %q (want %s, %s or %s)", o.Source, SourceAuto, SourceNVML, SourceDCGMExporter)
	}
	return o.Policy.Validate()
}

// Run reports the GPUs' health on the Node until ctx ends. When it cannot watch (no NVML library, a static build,
// NVML failing) it sets the condition Unknown and returns the error, so the pod restarts and probes afresh.
func (o *Options) Run(ctx context.Context, out io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(out, "health: "+format+"\n", args...) }
	rep := &maintenanceGate{rep: Reporter{Client: o.Client, NodeName: o.NodeName, Policy: o.Policy}, logf: logf}
	if err := rep.watchNode(ctx, o); err != nil {
		return err
	}
	fail := func(reason string, err error) error {
		v := Unknown(reason, err)
		logf("node %s: %s", o.NodeName, v)
		if rerr := rep.Report(ctx, v); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	if o.Source == SourceDCGMExporter {
		w := exporterWatch{o: o, rep: rep, logf: logf, http: &http.Client{}}
		logf("node %s: reading GPU health from the DCGM exporter at %s every %s", o.NodeName, o.ExporterURL, o.ScrapeInterval)
		if err := w.run(ctx); err != nil && ctx.Err() == nil {
			return err
		}
		return nil
	}
	if o.static { // said first: finding the library would not help
		return fail(ReasonNVMLNotBuiltIn, ErrNVMLNotBuiltIn)
	}
	lib, err := o.findLibrary()
	if err != nil {
		return fail(ReasonNVMLNotFound, err)
	}
	err = o.Monitor.Watch(ctx, lib, o.Policy, logf, func(v Verdict) error {
		logf("node %s: %s", o.NodeName, v)
		return rep.Report(ctx, v)
	})
	switch {
	case ctx.Err() != nil: // stopped: the condition stays as the last verdict left it
		return nil
	case errors.Is(err, ErrNVMLNotBuiltIn):
		return fail(ReasonNVMLNotBuiltIn, err)
	case err != nil:
		return fail(ReasonNVMLFailed, err)
	}
	return nil
}

func (o *Options) findLibrary() (string, error) {
	var errs []error
	for _, root := range []string{o.HostRoot, o.DriverInstallDir} {
		lib, err := hostfs.Root(root).FindLibrary(NVMLLibrary)
		if err == nil {
			return lib, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no %s under the host root or the driver container's root: %w", NVMLLibrary, errors.Join(errs...))
}
