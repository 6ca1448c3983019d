/* The GPU module's entry points (common/gpu_module.h loads it): the CUDA ops table, the NCCL backend and the
 * device count, under names that exist only in the module. The module's own folder, because it reaches
 * into comm/'s internals, which kernels/ never sees. */
#include "comm/comm_internal.h"
#include "kernels/kernels.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>

const struct kernels *fsdp_gpu_kernels(void);
const struct comm_backend *fsdp_gpu_comm_backend(void);
int fsdp_gpu_device_count(char *why, size_t cap);
#ifdef FSDP_GPU_EMU
const char *fsdp_gpu_emulator(void);

/* Only the emulator's build has this symbol: common/gpu_module.c's gpu_module_emulator asks for it. */
const char *fsdp_gpu_emulator(void)
{
    return "the CUDA host emulator (kernels/cuda on the CPU: for tests, not speed)";
}
#endif

const struct kernels *fsdp_gpu_kernels(void)
{
    return kernels_cuda();
}

const struct comm_backend *fsdp_gpu_comm_backend(void)
{
    return comm_backend_nccl();
}

/* Without a driver, or with one older than this build's CUDA (error 35, cudaErrorInsufficientDriver),
 * cudaGetDeviceCount fails and may leave the count alone: any error is zero devices, said in words. */
int fsdp_gpu_device_count(char *why, size_t cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, cap, "cudaGetDeviceCount failed: %s (%s, error %d)%s", cudaGetErrorString(e),
                 cudaGetErrorName(e), (int)e,
                 e == cudaErrorInsufficientDriver ? ": the NVIDIA driver is older than this build's CUDA "
                                                    "needs (CUDA 13: R580 or newer)" : "");
        (void)cudaGetLastError();
        return 0;
    }
    if (n == 0)
        snprintf(why, cap, "the driver reports 0 CUDA devices (check CUDA_VISIBLE_DEVICES)");
    return n;
}
