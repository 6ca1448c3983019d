/* Device name -> ops table. */
#include <string.h>

#include "common/error.h"
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
#ifdef FSDP_HAVE_CUDA_KERNELS
        return kernels_cuda(); /* sets the error itself when no GPU is usable */
#else
        error_set(FSDP_EUNSUPPORTED, "kernels: this build has no CUDA kernels; rebuild with nvcc on PATH "
                                     "(meson -Dcuda=enabled) or use device=cpu");
        return NULL;
#endif
    }
    error_set(FSDP_EINVAL, "kernels: unknown device \"%s\"; use \"cpu\" or \"cuda\"", device);
    return NULL;
}
