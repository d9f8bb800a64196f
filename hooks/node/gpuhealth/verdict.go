package gpuhealth

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Reasons of the condition.
const (
	ReasonHealthy         = "GPUsHealthy"
	ReasonFatalXid        = "FatalXid"
	ReasonECCDoubleBit    = "ECCDoubleBitError"
	ReasonRowRemapFailure = "RowRemapFailure"
	ReasonRowRemapPending = "RowRemapPending"
	ReasonGPULost         = "GPULost"
	ReasonGPUUnavailable  = "GPUUnavailable"
	// The agent cannot see the GPUs: Unknown, never a guess of healthy.
	ReasonNVMLNotBuiltIn = "NVMLNotBuiltIn"
	ReasonNVMLNotFound   = "NVMLNotFound"
	ReasonNVMLFailed     = "NVMLFailed"
	// The DCGM exporter source: no answer (or no parsable one) for longer than the agent's bound, or an answer
	// without the Xid count.
	ReasonExporterUnreachable = "DCGMExporterUnreachable"
	ReasonExporterIncomplete  = "DCGMExporterMetricsMissing"
)

// Fault is one reason a GPU is unhealthy.
type Fault struct {
	// GPU names the GPU: its index and UUID as NVML gives them.
	GPU string
	// Reason is one of the Reason* constants; Xid is set for ReasonFatalXid.
	Reason string
	Xid    uint64
	// Detail is NVML's own word, where there is one.
	Detail string
}

func (f Fault) String() string {
	s := f.GPU + ": "
	switch f.Reason {
	case ReasonFatalXid:
		s += fmt.Sprintf("Xid %d (fatal in the health policy: reset the GPU or reboot the node)", f.Xid)
	case ReasonECCDoubleBit:
		s += "uncorrectable (double-bit) ECC error"
	case ReasonRowRemapFailure:
		s += "row remapping failed (no spare rows left)"
	case ReasonRowRemapPending:
		s += "a row remap is pending until the GPU is reset"
	case ReasonGPULost:
		s += "the GPU fell off the bus"
	default:
		s += f.Reason
	}
	if f.Detail != "" {
		s += " (" + f.Detail + ")"
	}
	return s
}

// Verdict is what the condition says.
type Verdict struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

func (v Verdict) String() string { return fmt.Sprintf("%s %s: %s", v.Status, v.Reason, v.Message) }

// Judge turns a probe's or a watch's findings into the verdict: False naming every fault (the first one's reason),
// True when there is none.
func Judge(gpus int, faults []Fault) Verdict {
	if len(faults) == 0 {
		return Verdict{Status: corev1.ConditionTrue, Reason: ReasonHealthy, Message: fmt.Sprintf("all %d GPUs healthy", gpus)}
	}
	parts := make([]string, len(faults))
	for i, f := range faults {
		parts[i] = f.String()
	}
	return Verdict{Status: corev1.ConditionFalse, Reason: faults[0].Reason, Message: strings.Join(parts, "; ")}
}

// Unknown is the verdict when the agent cannot look: it never reports a GPU it did not see as healthy.
func Unknown(reason string, err error) Verdict {
	return Verdict{Status: corev1.ConditionUnknown, Reason: reason, Message: "GPU health cannot be read: " + err.Error()}
}
