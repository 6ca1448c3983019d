/* Device and pinned host memory, copies, and the stream's synchronisation for the CUDA table. Host copies
 * of pageable memory go through the context's pinned staging ring (cuda_common.h), pinned memory is copied
 * directly where that is faster: host-to-device returns once the caller may reuse its buffer (without
 * waiting for the device where staging allows), device-to-host once the bytes are in the caller's
 * buffer. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#include <stdint.h>
#include <string.h>

extern "C" {
#include "common/log.h"
}

/* From the device's stream-ordered pool (cuda_ctx.pool), on the ops' stream: neither call waits for the
 * device, so a rank allocating while its NCCL kernels run cannot deadlock it, and after the first step the
 * pool hands back what was freed without asking the driver. The memory is usable by any work queued after
 * this call (NCCL's stream waits for the ops' stream when a collective is issued). */
void *cuda_mem_alloc(size_t bytes)
{
    void *p = NULL;
    /* The pool aligns to at least 256 bytes, more than the table's 64. */
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 64, cuda_ctx.pool, cuda_ctx.stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is not sticky: later calls may succeed */
        error_set(e == cudaErrorMemoryAllocation ? FSDP_ENOMEM : FSDP_EIO,
                  "kernels cuda: cannot allocate %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

/* Returned to the pool after the work queued before (the caller has waited for any collective on it). */
void cuda_mem_free(void *ptr)
{
    if (ptr) {
        cudaError_t e = cudaFreeAsync(ptr, cuda_ctx.stream);
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

/* A whole chunk of the pinned staging ring, the next one, once the copies that last used it are done (a chunk
 * whose event was never recorded is free). The caller records stage_done[*slot] after its copy. */
static int stage_take(char **chunk, int *slot)
{
    int i = cuda_ctx.stage_next;
    cuda_ctx.stage_next = (i + 1) % CUDA_STAGE_CHUNKS;
    cuda_ctx.stage_used = CUDA_STAGE_BYTES; /* taken whole: the next small copy starts a chunk of its own */
    FSDP_TRY(cuda_check("mem_copy", cudaEventSynchronize(cuda_ctx.stage_done[i])));
    *chunk = cuda_ctx.stage + (size_t)i * CUDA_STAGE_BYTES;
    *slot = i;
    return 0;
}

/* len (<= CUDA_STAGE_BYTES) bytes of staging: the rest of the current chunk when they fit (64-byte aligned),
 * else the next chunk (stage_take's wait). Re-recording the chunk's event after each copy is what frees it:
 * stream order makes the last record cover every copy out of the chunk before it. */
static int stage_reserve(size_t len, char **p, int *slot)
{
    size_t at = (cuda_ctx.stage_used + 63) & ~(size_t)63;
    if (at > CUDA_STAGE_BYTES || len > CUDA_STAGE_BYTES - at) {
        FSDP_TRY(stage_take(p, slot));
        cuda_ctx.stage_used = len;
        return 0;
    }
    *slot = (cuda_ctx.stage_next + CUDA_STAGE_CHUNKS - 1) % CUDA_STAGE_CHUNKS;
    *p = cuda_ctx.stage + (size_t)*slot * CUDA_STAGE_BYTES + at;
    cuda_ctx.stage_used = at + len;
    return 0;
}

static bool pinned(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

/* A host-to-device copy of pinned memory (host_alloc: offloaded shards) of more bytes than the staging ring
 * holds goes directly, at bus speed and without the host's memcpy into the ring. The caller may reuse its
 * buffer when mem_copy returns (kernels.h), so the call then waits for the copy, and with it for the ops
 * queued before it (stream order). Staging such a copy would wait for them too: its fifth chunk waits for
 * the first one's copy. A smaller copy is staged all the same, which returns without waiting for the
 * device: the host keeps its lead over the device (prefetching the next unit's gather) for the cost of a
 * memcpy of at most CUDA_STAGE_CHUNKS chunks. */
static bool h2d_direct(const void *src, size_t bytes)
{
    return bytes > (size_t)CUDA_STAGE_CHUNKS * CUDA_STAGE_BYTES && pinned(src);
}

/* Waits for a direct host-to-device copy just queued (h2d_direct), so the caller may reuse its buffer. */
static int h2d_direct_wait(const char *op)
{
    cudaError_t e = cudaStreamSynchronize(cuda_ctx.stream);
    if (e != cudaSuccess)
        return error_set(FSDP_EIO, "kernels cuda: %s: waiting for a copy from pinned memory: %s (%s; an earlier "
                         "kernel may have failed asynchronously)", op, cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
}

/* Host to device. Pageable memory (and pinned memory that fits the ring) without waiting for the device:
 * the bytes are copied into pinned staging chunks and go from there with cudaMemcpyAsync, so the caller may
 * reuse its buffer at once and the copy stays queued behind the ops like any kernel. Only a ring that wraps
 * waits, for the copy that used the chunk before. Larger pinned memory goes directly (h2d_direct). */
static int copy_h2d(char *d, const char *s, size_t bytes)
{
    if (h2d_direct(s, bytes)) {
        FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(d, s, bytes, cudaMemcpyHostToDevice, cuda_ctx.stream)));
        return h2d_direct_wait("mem_copy");
    }
    for (size_t off = 0; off < bytes;) {
        size_t len = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
        char *chunk;
        int i;
        FSDP_TRY(stage_reserve(len, &chunk, &i));
        memcpy(chunk, s + off, len);
        FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(d + off, chunk, len, cudaMemcpyHostToDevice,
                                                        cuda_ctx.stream)));
        FSDP_TRY(cuda_check("mem_copy", cudaEventRecord(cuda_ctx.stage_done[i], cuda_ctx.stream)));
        off += len;
    }
    return 0;
}

/* Device to host, returning with the data in place. Pinned memory (host_alloc: offloaded state) is copied
 * into directly; pageable memory through the staging chunks, the copy of one chunk overlapping the host's
 * memcpy out of the one before. Ends with cuda_sync, which also reports deferred range checks. */
static int copy_d2h(char *d, const char *s, size_t bytes)
{
    if (pinned(d)) {
        FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToHost, cuda_ctx.stream)));
        return cuda_sync("mem_copy");
    }
    if (bytes <= CUDA_STAGE_BYTES) {
        /* one piece: the stream's synchronisation (cuda_sync) covers the copy, one wait in all */
        char *chunk;
        int i;
        FSDP_TRY(stage_reserve(bytes, &chunk, &i));
        FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(chunk, s, bytes, cudaMemcpyDeviceToHost, cuda_ctx.stream)));
        FSDP_TRY(cuda_check("mem_copy", cudaEventRecord(cuda_ctx.stage_done[i], cuda_ctx.stream)));
        FSDP_TRY(cuda_sync("mem_copy"));
        memcpy(d, chunk, bytes);
        return 0;
    }
    struct {
        char *chunk;
        int slot;
        size_t off, len;
    } fly[CUDA_STAGE_CHUNKS];
    int nfly = 0;
    for (size_t off = 0; off < bytes || nfly > 0;) {
        if (off < bytes && nfly < CUDA_STAGE_CHUNKS - 1) {
            size_t len = bytes - off < CUDA_STAGE_BYTES ? bytes - off : CUDA_STAGE_BYTES;
            FSDP_TRY(stage_take(&fly[nfly].chunk, &fly[nfly].slot));
            fly[nfly].off = off;
            fly[nfly].len = len;
            FSDP_TRY(cuda_check("mem_copy", cudaMemcpyAsync(fly[nfly].chunk, s + off, len, cudaMemcpyDeviceToHost,
                                                            cuda_ctx.stream)));
            FSDP_TRY(cuda_check("mem_copy", cudaEventRecord(cuda_ctx.stage_done[fly[nfly].slot], cuda_ctx.stream)));
            nfly++;
            off += len;
            continue;
        }
        FSDP_TRY(cuda_check("mem_copy", cudaEventSynchronize(cuda_ctx.stage_done[fly[0].slot])));
        memcpy(d + fly[0].off, fly[0].chunk, fly[0].len);
        memmove(fly, fly + 1, (size_t)--nfly * sizeof fly[0]);
    }
    return cuda_sync("mem_copy");
}

