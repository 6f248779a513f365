/*
 * fakenvml.c: a fake libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * The real official Python bindings (nvidia-ml-py, module pynvml) dlopen
 * "libnvidia-ml.so.1" and call these symbols through ctypes, so this library
 * only has to match NVML's C ABI: names, argument order, struct layouts and
 * return codes (taken from pynvml.py). Anything not exported here makes the
 * bindings raise NVMLError_FunctionNotFound, which is the honest answer.
 *
 * Devices come from the text file named by $FAKE_NVML_DEVICES (its format and
 * reader: devices.c). Queries that only make sense for a whole GPU (utilisation,
 * temperature, ECC, processes, MIG mode) answer NVML_ERROR_NOT_SUPPORTED on a
 * MIG handle, and MIG-only queries answer it on a whole GPU's handle.
 *
 * Environment: $FAKE_NVML_NO_DRIVER=1 makes init fail with
 * NVML_ERROR_DRIVER_NOT_LOADED, like a node whose kernel module is missing.
 * $FAKE_NVML_FAIL_ON_COUNT=K makes the K-th nvmlDeviceGetCount of the process
 * fail with NVML_ERROR_UNKNOWN and every later call fail too, until NVML is
 * shut down and initialised again (a driver that went away under a running
 * agent). $FAKE_NVML_LOSE_ON_COUNT=K:P makes the device at position P (file
 * order) lost from the K-th nvmlDeviceGetCount on (a GPU falling off the bus).
 * $FAKE_NVML_WATCH=1 reads the devices file again whenever it changes, while NVML
 * stays initialised (live readings for a long-running agent).
 * $FAKE_NVML_CALL_LOG=FILE appends "init" / "shutdown" to FILE on
 * each successful nvmlInit / nvmlShutdown, so tests can see how often the
 * caller initialises.
 */
#include "fakenvml.h"

/* Struct layouts: must match the ctypes Structures in pynvml.py. */
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;        /* 24 bytes */
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;                                                             /* 40 bytes */
#define NVML_MEMORY_V2_VERSION 0x02000028u
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;                                                      /* 40 bytes */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;                                                           /* 24 bytes */

/* Compile-time checks so a layout slip fails the build, not a test. */
typedef char check_mem[sizeof(nvmlMemory_t) == 24 ? 1 : -1];
typedef char check_mem2[sizeof(nvmlMemory_v2_t) == 40 ? 1 : -1];
typedef char check_proc[sizeof(nvmlProcessInfo_t) == 24 ? 1 : -1];
typedef char check_attrs[sizeof(nvmlDeviceAttributes_t) == 40 ? 1 : -1];

static int init_count;            /* NVML is reference counted: init/shutdown pairs */
static int count_calls;           /* for $FAKE_NVML_FAIL_ON_COUNT / _LOSE_ON_COUNT */
static int broken;                /* every call fails until the next fresh init */

/* Guard for calls that need no device. */
static nvmlReturn_t check_init(void)
{
    if (init_count <= 0)
        return NVML_ERROR_UNINITIALIZED;
    reload_if_changed();
    if (broken)
        return NVML_ERROR_UNKNOWN;
    return NVML_SUCCESS;
}

#define GUARD_INIT() do { nvmlReturn_t r_ = check_init(); if (r_) return r_; } while (0)

/* Common guard for per-device calls: initialized, valid handle (GPU or MIG
 * device), not lost (a MIG device is lost with its GPU). */
nvmlReturn_t check_device(nvmlDevice_t d)
{
    nvmlReturn_t r = check_init();
    if (r)
        return r;
    if ((d < devices || d >= devices + ndevices) && (d < migs || d >= migs + nmigs))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost || (d->parent && d->parent->lost))
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define GUARD(d) do { nvmlReturn_t r_ = check_device(d); if (r_) return r_; } while (0)
/* Calls for a whole GPU only / for a MIG device only. */
#define GUARD_GPU(d) do { GUARD(d); if ((d)->parent) return NVML_ERROR_NOT_SUPPORTED; } while (0)
#define GUARD_MIG(d) do { GUARD(d); if (!(d)->parent) return NVML_ERROR_NOT_SUPPORTED; } while (0)

static void log_call(const char *what)
{
    const char *path = getenv("FAKE_NVML_CALL_LOG");
    FILE *f;
    if (path && *path && (f = fopen(path, "a"))) {
        fprintf(f, "%s\n", what);
        fclose(f);
    }
}

