/* Device memory for the CPU backend is host memory, aligned for the widest vector loads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

void *cpu_mem_alloc(size_t bytes)
{
    void *ptr = NULL;
    /* malloc(0) may return NULL; callers treat NULL as failure, so hand out a minimal block. */
    if (posix_memalign(&ptr, 64, bytes ? bytes : 64) != 0) {
        error_set(FSDP_ENOMEM, "kernels cpu: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    return ptr;
}

void cpu_mem_free(void *ptr)
{
    free(ptr);
}

int cpu_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind)
{
    if (kind != KERNELS_COPY_H2D && kind != KERNELS_COPY_D2H && kind != KERNELS_COPY_D2D)
        return error_set(FSDP_EINVAL, "kernels cpu: bad copy kind %d", (int)kind);
    if (bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cpu: mem_copy of %zu bytes with a NULL pointer", bytes);
    /* memmove: overlapping device-to-device copies are legal on CUDA too. */
    memmove(dst, src, bytes);
    return 0;
}

int cpu_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                   enum kernels_copy_kind kind)
{
    if (kind != KERNELS_COPY_H2D && kind != KERNELS_COPY_D2H && kind != KERNELS_COPY_D2D)
        return error_set(FSDP_EINVAL, "kernels cpu: bad copy kind %d", (int)kind);
    if (width == 0 || rows == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cpu: mem_copy2d of %zu rows of %zu bytes with a NULL pointer", rows,
                         width);
    if (dpitch < width || spitch < width)
        return error_set(FSDP_EINVAL, "kernels cpu: mem_copy2d: row width %zu bytes is above a pitch (dpitch %zu, "
                         "spitch %zu)", width, dpitch, spitch);
    if ((rows - 1) > (SIZE_MAX - width) / (dpitch > spitch ? dpitch : spitch))
        return error_set(FSDP_EINVAL, "kernels cpu: mem_copy2d: %zu rows of pitch %zu overflow the address space",
                         rows, dpitch > spitch ? dpitch : spitch);
    const char *d = dst, *s = src;
    size_t dext = (rows - 1) * dpitch + width, sext = (rows - 1) * spitch + width;
    if (d < s + sext && s < d + dext)
        return error_set(FSDP_EINVAL, "kernels cpu: mem_copy2d: the source and destination regions overlap");
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, s + r * spitch, width);
    return 0;
}

int cpu_mem_set(void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return 0;
    if (!dst)
        return error_set(FSDP_EINVAL, "kernels cpu: mem_set of %zu bytes on NULL", bytes);
    memset(dst, value, bytes);
    return 0;
}

int cpu_synchronize(void)
{
    return 0;
}