int cuda_mem_copy(void *dst, const void *src, size_t bytes, enum kernels_copy_kind kind)
{
    if ((unsigned)kind > KERNELS_COPY_D2D)
        return error_set(FSDP_EINVAL, "kernels cuda: bad copy kind %d", (int)kind);
    if (bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy of %zu bytes with a NULL pointer", bytes);
    if (kind == KERNELS_COPY_H2D)
        return copy_h2d((char *)dst, (const char *)src, bytes);
    if (kind == KERNELS_COPY_D2H)
        return copy_d2h((char *)dst, (const char *)src, bytes);
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d == s)
        return 0;
    if (d < s + bytes && s < d + bytes) {
        /* cudaMemcpy does not define overlapping copies (the CPU backend's memmove does): bounce through
         * scratch so both backends mean the same thing. */
        void *tmp;
        FSDP_TRY(cuda_scratch("mem_copy", &tmp, bytes));
        FSDP_TRY(
            cuda_check("mem_copy", cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx.stream)));
        src = tmp;
    }
    return cuda_check("mem_copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_ctx.stream));
}

/* Host to device, strided: rows packed into the staging chunks (as many whole rows as a chunk holds) and
 * sent by one 2D copy per chunk, so the caller may reuse its buffer at once, as with copy_h2d. Rows wider
 * than a chunk go one by one. Pinned rows of more bytes than the ring holds go in one direct 2D copy, waited
 * for (h2d_direct). */
