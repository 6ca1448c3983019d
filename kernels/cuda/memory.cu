/* Device and pinned host memory, copies, and the stream's synchronisation for the CUDA table. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

extern "C" {
#include "common/log.h"
}

void *cuda_mem_alloc(size_t bytes)
{
    void *p = NULL;
    /* cudaMalloc aligns to 256 bytes, more than the table's 64. */
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: later calls may succeed */
        error_set(e == cudaErrorMemoryAllocation ? FSDP_ENOMEM : FSDP_EIO,
                  "kernels cuda: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void cuda_mem_free(void *ptr)
{
    if (ptr) {
        cudaError_t e = cudaFree(ptr);
        if (e != cudaSuccess)
            log_warn("kernels cuda: mem_free: %s", cudaGetErrorString(e));
    }
}

void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    /* cudaMallocHost pins the pages (and maps them for the device: portable, page-aligned). */
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        error_set(e == cudaErrorMemoryAllocation ? FSDP_ENOMEM : FSDP_EIO,
                  "kernels cuda: cannot allocate %zu bytes of pinned host memory: %s (the locked-memory limit, "
                  "ulimit -l, may be too low)", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void cuda_host_free(void *ptr)
{
    if (ptr) {
        cudaError_t e = cudaFreeHost(ptr);
        if (e != cudaSuccess)
            log_warn("kernels cuda: host_free: %s", cudaGetErrorString(e));
    }
}

int cuda_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind)
{
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                           cudaMemcpyDeviceToDevice};
    if ((unsigned)kind > KERNELS_COPY_D2D)
        return error_set(FSDP_EINVAL, "kernels cuda: bad copy kind %d", (int)kind);
    if (bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy of %zu bytes with a NULL pointer", bytes);
    const char *d = (const char *)dst, *s = (const char *)src;
    if (kind == KERNELS_COPY_D2D && d < s + bytes && s < d + bytes && d != s) {
        /* cudaMemcpy does not define overlapping copies (the CPU backend's memmove does): bounce through
         * scratch so both backends mean the same thing. */
        void *tmp;
        FSDP_TRY(cuda_scratch("mem_copy", &tmp, bytes));
        FSDP_TRY(
            cuda_check("mem_copy", cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx.stream)));
        src = tmp;
    }
    if (d == s)
        return 0;
    FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(dst, src, bytes, kinds[kind], cuda_ctx.stream)));
    /* Host buffers are ordinary (pageable) memory the caller reuses as soon as we return, as with the
     * CPU backend: copies touching the host complete before returning; device-to-device stays queued. */
    if (kind != KERNELS_COPY_D2D)
        return cuda_check("mem_copy", cudaStreamSynchronize(cuda_ctx.stream));
    return 0;
}

int cuda_mem_set(void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return 0;
    if (!dst)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_set of %zu bytes on NULL", bytes);
    return cuda_check("mem_set", cudaMemsetAsync(dst, value, bytes, cuda_ctx.stream));
}

int cuda_synchronize(void)
{
    return cuda_check("synchronize (an earlier kernel failed asynchronously)",
                      cudaStreamSynchronize(cuda_ctx.stream));
}
