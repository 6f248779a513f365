/*
 * fakenvml.h: what the two halves of the fake libnvidia-ml.so.1 share: NVML's
 * return codes, the fake devices (a pointer to one is the opaque nvmlDevice_t
 * handle), and the devices file reader of devices.c. Nothing declared here is
 * exported from the library: only the NVML symbols of fakenvml.c are.
 */
#ifndef FAKENVML_H
#define FAKENVML_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INTERNAL __attribute__((visibility("hidden")))

/* Return codes, same values as pynvml.NVML_* */
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define MAX_DEVICES 64
#define MAX_MIG_DEVICES 256
#define DEFAULT_MAX_MIG 7
#define MAX_PROCS 32
#define MAX_NVLINKS 36       /* NVML_NVLINK_MAX_LINKS */
#define NVSWITCH (-2)        /* an NVLink's peer that is an NVSwitch, not a GPU */
#define MIB 1048576ULL
#define NA_UINT 0xFFFFFFFFu /* NVML_VALUE_NOT_AVAILABLE for unsigned int */

typedef int nvmlReturn_t;

struct fake_proc { unsigned int pid; unsigned long long used_mib; };

/* One fake GPU or MIG device. A pointer to it is the opaque nvmlDevice_t handle. */
typedef struct fake_device {
    unsigned int index;
    char uuid[96];
    char name[96];
    unsigned long long mem_total_mib, mem_used_mib;
    unsigned int util_gpu, util_mem, temp_c;
    int ecc_supported;
    unsigned long long ecc_uncorrected, ecc_corrected;
    int lost;
    int mig_supported, mig;
    int nprocs;
    struct fake_proc procs[MAX_PROCS];
    unsigned int max_mig;         /* nvmlDeviceGetMaxMigDeviceCount while MIG is on */
    /* Topology (topology.c): the PCI bus id (empty: not supported); the NUMA node (-1:
     * not supported); per NVLink index, the position of its peer (-1: inactive), with
     * nnvlinks -1 when the GPU has no NVLink; per peer position, NVML's topology level
     * (-1: not supported), npaths -1 when not given at all. */
    char bus[32];
    int numa;
    int nnvlinks;
    int nvlink_peer[MAX_NVLINKS];
    int npaths;
    int path[MAX_DEVICES];
    /* MIG devices only: */
    struct fake_device *parent;   /* the GPU it is carved from; NULL for a whole GPU */
    unsigned int slot, gi_slices, ci_slices, gi_id, ci_id;
    unsigned long long memory_size_mb;
} *nvmlDevice_t;

INTERNAL extern struct fake_device devices[MAX_DEVICES];
INTERNAL extern int ndevices;
INTERNAL extern struct fake_device migs[MAX_MIG_DEVICES];
INTERNAL extern int nmigs;
INTERNAL extern char driver_version[80];
INTERNAL extern int cuda_version;  /* encoded as 1000*major + 10*minor */

/* The guard of per-device calls (fakenvml.c): initialised, a valid handle, not lost. */
INTERNAL nvmlReturn_t check_device(nvmlDevice_t d);

/* Read $FAKE_NVML_DEVICES (devices.c). A missing variable or file means "no GPUs". */
INTERNAL void load_devices(void);
/* With $FAKE_NVML_WATCH=1: read the file again if it changed since the last read. */
INTERNAL void reload_if_changed(void);

#endif
