/* The reductions every CPU path uses. Reductions run over blocks through an f32 scratch (converted with
 * common/dtype.h's functions, as every other path converts) so that bf16/f16 are rounded once, and so
 * that the per-element order of operations is fixed (source 0, then 1, ...) whatever the aliasing of
 * dst: that order is what makes f32 sums reproducible. */
#include "comm/comm_internal.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { BLOCK = 2048 };

static void load_block(enum dtype dtype, const void *src, size_t off, size_t n, float *acc)
{
    if (dtype == DTYPE_F32) {
        memcpy(acc, (const float *)src + off, n * 4);
    } else if (dtype == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++)
            acc[i] = dtype_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++)
            acc[i] = dtype_f16_to_f32(s[i]);
    }
}

static void combine_block(enum dtype dtype, enum comm_op op, const void *src, size_t off, size_t n,
                          float *acc)
{
    float tmp[BLOCK];
    const float *v;
    if (dtype == DTYPE_F32) {
        v = (const float *)src + off;
    } else {
        load_block(dtype, src, off, n, tmp);
        v = tmp;
    }
    if (op == COMM_MAX) {
        for (size_t i = 0; i < n; i++)
            acc[i] = v[i] > acc[i] ? v[i] : acc[i];
    } else {
        for (size_t i = 0; i < n; i++)
            acc[i] += v[i];
    }
}

static void store_block(enum dtype dtype, const float *acc, void *dst, size_t off, size_t n, bool nt)
{
    if (dtype == DTYPE_F32) {
        if (nt)
            comm_copy_nt((float *)dst + off, acc, n * 4);
        else
            memcpy((float *)dst + off, acc, n * 4);
    } else if (dtype == DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (size_t i = 0; i < n; i++)
            d[i] = dtype_f32_to_bf16(acc[i]);
    } else {
        uint16_t *d = (uint16_t *)dst + off;
        for (size_t i = 0; i < n; i++)
            d[i] = dtype_f32_to_f16(acc[i]);
    }
}

/* acc[0..m) = the reduction of elements [i, i+m) of the sources, m <= 16 (heads and tails). */
static inline void reduce_f32_run(enum comm_op op, const float *const *s, int nsrc, size_t i, size_t m,
                                  int divisor, float *acc)
{
    for (size_t j = 0; j < m; j++)
        acc[j] = s[0][i + j];
    for (int k = 1; k < nsrc; k++) {
        const float *v = s[k] + i;
        if (op == COMM_MAX) {
            for (size_t j = 0; j < m; j++)
                acc[j] = v[j] > acc[j] ? v[j] : acc[j];
        } else {
            for (size_t j = 0; j < m; j++)
                acc[j] += v[j];
        }
    }
    if (divisor > 1) {
        const float d = (float)divisor;
        for (size_t j = 0; j < m; j++)
            acc[j] /= d;
    }
}

/* f32, the common case, in one pass: 16 elements (a cache line) of every source summed in registers and
 * stored once, instead of staging each block through an L1 scratch (a copy in, a pass per source, a copy
 * out). The per-element order is the same (source 0, then 1, ...), so results are bitwise those of the
 * general path. dst may be one of the sources (in place) but must not otherwise overlap them. The body is
 * written with SSE intrinsics: left to itself GCC kept the 16 sums in a stack array, copied in with
 * `rep movsq`, and ran at a third of a copy's speed. */
