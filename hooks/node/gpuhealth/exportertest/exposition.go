// Package exportertest plays the DCGM exporter of a node for the GPU health agent's tests: its /metrics with the
// chart's health profile, whose values a test sets.
//
// The exposition follows dcgm-exporter 4.5.3-4.8.2 (the newest tag the mirror holds; the chart pins
// 4.6.0-4.8.3, see tests/contracts): internal/pkg/collector/xid_collector.go and expcollector.go export
// DCGM_EXP_XID_ERRORS_COUNT per GPU as the number of times each Xid was seen within the window
// (DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE, default 5m, in the label window_size_in_ms), one series per xid label, and
// a GPU with no Xid in the window as one series valued 0 without an xid label; base_collector.go's createMetric
// gives each series gpu, UUID, pci_bus_id, device, modelName and Hostname (renamed hostname after that tag).
// The GPU list is the one read at the exporter's start, so a GPU that falls off the bus keeps its series (its
// Xid 79 is counted). gpu_health_collector.go exports DCGM_EXP_GPU_HEALTH_STATUS per health_watch with the DCGM
// health result: PASS 0, WARN 10, FAIL 20.
package exportertest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
)

// GPU is one GPU as the exporter reports it.
type GPU struct {
	UUID string
	// Xids counts each Xid within the window (the map of xid to count).
	Xids map[uint64]int
	// ECCDoubleBit is DCGM_FI_DEV_ECC_DBE_VOL_TOTAL; RowRemapFailure and RowRemapPending the row-remap gauges.
	ECCDoubleBit                     int
	RowRemapFailure, RowRemapPending bool
}

// Exposition is the text a /metrics answer of the exporter's health profile holds for gpus.
func Exposition(gpus []GPU) string {
	var b strings.Builder
	series := func(i int, g GPU, extra string, v any) string {
		return fmt.Sprintf(`{gpu="%d",UUID="%s",pci_bus_id="00000000:%02X:00.0",device="nvidia%d",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node"%s} %v`+"\n",
			i, g.UUID, 0x18+i, i, extra, v)
	}
	b.WriteString("# HELP DCGM_EXP_XID_ERRORS_COUNT Count of XID errors within the window of xid-count-window-size.\n")
	b.WriteString("# TYPE DCGM_EXP_XID_ERRORS_COUNT counter\n")
	for i, g := range gpus {
		if len(g.Xids) == 0 {
			b.WriteString("DCGM_EXP_XID_ERRORS_COUNT" + series(i, g, `,window_size_in_ms="300000"`, 0))
			continue
		}
		xids := make([]uint64, 0, len(g.Xids))
		for x := range g.Xids {
			xids = append(xids, x)
		}
		sort.Slice(xids, func(a, b int) bool { return xids[a] < xids[b] })
		for _, x := range xids {
			b.WriteString("DCGM_EXP_XID_ERRORS_COUNT" + series(i, g, fmt.Sprintf(`,window_size_in_ms="300000",xid="%d"`, x), g.Xids[x]))
		}
	}
	b.WriteString("# HELP DCGM_EXP_GPU_HEALTH_STATUS DCGM reported health status.\n# TYPE DCGM_EXP_GPU_HEALTH_STATUS counter\n")
	for i, g := range gpus {
		b.WriteString("DCGM_EXP_GPU_HEALTH_STATUS" + series(i, g, `,health_watch="MEM",health_error_code="DCGM_FR_OK"`, 0))
	}
	gauge := func(name, help string, v func(GPU) int) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for i, g := range gpus {
			b.WriteString(name + series(i, g, "", v(g)))
		}
	}
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	gauge("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", func(g GPU) int { return g.ECCDoubleBit })
	gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", func(g GPU) int { return b2i(g.RowRemapFailure) })
	gauge("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending", func(g GPU) int { return b2i(g.RowRemapPending) })
	gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", func(GPU) int { return 41 })
	return b.String()
}

// Exporter is an httptest server answering /metrics with the GPUs a test sets; Down makes it answer 503.
type Exporter struct {
	*httptest.Server
	mu   sync.Mutex
	gpus []GPU
	down bool
}

// Start serves gpus until the test closes it.
func Start(gpus ...GPU) *Exporter {
	e := &Exporter{gpus: gpus}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.down || r.URL.Path != "/metrics" {
			http.Error(w, "exporter not ready", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprint(w, Exposition(e.gpus))
	}))
	return e
}

// URL is the exporter's /metrics.
func (e *Exporter) URL() string { return e.Server.URL + "/metrics" }

// Set replaces the GPUs reported.
func (e *Exporter) Set(gpus ...GPU) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gpus = gpus
}

// Down makes the exporter fail (true) or answer again (false).
func (e *Exporter) Down(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down = down
}
