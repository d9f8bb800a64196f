// The part of NVML's C API (nvml.h, as go-nvml ships it) that the implemented functions use: their handle,
// struct and enum types, the return codes and constants. Hand-written, not copied whole: the layouts are checked
// against go-nvml's Go types (cgo-generated from the real header) by build's TestStructLayouts.
#ifndef SIMNVML_NVML_TYPES_H
#define SIMNVML_NVML_TYPES_H

typedef enum nvmlReturn_enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

// Handles are pointers the library allocates and owns; callers only compare and pass them back.
typedef struct nvmlDevice_st {
	unsigned int index;
} *nvmlDevice_t;

typedef struct nvmlEventSet_st {
	unsigned int id;
} *nvmlEventSet_t;

typedef struct nvmlPciInfo_st {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct nvmlMemory_st {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;

// NVML_STRUCT_VERSION(Memory, 2)
#define SIMNVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2U << 24U)))

typedef unsigned int nvmlDeviceArchitecture_t;
typedef int nvmlBrandType_t;
typedef int nvmlGpuTopologyLevel_t;

// simnvml_not_supported is what every generated stub returns through: NVML_ERROR_NOT_SUPPORTED, naming the
// function on stderr when SIMNVML_TRACE is set.
nvmlReturn_t simnvml_not_supported(const char *function);

// simnvml_library_path is the path this library was loaded from (dladdr), or NULL.
const char *simnvml_library_path(void);

#endif
