/*
 * fakenvml.c: a fake libnvidia-ml.so.1 for tests on machines without a GPU.
 *
 * The real official Python bindings (nvidia-ml-py, module pynvml) dlopen
 * "libnvidia-ml.so.1" and call these symbols through ctypes, so this library
 * only has to match NVML's C ABI: names, argument order, struct layouts and
 * return codes (taken from pynvml.py). Anything not exported here makes the
 * bindings raise NVMLError_FunctionNotFound, which is the honest answer.
 *
 * Devices come from the text file named by $FAKE_NVML_DEVICES. One record per
 * line, whitespace-separated key=value pairs; '#' starts a comment:
 *
 *   driver=550.54.15 cuda=12040                      (optional system line)
 *   index=0 uuid=GPU-... name=NVIDIA_A100 memory_total_mib=81920
 *     memory_used_mib=1024 util_gpu=37 util_mem=5 temp_c=41
 *     ecc_uncorrected=0 lost=0 mig=1 procs=1234:512,99:256
 *
 * (one line per device; shown wrapped here). In values '_' stands for a space
 * (names like "NVIDIA GeForce GTX 1070"). ecc_uncorrected / mig absent or "na"
 * means NVML_ERROR_NOT_SUPPORTED, like a GeForce card. Devices are handed out
 * in file order. A device with lost=1 answers NVML_ERROR_GPU_IS_LOST to every
 * per-device query. max_mig=N sets what nvmlDeviceGetMaxMigDeviceCount says
 * while MIG is on (default 7, as on an A100).
 *
 * A line with parent=P is a MIG device of the P-th device line (0-based, file
 * order; it must come after that line):
 *
 *   parent=6 slot=0 uuid=MIG-... name=NVIDIA_A100_80GB_PCIe_MIG_1g.10gb
 *     memory_total_mib=9728 memory_used_mib=0 gi_slices=1 ci_slices=1
 *     memory_size_mb=9856 gi_id=13 ci_id=0
 *
 * slot is its index for nvmlDeviceGetMigDeviceHandleByIndex; slots without a
 * line answer NVML_ERROR_NOT_FOUND, like the gaps real drivers leave when MIG
 * devices are destroyed. gi_slices / ci_slices / memory_size_mb are what
 * nvmlDeviceGetAttributes returns. Queries that only make sense for a whole
 * GPU (utilisation, temperature, ECC, processes, MIG mode) answer
 * NVML_ERROR_NOT_SUPPORTED on a MIG handle, and MIG-only queries answer it on
 * a whole GPU's handle.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
#define MIB 1048576ULL
#define NA_UINT 0xFFFFFFFFu /* NVML_VALUE_NOT_AVAILABLE for unsigned int */

typedef int nvmlReturn_t;

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
    /* MIG devices only: */
    struct fake_device *parent;   /* the GPU it is carved from; NULL for a whole GPU */
    unsigned int slot, gi_slices, ci_slices, gi_id, ci_id;
    unsigned long long memory_size_mb;
} *nvmlDevice_t;

static struct fake_device devices[MAX_DEVICES];
static int ndevices;
static struct fake_device migs[MAX_MIG_DEVICES];
static int nmigs;
static int init_count;            /* NVML is reference counted: init/shutdown pairs */
static int count_calls;           /* for $FAKE_NVML_FAIL_ON_COUNT / _LOSE_ON_COUNT */
static int broken;                /* every call fails until the next fresh init */
static char driver_version[80] = "550.54.15";
static int cuda_version = 12040;  /* 12.4, encoded as 1000*major + 10*minor */

/* Copy a value, turning '_' into ' ' (values cannot contain whitespace). */
static void copy_value(char *dst, size_t size, const char *src)
{
    size_t i;
    for (i = 0; i + 1 < size && src[i]; i++)
        dst[i] = src[i] == '_' ? ' ' : src[i];
    dst[i] = '\0';
}

/* "pid:mib,pid:mib" -> procs */
static void parse_procs(struct fake_device *d, const char *v)
{
    while (*v && d->nprocs < MAX_PROCS) {
        char *end;
        unsigned long pid = strtoul(v, &end, 10);
        if (*end != ':')
            break;
        d->procs[d->nprocs].pid = (unsigned int)pid;
        d->procs[d->nprocs].used_mib = strtoull(end + 1, &end, 10);
        d->nprocs++;
        v = *end == ',' ? end + 1 : end;
    }
}

enum record { NONE, DEVICE, MIG };