static void reduce_f32(enum comm_op op, const float *const *s, int nsrc, float *dst, size_t n, int divisor,
                       bool nt)
{
    float acc[16];
    size_t i = 0;
#if defined(__SSE2__)
    size_t head = ((16 - ((uintptr_t)dst & 15)) & 15) / 4; /* streaming stores want 16-byte alignment */
    if (!nt || ((uintptr_t)dst & 3) != 0)
        head = 0, nt = false;
    head = head < n ? head : n;
    reduce_f32_run(op, s, nsrc, 0, head, divisor, acc);
    memcpy(dst, acc, head * sizeof(float));
    const __m128 d = _mm_set1_ps((float)divisor);
    for (i = head; i + 16 <= n; i += 16) {
        const float *s0 = s[0] + i;
        __m128 a0 = _mm_loadu_ps(s0), a1 = _mm_loadu_ps(s0 + 4), a2 = _mm_loadu_ps(s0 + 8),
               a3 = _mm_loadu_ps(s0 + 12);
        for (int k = 1; k < nsrc; k++) {
            const float *v = s[k] + i;
            if (op == COMM_MAX) { /* maxps(v, acc) = v > acc ? v : acc, NaN and signed zeros included */
                a0 = _mm_max_ps(_mm_loadu_ps(v), a0);
                a1 = _mm_max_ps(_mm_loadu_ps(v + 4), a1);
                a2 = _mm_max_ps(_mm_loadu_ps(v + 8), a2);
                a3 = _mm_max_ps(_mm_loadu_ps(v + 12), a3);
            } else {
                a0 = _mm_add_ps(a0, _mm_loadu_ps(v));
                a1 = _mm_add_ps(a1, _mm_loadu_ps(v + 4));
                a2 = _mm_add_ps(a2, _mm_loadu_ps(v + 8));
                a3 = _mm_add_ps(a3, _mm_loadu_ps(v + 12));
            }
        }
        if (divisor > 1) {
            a0 = _mm_div_ps(a0, d);
            a1 = _mm_div_ps(a1, d);
            a2 = _mm_div_ps(a2, d);
            a3 = _mm_div_ps(a3, d);
        }
        if (nt) {
            _mm_stream_ps(dst + i, a0);
            _mm_stream_ps(dst + i + 4, a1);
            _mm_stream_ps(dst + i + 8, a2);
            _mm_stream_ps(dst + i + 12, a3);
        } else {
            _mm_storeu_ps(dst + i, a0);
            _mm_storeu_ps(dst + i + 4, a1);
            _mm_storeu_ps(dst + i + 8, a2);
            _mm_storeu_ps(dst + i + 12, a3);
        }
    }
    if (nt)
        _mm_sfence(); /* weakly ordered stores: fence before the barrier that publishes them */
#else
    (void)nt;
#endif
    for (; i < n; i += 16) {
        size_t m = n - i < 16 ? n - i : 16;
        reduce_f32_run(op, s, nsrc, i, m, divisor, acc);
        memcpy(dst + i, acc, m * sizeof(float));
    }
}

static void reduce_arrays(enum dtype dtype, enum comm_op op, const void *const *srcs, int nsrc, void *dst,
                          size_t n, int divisor, bool nt)
{
    if (dtype == DTYPE_F32) {
        reduce_f32(op, (const float *const *)srcs, nsrc, dst, n, divisor, nt);
        return;
    }
    float acc[BLOCK];
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = n - off < BLOCK ? n - off : BLOCK;
        load_block(dtype, srcs[0], off, m, acc);
        for (int s = 1; s < nsrc; s++)
            combine_block(dtype, op, srcs[s], off, m, acc);
        if (divisor > 1) {
            float d = (float)divisor;
            for (size_t i = 0; i < m; i++)
                acc[i] /= d;
        }
        store_block(dtype, acc, dst, off, m, nt);
    }
}

void comm_reduce_arrays(enum dtype dtype, enum comm_op op, const void *const *srcs, int nsrc, void *dst,
                        size_t n, int divisor)
{
    reduce_arrays(dtype, op, srcs, nsrc, dst, n, divisor, false);
}

void comm_reduce_arrays_stream(enum dtype dtype, enum comm_op op, const void *const *srcs, int nsrc,
                               void *dst, size_t n, int divisor)
{
    reduce_arrays(dtype, op, srcs, nsrc, dst, n, divisor, n * dtype_size(dtype) >= (1u << 20));
}