/* ---- init / shutdown ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    const char *nd = getenv("FAKE_NVML_NO_DRIVER");
    (void)flags;
    if (nd && strcmp(nd, "1") == 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (init_count++ == 0) {
        broken = 0;
        load_devices();
    }
    log_call("init");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (init_count <= 0)
        return NVML_ERROR_UNINITIALIZED;
    init_count--;
    log_call("shutdown");
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

/* ---- system ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    GUARD_INIT();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(driver_version) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return NVML_SUCCESS;
}

/* The CUDA driver version works without init in real NVML; same here. */
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    const char *fail_on = getenv("FAKE_NVML_FAIL_ON_COUNT");
    const char *lose_on = getenv("FAKE_NVML_LOSE_ON_COUNT");
    int position;
    GUARD_INIT();
    count_calls++;
    if (fail_on && count_calls == atoi(fail_on)) {
        broken = 1;
        return NVML_ERROR_UNKNOWN;
    }
    if (lose_on && count_calls == atoi(lose_on) && strchr(lose_on, ':')) {
        position = atoi(strchr(lose_on, ':') + 1);
        if (position >= 0 && position < ndevices)
            devices[position].lost = 1;
    }
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)ndevices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

/* Handles of lost GPUs are still handed out; queries on them then fail. */
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    GUARD_INIT();
    if (!device || index >= (unsigned int)ndevices) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dst, src);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
    GUARD(d);
    return copy_string(name, length, d->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
    GUARD(d);
    return copy_string(uuid, length, d->uuid);
}

/* The many calls that hand back one unsigned int of a device. */
#define UINT_QUERY(name, guard, value)                                  \
    nvmlReturn_t name(nvmlDevice_t d, unsigned int *out)                \
    {                                                                   \
        guard(d);                                                       \
        if (!out) return NVML_ERROR_INVALID_ARGUMENT;                   \
        *out = (value);                                                 \
        return NVML_SUCCESS;                                            \
    }

UINT_QUERY(nvmlDeviceGetIndex, GUARD_GPU, d->index)

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    GUARD(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->mem_total_mib * MIB;
    m->used = d->mem_used_mib * MIB;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

/* The v2 struct carries a version word the caller must set; a wrong one is an error. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    GUARD(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != NVML_MEMORY_V2_VERSION) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = d->mem_total_mib * MIB;
    m->reserved = 0;
    m->used = d->mem_used_mib * MIB;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    GUARD_GPU(d);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = d->util_gpu;
    u->memory = d->util_mem;
    return NVML_SUCCESS;
}

/* Only NVML_TEMPERATURE_GPU (0) exists. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp)
{
    GUARD_GPU(d);
    if (!temp || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temp_c;
    return NVML_SUCCESS;
}

/* errorType 0 = corrected, 1 = uncorrected; counterType 0 = volatile, 1 = aggregate
 * (both report the same count here). */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType,
                                         unsigned long long *count)
{
    GUARD_GPU(d);
    if (!count || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->ecc_supported) return NVML_ERROR_NOT_SUPPORTED;
    *count = errorType == 1 ? d->ecc_uncorrected : d->ecc_corrected;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: with too small a buffer, report the needed count and
 * NVML_ERROR_INSUFFICIENT_SIZE; with no processes, SUCCESS and count 0. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos)
{
    int i;
    GUARD_GPU(d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < (unsigned int)d->nprocs || (d->nprocs && !infos)) {
        *count = (unsigned int)d->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (i = 0; i < d->nprocs; i++) {
        infos[i].pid = d->procs[i].pid;
        infos[i].usedGpuMemory = d->procs[i].used_mib * MIB;
        infos[i].gpuInstanceId = NA_UINT;
        infos[i].computeInstanceId = NA_UINT;
    }
    *count = (unsigned int)d->nprocs;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    GUARD_GPU(d);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_supported) return NVML_ERROR_NOT_SUPPORTED;
    *current = (unsigned int)d->mig;
    *pending = (unsigned int)d->mig;
    return NVML_SUCCESS;
}

/* ---- MIG ---- */

/* Zero while MIG is off or unsupported, as the NVML docs say. */
UINT_QUERY(nvmlDeviceGetMaxMigDeviceCount, GUARD_GPU, d->mig_supported && d->mig ? d->max_mig : 0)
UINT_QUERY(nvmlDeviceIsMigDeviceHandle, GUARD, d->parent != NULL)
UINT_QUERY(nvmlDeviceGetGpuInstanceId, GUARD_MIG, d->gi_id)
UINT_QUERY(nvmlDeviceGetComputeInstanceId, GUARD_MIG, d->ci_id)

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig)
{
    int i;
    GUARD_GPU(d);
    if (!d->mig_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (!mig || !d->mig || index >= d->max_mig) return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < nmigs; i++) {
        if (migs[i].parent == d && migs[i].slot == index) {
            *mig = &migs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *gpu)
{
    GUARD_MIG(d);
    if (!gpu) return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = d->parent;
    return NVML_SUCCESS;
}

/* Real drivers answer this for whole GPUs too; the fake only knows MIG devices. */
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    GUARD_MIG(d);
    if (!a) return NVML_ERROR_INVALID_ARGUMENT;
    memset(a, 0, sizeof *a);
    a->gpuInstanceSliceCount = d->gi_slices;
    a->computeInstanceSliceCount = d->ci_slices;
    a->memorySizeMB = d->memory_size_mb;
    return NVML_SUCCESS;
}
