/*
 * devices.c: the fake GPUs, from the text file named by $FAKE_NVML_DEVICES.
 * One record per line, whitespace-separated key=value pairs; '#' starts a comment:
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
 * How a GPU is linked (topology.c), on its own line:
 *
 *   bus=00000000:07:00.0 numa=0 nvlinks=3,3,1,2,-,- paths=na,10,30,30,50,50,50,50
 *
 * bus is its PCI bus id; numa its NUMA node; nvlinks, per NVLink index, the
 * position (file order) of the GPU at its other end ('s': an NVSwitch), '-' for
 * an inactive link;
 * paths, per position, NVML's topology level to that GPU (0 same board, 10 one
 * switch, 20 several, 30 host bridge, 40 same CPU, 50 across CPUs; na: not
 * supported). Any of them absent: that call answers NVML_ERROR_NOT_SUPPORTED
 * (no nvlinks: the GPU has no NVLink).
 *
 * slot is its index for nvmlDeviceGetMigDeviceHandleByIndex; slots without a
 * line answer NVML_ERROR_NOT_FOUND, like the gaps real drivers leave when MIG
 * devices are destroyed. gi_slices / ci_slices / memory_size_mb are what
 * nvmlDeviceGetAttributes returns.
 */
#include "fakenvml.h"

struct fake_device devices[MAX_DEVICES];
int ndevices;
struct fake_device migs[MAX_MIG_DEVICES];
int nmigs;
char driver_version[80] = "550.54.15";
int cuda_version = 12040;  /* 12.4 */

/* Copy a value, turning '_' into ' ' (values cannot contain whitespace). */
static void copy_value(char *dst, size_t size, const char *src)
{
    size_t i;
    for (i = 0; i + 1 < size && src[i]; i++)
        dst[i] = src[i] == '_' ? ' ' : src[i];
    dst[i] = '\0';
}

/* "a,b,-,c" -> out[] (-1 for '-' or "na"); returns how many were given */
static int parse_positions(int *out, int most, const char *v)
{
    int n = 0;
    while (*v && n < most) {
        char *end;
        if (*v == '-' || !strncmp(v, "na", 2)) {
            out[n++] = -1;
            end = (char *)v + (*v == '-' ? 1 : 2);
        } else if (*v == 's') {  /* an NVSwitch at the other end */
            out[n++] = NVSWITCH;
            end = (char *)v + 1;
        } else {
            out[n++] = (int)strtol(v, &end, 10);
        }
        if (*end != ',')
            break;
        v = end + 1;
    }
    return n;
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
    else if (!strcmp(k, "bus")) copy_value(d->bus, sizeof d->bus, v);
    else if (!strcmp(k, "numa")) d->numa = na ? -1 : atoi(v);
    else if (!strcmp(k, "nvlinks")) d->nnvlinks = parse_positions(d->nvlink_peer, MAX_NVLINKS, v);
    else if (!strcmp(k, "paths")) d->npaths = parse_positions(d->path, MAX_DEVICES, v);
    /* unknown keys are ignored so the file format can grow */
}

/* When the devices file was last read: with $FAKE_NVML_WATCH=1 a changed file is
 * read again, so a test can change a GPU's state (ECC errors, heat, lost) while a
 * process keeps NVML open, as a real GPU's state changes under a running agent. */
static struct timespec loaded_mtime;
static off_t loaded_size = -1;

void load_devices(void)
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
        d.numa = d.nnvlinks = d.npaths = -1;
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

void reload_if_changed(void)
{
    const char *watch = getenv("FAKE_NVML_WATCH"), *path = getenv("FAKE_NVML_DEVICES");
    struct stat st;
    if (!watch || strcmp(watch, "1") != 0 || !path || stat(path, &st) != 0)
        return;
    if (st.st_size != loaded_size || st.st_mtim.tv_sec != loaded_mtime.tv_sec ||
        st.st_mtim.tv_nsec != loaded_mtime.tv_nsec)
        load_devices();  /* handles point into the arrays: they stay valid by position */
}
