//go:build cgo

// C helpers that run without entering Go: the stubs' common return, and the library's own path.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "nvml_types.h"

nvmlReturn_t simnvml_not_supported(const char *function) {
	const char *trace = getenv("SIMNVML_TRACE");
	if (trace != NULL && trace[0] != '\0') {
		fprintf(stderr, "simnvml: %s: not implemented: NVML_ERROR_NOT_SUPPORTED\n", function);
	}
	return NVML_ERROR_NOT_SUPPORTED;
}

// The library is mounted into containers under other roots, so its configuration is looked up beside it, wherever
// that is in the caller's filesystem.
const char *simnvml_library_path(void) {
	Dl_info info;
	if (dladdr((void *)simnvml_library_path, &info) == 0 || info.dli_fname == NULL) {
		return NULL;
	}
	return info.dli_fname;
}
