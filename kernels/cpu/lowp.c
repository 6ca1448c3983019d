/* The bf16 operands of the CPU backend's bf16 matmuls.
 *
 * oneDNN's bf16 matmul reads both operands in bf16. Gathered parameters already exist in bf16 (the FSDP
 * engine all-gathers them so): the engine binds each gathered unit's fp32 view to its bf16 copy with the
 * table's lowp_bind, and a matmul whose weight lies in a bound range reads the bf16 copy as it is. Every
 * other operand (activations, their gradients) is rounded here, into scratch the calling thread owns,
 * with common/dtype.h's rounding: a pass at memory speed, a few percent of the product that reads it. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* Bound ranges: a handful live at once (the units gathered around the one computing, ZeRO-2 keeps every
 * unit), so a short list scanned per matmul costs nothing beside the product. */
#define CPU_LOWP_RANGES 1024

static struct {
    pthread_mutex_t lock;
    struct {
        const float *f32;
        const uint16_t *lp;
        size_t n;
    } r[CPU_LOWP_RANGES];
    int n;
} bound = {.lock = PTHREAD_MUTEX_INITIALIZER};

int cpu_lowp_bind(const float *f32, const void *lp, size_t n)
{
    if (!f32 || !lp || n == 0)
        return error_set(FSDP_EINVAL, "kernels cpu: lowp_bind: NULL buffer or empty range");
    pthread_mutex_lock(&bound.lock);
    int rc = 0;
    for (int i = 0; i < bound.n; i++)
        if (f32 < bound.r[i].f32 + bound.r[i].n && bound.r[i].f32 < f32 + n) {
            rc = error_set(FSDP_EEXIST, "kernels cpu: lowp_bind: [%p, +%zu) overlaps the bound range [%p, +%zu)",
                           (const void *)f32, n, (const void *)bound.r[i].f32, bound.r[i].n);
            goto out;
        }
    if (bound.n == CPU_LOWP_RANGES) {
        rc = error_set(FSDP_ERANGE, "kernels cpu: lowp_bind: %d ranges bound already; unbind released ones",
                       CPU_LOWP_RANGES);
        goto out;
    }
    bound.r[bound.n].f32 = f32;
    bound.r[bound.n].lp = lp;
    bound.r[bound.n].n = n;
    bound.n++;
out:
    pthread_mutex_unlock(&bound.lock);
    return rc;
}

int cpu_lowp_unbind(const float *f32)
{
    pthread_mutex_lock(&bound.lock);
    int i = 0;
    while (i < bound.n && bound.r[i].f32 != f32)
        i++;
    bool found = i < bound.n;
    if (found)
        bound.r[i] = bound.r[--bound.n];
    pthread_mutex_unlock(&bound.lock);
    return found ? 0
                 : error_set(FSDP_ENOTFOUND, "kernels cpu: lowp_unbind: %p is not a bound range", (const void *)f32);
}

const uint16_t *cpu_lowp_find(const float *p, size_t span)
{
    const uint16_t *lp = NULL;
    pthread_mutex_lock(&bound.lock);
    for (int i = 0; i < bound.n; i++)
        if (p >= bound.r[i].f32 && p + span <= bound.r[i].f32 + bound.r[i].n) {
            lp = bound.r[i].lp + (p - bound.r[i].f32);
            break;
        }
    pthread_mutex_unlock(&bound.lock);
    return lp;
}

/* One row: the AVX-512 clone converts 16 elements per step. */
CPU_SIMD_CLONES
static void round_row(uint16_t *dst, const float *src, size_t n)
{
    const uint32_t *u = (const uint32_t *)src;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        dst[i] = dtype_f32_bits_to_bf16(u[i]);
}

CPU_SIMD_CLONES
static void round_colsum_row(uint16_t *dst, float *acc, const float *src, size_t n)
{
    const uint32_t *u = (const uint32_t *)src;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        acc[i] += src[i];
        dst[i] = dtype_f32_bits_to_bf16(u[i]);
    }
}

void cpu_round_bf16_colsum(uint16_t *dst, float *acc, const float *src, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        round_colsum_row(dst + r * cols, acc, src + r * cols, cols);
}

void cpu_round_bf16(uint16_t *dst, const float *src, size_t rows, size_t cols, size_t ld)
{
    if (ld == cols) {
        /* one contiguous range: chunks of it, so a few long rows still split over the threads */
        long n = (long)(rows * cols), chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
        for (long c = 0; c < chunks; c++) {
            long b = c * CPU_CHUNK, e = b + CPU_CHUNK < n ? b + CPU_CHUNK : n;
            round_row(dst + b, src + b, (size_t)(e - b));
        }
        return;
    }
    long nr = (long)rows;
#pragma omp parallel for schedule(static) if ((long)(rows * cols) > CPU_CHUNK)
    for (long r = 0; r < nr; r++)
        round_row(dst + (size_t)r * cols, src + (size_t)r * ld, cols);
}

/* ---- per-thread scratch ---- */

struct scratch {
    void *p[CPU_SCRATCH_SLOTS];
    size_t bytes[CPU_SCRATCH_SLOTS];
};

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *v)
{
    struct scratch *s = v;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++)
        cpu_mem_free(s->p[i]);
    free(s);
}

static void scratch_init(void)
{
    pthread_key_create(&scratch_key, scratch_free);
}

static struct scratch *scratch_get(bool create)
{
    pthread_once(&scratch_once, scratch_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s && create) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            error_set(FSDP_ENOMEM, "kernels cpu: out of memory for the matmul scratch");
            return NULL;
        }
    }
    return s;
}

void *cpu_scratch(int slot, size_t bytes)
{
    struct scratch *s = scratch_get(true);
    if (!s)
        return NULL;
    if (s->bytes[slot] < bytes) {
        /* grow by a quarter more than asked, so slowly growing shapes do not reallocate every call */
        size_t want = bytes + bytes / 4;
        void *p = cpu_mem_alloc(want);
        if (!p)
            return NULL;
        cpu_mem_free(s->p[slot]);
        s->p[slot] = p;
        s->bytes[slot] = want;
    }
    return s->p[slot];
}

size_t cpu_scratch_bytes(void)
{
    struct scratch *s = scratch_get(false);
    size_t total = 0;
    for (int i = 0; s && i < CPU_SCRATCH_SLOTS; i++)
        total += s->bytes[i];
    return total;
}
