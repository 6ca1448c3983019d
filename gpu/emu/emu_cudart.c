/* The CUDA runtime API of the CUDA host emulator, less streams, events and memory (emu_stream.c, emu_mem.c): the
 * one emulated device and its properties, errors and their names, kernel attributes and the launch checks. The
 * device says what it is: its name is "fsdpc CUDA emulator (host CPU)", which the CUDA backend logs at start. */
#include "gpu/emu/emu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/settings.h"
#include "gpu/emu/emu_internal.h"

size_t emu_memory_bytes(void);

#define EMU_DEVICE_NAME "fsdpc CUDA emulator (host CPU)"
#define SMEM_DEFAULT (48 * 1024)
#define SMEM_OPTIN 232448 /* an H100's opt-in maximum per block */

static __thread cudaError_t last_error = cudaSuccess;
static __thread int current_device;

/* Streaming multiprocessors the device reports: the kernels size their grids by it (cuda_grid), so a small
 * number keeps the emulated grids small; FSDP_GPU_EMU_SMS sets it. */
static int emu_sms(void)
{
    return (int)settings_int(SETTING_GPU_EMU_SMS);
}

/* Devices the emulator reports (FSDP_GPU_EMU_DEVICES): every process emulates its own, so
 * ranks of one machine each take "their" device, as one rank per GPU does. */
static int emu_devices(void)
{
    return (int)settings_int(SETTING_GPU_EMU_DEVICES);
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    emu_mem_init();
    *count = emu_devices();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= emu_devices())
        return ret(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= emu_devices())
        return ret(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = emu_sms(); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = SMEM_OPTIN; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = SMEM_DEFAULT; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0; break;
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= emu_devices())
        return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", EMU_DEVICE_NAME);
    p->totalGlobalMem = emu_memory_bytes();
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = emu_sms();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    static int the_pool;
    if (!pool)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= emu_devices())
        return ret(cudaErrorInvalidDevice);
    *pool = (cudaMemPool_t)(void *)&the_pool; /* one pool: allocations go straight to emu_device_alloc */
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    (void)attr;
    return pool && value ? cudaSuccess : ret(cudaErrorInvalidValue);
}

/* ---- errors ---- */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    cudaError_t s = emu_sticky_error();
    return s != cudaSuccess ? s : e;
}

cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t s = emu_sticky_error();
    return s != cudaSuccess ? s : last_error;
}

#define ERR(name, text) {name, #name, text}
static const struct {
    cudaError_t e;
    const char *name, *text;
} errors[] = {
    ERR(cudaSuccess, "no error"),
    ERR(cudaErrorInvalidValue, "invalid argument"),
    ERR(cudaErrorMemoryAllocation, "out of memory"),
    ERR(cudaErrorInitializationError, "initialization error"),
    ERR(cudaErrorLaunchFailure, "unspecified launch failure"),
    ERR(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
    ERR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    ERR(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    ERR(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
    ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    ERR(cudaErrorNotReady, "device not ready"),
    ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    ERR(cudaErrorNotSupported, "operation not supported"),
    ERR(cudaErrorUnknown, "unknown error"),
};

const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].e == e)
            return errors[i].name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].e == e)
            return errors[i].text;
    return "unrecognized error code";
}

/* ---- kernel attributes and launch checks ---- */

#define MAX_FUNCS 512
static pthread_mutex_t fmu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const void *fn;
    int max_dynamic_smem;
} funcs[MAX_FUNCS];
static int nfuncs;

cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int value)
{
    if (!fn)
        return ret(cudaErrorInvalidValue); /* cudaErrorInvalidDeviceFunction on a device */
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return cudaSuccess;
    if (value < 0 || value > SMEM_OPTIN)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&fmu);
    int i = 0;
    while (i < nfuncs && funcs[i].fn != fn)
        i++;
    if (i == nfuncs && nfuncs < MAX_FUNCS)
        funcs[nfuncs++].fn = fn;
    if (i < MAX_FUNCS)
        funcs[i].max_dynamic_smem = value;
    pthread_mutex_unlock(&fmu);
    return cudaSuccess;
}

cudaError_t emu_launch_check(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem)
{
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || block.x == 0 ||
        block.y == 0 || block.z == 0 || (size_t)block.x * block.y * block.z > 1024 || block.z > 64) {
        fprintf(stderr, "fsdpc CUDA emulator: launch of %s: grid (%u,%u,%u), block (%u,%u,%u) is not a valid "
                "configuration\n", name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return ret(cudaErrorInvalidConfiguration);
    }
    if (smem > SMEM_DEFAULT) {
        int allowed = SMEM_DEFAULT;
        pthread_mutex_lock(&fmu);
        for (int i = 0; i < nfuncs; i++)
            if (funcs[i].fn == fn)
                allowed = funcs[i].max_dynamic_smem;
        pthread_mutex_unlock(&fmu);
        if (smem > (size_t)allowed) {
            fprintf(stderr, "fsdpc CUDA emulator: launch of %s with %zu bytes of dynamic shared memory, but "
                    "cudaFuncSetAttribute allowed it %d (48 KiB without it)\n", name, smem, allowed);
            return ret(cudaErrorInvalidValue);
        }
    }
    return cudaSuccess;
}