static void set_key(struct fake_device *d, enum record *kind, int *parent, const char *k, const char *v)
{
    int na = strcmp(v, "na") == 0;
    if (!strcmp(k, "driver")) copy_value(driver_version, sizeof driver_version, v);
    else if (!strcmp(k, "cuda")) cuda_version = atoi(v);
    else if (!strcmp(k, "index")) { d->index = (unsigned int)atoi(v); *kind = DEVICE; }
    else if (!strcmp(k, "parent")) { *parent = atoi(v); *kind = MIG; }
    else if (!strcmp(k, "slot")) d->slot = (unsigned int)atoi(v);
    else if (!strcmp(k, "max_mig")) d->max_mig = (unsigned int)atoi(v);
    else if (!strcmp(k, "gi_slices")) d->gi_slices = (unsigned int)atoi(v);
    else if (!strcmp(k, "ci_slices")) d->ci_slices = (unsigned int)atoi(v);
    else if (!strcmp(k, "gi_id")) d->gi_id = (unsigned int)atoi(v);
    else if (!strcmp(k, "ci_id")) d->ci_id = (unsigned int)atoi(v);
    else if (!strcmp(k, "memory_size_mb")) d->memory_size_mb = strtoull(v, NULL, 10);
    else if (!strcmp(k, "uuid")) copy_value(d->uuid, sizeof d->uuid, v);
    else if (!strcmp(k, "name")) copy_value(d->name, sizeof d->name, v);
    else if (!strcmp(k, "memory_total_mib")) d->mem_total_mib = strtoull(v, NULL, 10);
    else if (!strcmp(k, "memory_used_mib")) d->mem_used_mib = strtoull(v, NULL, 10);
    else if (!strcmp(k, "util_gpu")) d->util_gpu = (unsigned int)atoi(v);
    else if (!strcmp(k, "util_mem")) d->util_mem = (unsigned int)atoi(v);
    else if (!strcmp(k, "temp_c")) d->temp_c = (unsigned int)atoi(v);
    else if (!strcmp(k, "ecc_uncorrected")) { d->ecc_supported = !na; d->ecc_uncorrected = na ? 0 : strtoull(v, NULL, 10); }
    else if (!strcmp(k, "ecc_corrected")) d->ecc_corrected = strtoull(v, NULL, 10);
    else if (!strcmp(k, "lost")) d->lost = atoi(v) != 0;
    else if (!strcmp(k, "mig")) { d->mig_supported = !na; d->mig = na ? 0 : atoi(v) != 0; }
    else if (!strcmp(k, "procs")) parse_procs(d, v);
    /* unknown keys are ignored so the file format can grow */
}

/* When the devices file was last read: with $FAKE_NVML_WATCH=1 a changed file is
 * read again, so a test can change a GPU's state (ECC errors, heat, lost) while a
 * process keeps NVML open, as a real GPU's state changes under a running agent. */
static struct timespec loaded_mtime;
static off_t loaded_size = -1;

/* Read $FAKE_NVML_DEVICES. A missing variable or file means "no GPUs". */
static void load_devices(void)
{
    const char *path = getenv("FAKE_NVML_DEVICES");
    char line[4096];
    struct stat st;
    FILE *f;

    ndevices = 0;
    nmigs = 0;
    loaded_size = -1;
    if (!path || !(f = fopen(path, "r")))
        return;
    if (fstat(fileno(f), &st) == 0) {
        loaded_mtime = st.st_mtim;
        loaded_size = st.st_size;
    }
    while (fgets(line, sizeof line, f)) {
        struct fake_device d;
        enum record kind = NONE;
        int parent = -1;
        char *save = NULL, *tok;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        memset(&d, 0, sizeof d);
        d.max_mig = DEFAULT_MAX_MIG;
        for (tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq)
                continue;
            *eq = '\0';
            set_key(&d, &kind, &parent, tok, eq + 1);
        }
        if (kind == DEVICE && ndevices < MAX_DEVICES) {
            devices[ndevices++] = d;
        } else if (kind == MIG && parent >= 0 && parent < ndevices && nmigs < MAX_MIG_DEVICES) {
            d.parent = &devices[parent];
            migs[nmigs++] = d;
        }
    }
    fclose(f);
}

static void reload_if_changed(void)
{
    const char *watch = getenv("FAKE_NVML_WATCH"), *path = getenv("FAKE_NVML_DEVICES");
    struct stat st;
    if (!watch || strcmp(watch, "1") != 0 || !path || stat(path, &st) != 0)
        return;
    if (st.st_size != loaded_size || st.st_mtim.tv_sec != loaded_mtime.tv_sec ||
        st.st_mtim.tv_nsec != loaded_mtime.tv_nsec)
        load_devices();  /* handles point into the arrays: they stay valid by position */
}

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
static nvmlReturn_t check_device(nvmlDevice_t d)
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
