/* Device name -> ops table. */
#include <string.h>

#include "common/error.h"
#include "common/gpu_module.h"
#include "kernels/kernels.h"

const struct kernels *kernels_get(const char *device)
{
    if (!device) {
        error_set(FSDP_EINVAL, "kernels: no device name given; use \"cpu\" or \"cuda\"");
        return NULL;
    }
    if (strcmp(device, "cpu") == 0)
        return kernels_cpu();
    if (strcmp(device, "cuda") == 0) {
        /* The CUDA table lives in the GPU module, loaded now (see common/gpu_module.h). */
        const struct kernels *(*get)(void) = (const struct kernels *(*)(void))gpu_module_symbol("fsdp_gpu_kernels");
        if (!get) {
            error_set(FSDP_EUNSUPPORTED, "kernels: %s; use device=cpu", error_message());
            return NULL;
        }
        return get(); /* sets the error itself when no GPU is usable */
    }
    error_set(FSDP_EINVAL, "kernels: unknown device \"%s\"; use \"cpu\" or \"cuda\"", device);
    return NULL;
}
