// Command simnvml is a simulated NVML: built with -buildmode=c-shared as libnvidia-ml.so.1 (package build), it
// answers NVML's C API for the GPUs a config describes (package config: the file $SIMNVML_CONFIG names, else one
// embedded in the library's file, else simnvml.json beside it), so that the real programs that load NVML through
// go-nvml (the device plugin, GPU feature discovery, nvidia-ctk's CDI generation, this repository's validator
// and health agent) run on a node without a GPU. SIMNVML_TRACE set names every call on stderr.
//
// The functions those programs call are implemented in nvml.go; every other function nvml.h declares is a stub
// (stubs_gen.c, generated from go-nvml's nvml.h) that returns NVML_ERROR_NOT_SUPPORTED, so no call can reach a
// missing symbol, which would kill the caller.
package main

//go:generate go run ./internal/gen -o stubs_gen.c

func main() {}
