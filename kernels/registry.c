/* The registry of kernels backends: a device name -> the function that returns its table. The only place
 * where a device's name chooses anything; what a backend can do is in its table. */
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "common/gpu_module.h"
#include "kernels/kernels.h"

/* The CUDA table lives in the GPU module, loaded now (see common/gpu_module.h); the module's function sets
 * the error itself when no GPU is usable. */
static const struct kernels *cuda_from_gpu_module(void)
{
    const struct kernels *(*get)(void) = (const struct kernels *(*)(void))gpu_module_symbol("fsdp_gpu_kernels");
    if (!get) {
        error_set(FSDP_EUNSUPPORTED, "kernels: %s; use device=cpu", error_message());
        return NULL;
    }
    return get();
}

static const struct {
    const char *name;
    const struct kernels *(*table)(void); /* NULL with error_set when not available here */
} devices[] = {
    {"cpu", kernels_cpu},
    {"cuda", cuda_from_gpu_module},
};

enum { NDEVICES = sizeof(devices) / sizeof(devices[0]) };

const struct kernels *kernels_get(const char *device)
{
    char names[128] = "";
    for (int i = 0; i < NDEVICES; i++) {
        if (device && strcmp(device, devices[i].name) == 0)
            return devices[i].table();
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s\"%s\"", i ? " or " : "", devices[i].name);
    }
    if (!device)
        error_set(FSDP_EINVAL, "kernels: no device name given; use %s", names);
    else
        error_set(FSDP_EINVAL, "kernels: unknown device \"%s\"; use %s", device, names);
    return NULL;
}
