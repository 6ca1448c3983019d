/* The GPU module's entry points (common/gpu_module.h loads it): the CUDA ops table and the NCCL backend,
 * under names that exist only in the module, so that a program which also links some of this code
 * statically (the NCCL test links comm_nccl.c) never confuses the two copies. The module's own folder,
 * because it reaches into comm/'s internals, which kernels/ never sees. */
#include "comm/comm_internal.h"
#include "kernels/kernels.h"

const struct kernels *fsdp_gpu_kernels(void);
const struct comm_backend *fsdp_gpu_comm_backend(void);

const struct kernels *fsdp_gpu_kernels(void)
{
    return kernels_cuda();
}

const struct comm_backend *fsdp_gpu_comm_backend(void)
{
    return comm_backend_nccl();
}