static int copy2d_h2d(char *d, size_t dpitch, const char *s, size_t spitch, size_t width, size_t rows)
{
    if (h2d_direct(s, width * rows)) {
        FSDP_TRY(cuda_check("mem_copy2d", cudaMemcpy2DAsync(d, dpitch, s, spitch, width, rows, cudaMemcpyHostToDevice,
                                                            cuda_ctx.stream)));
        return h2d_direct_wait("mem_copy2d");
    }
    if (width > CUDA_STAGE_BYTES) {
        for (size_t r = 0; r < rows; r++)
            FSDP_TRY(copy_h2d(d + r * dpitch, s + r * spitch, width));
        return 0;
    }
    size_t per = CUDA_STAGE_BYTES / width;
    for (size_t r0 = 0; r0 < rows; r0 += per) {
        size_t n = rows - r0 < per ? rows - r0 : per;
        char *chunk;
        int i;
        FSDP_TRY(stage_take(&chunk, &i));
        for (size_t r = 0; r < n; r++)
            memcpy(chunk + r * width, s + (r0 + r) * spitch, width);
        FSDP_TRY(cuda_check("mem_copy2d", cudaMemcpy2DAsync(d + r0 * dpitch, dpitch, chunk, width, width, n,
                                                            cudaMemcpyHostToDevice, cuda_ctx.stream)));
        FSDP_TRY(cuda_check("mem_copy2d", cudaEventRecord(cuda_ctx.stage_done[i], cuda_ctx.stream)));
    }
    return 0;
}

/* Same contract as cuda_mem_copy for each kind: host to device staged, device to host returning with the
 * bytes in place (a device-to-pageable 2D copy returns once done; cuda_sync reports deferred checks), device
 * to device queued. cudaMemcpy2D leaves overlapping regions undefined: they are refused, on the CPU too. */
int cuda_mem_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                    enum kernels_copy_kind kind)
{
    if ((unsigned)kind > KERNELS_COPY_D2D)
        return error_set(FSDP_EINVAL, "kernels cuda: bad copy kind %d", (int)kind);
    if (width == 0 || rows == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy2d of %zu rows of %zu bytes with a NULL pointer", rows,
                         width);
    if (dpitch < width || spitch < width)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy2d: row width %zu bytes is above a pitch (dpitch %zu, "
                         "spitch %zu)", width, dpitch, spitch);
    size_t maxp = dpitch > spitch ? dpitch : spitch;
    if (rows - 1 > (SIZE_MAX - width) / maxp)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy2d: %zu rows of pitch %zu overflow the address space",
                         rows, maxp);
    const char *d = (const char *)dst, *s = (const char *)src;
    size_t dext = (rows - 1) * dpitch + width, sext = (rows - 1) * spitch + width;
    if (kind == KERNELS_COPY_D2D && d < s + sext && s < d + dext)
        return error_set(FSDP_EINVAL, "kernels cuda: mem_copy2d: the source and destination regions overlap");
    if (kind == KERNELS_COPY_H2D)
        return copy2d_h2d((char *)dst, dpitch, s, spitch, width, rows);
    if (kind == KERNELS_COPY_D2H) {
        FSDP_TRY(cuda_check("mem_copy2d", cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                                            cudaMemcpyDeviceToHost, cuda_ctx.stream)));
        return cuda_sync("mem_copy2d");
    }
    return cuda_check("mem_copy2d", cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                                      cudaMemcpyDeviceToDevice, cuda_ctx.stream));
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
    return cuda_sync("synchronize");
}
