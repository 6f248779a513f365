/*
 * topology.c: how the fake GPUs are linked, for the NVML calls that read it
 * (the keys bus, numa, nvlinks and paths of devices.c). MIG devices have no
 * links: these calls answer NVML_ERROR_NOT_SUPPORTED on a MIG handle.
 */
#include "fakenvml.h"

/* nvmlPciInfo_t: must match the ctypes Structure in pynvml.py (68 bytes). */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef char check_pci[sizeof(nvmlPciInfo_t) == 68 ? 1 : -1];

#define GUARD_WHOLE(d) do { nvmlReturn_t r_ = check_device(d); if (r_) return r_; \
    if ((d)->parent) return NVML_ERROR_NOT_SUPPORTED; } while (0)

static void fill_pci(const struct fake_device *d, nvmlPciInfo_t *p)
{
    memset(p, 0, sizeof *p);
    memcpy(p->busId, d->bus, sizeof p->busId - 1);  /* both 32 bytes, d->bus NUL-terminated */
    memcpy(p->busIdLegacy, d->bus, sizeof p->busIdLegacy - 1);  /* the first 15: as old drivers cut it */
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    GUARD_WHOLE(d);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->bus[0])
        return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(d, p);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level)
{
    GUARD_WHOLE(a);
    GUARD_WHOLE(b);
    if (!level || a == b)
        return NVML_ERROR_INVALID_ARGUMENT;
    int peer = (int)(b - devices);
    if (peer >= a->npaths || a->path[peer] < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *level = a->path[peer];
    return NVML_SUCCESS;
}

/* A GPU without NVLink: NOT_SUPPORTED; a link index past its last: INVALID_ARGUMENT. */
static nvmlReturn_t check_link(nvmlDevice_t d, unsigned int link)
{
    if (d->nnvlinks < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)d->nnvlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active)
{
    GUARD_WHOLE(d);
    nvmlReturn_t r = check_link(d, link);
    if (r)
        return r;
    if (!active)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = d->nvlink_peer[link] != -1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *p)
{
    GUARD_WHOLE(d);
    nvmlReturn_t r = check_link(d, link);
    if (r)
        return r;
    int peer = d->nvlink_peer[link];
    if (!p || peer == -1 || peer >= ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (peer == NVSWITCH) {
        static const struct fake_device nvswitch = {.bus = "00000000:FF:00.0"};
        fill_pci(&nvswitch, p);
    } else {
        fill_pci(&devices[peer], p);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node)
{
    GUARD_WHOLE(d);
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (d->numa < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)d->numa;
    return NVML_SUCCESS;
}
