package chart

import (
	"runtime"
	"runtime/debug"
)

// The package is bound by rendering, and a render allocates a lot of short-lived template and YAML values: the
// garbage collector at Go's default pace and the allocation sampling of the memory profile (whose table of
// stacks grows with the templates' recursion) were a third of its CPU: 185 s of CPU without these two settings,
// 120 s with them, on 2 cores; its resident memory peaks under 600 MiB. To profile its memory, pass -test.memprofilerate
// with -test.memprofile.
func init() {
	debug.SetGCPercent(400)
	runtime.MemProfileRate = 0
}
