package chart

import (
	"runtime"
	"runtime/debug"
)

// The package is bound by rendering, and a render allocates a lot of short-lived template and YAML values: the
// garbage collector at Go's default pace and the allocation sampling of the memory profile (whose table of
// stacks grows with the templates' recursion) were a fifth of its CPU. A heap four times the live one is a few
// hundred MiB here. To profile its memory, pass -test.memprofilerate with -test.memprofile.
func init() {
	debug.SetGCPercent(400)
	runtime.MemProfileRate = 0
}
