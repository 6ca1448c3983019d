/* Element types and the reductions every CPU path uses. Reductions run over blocks through an f32
 * scratch so that bf16/f16 are rounded once, and so that the per-element order of operations is fixed
 * (source 0, then 1, ...) whatever the aliasing of dst: that order is what makes f32 sums reproducible. */
#include "comm/comm_internal.h"

#include <string.h>

size_t comm_dtype_size(enum comm_dtype dtype)
{
    return dtype == COMM_F32 ? 4 : 2;
}

const char *comm_dtype_name(enum comm_dtype dtype)
{
    switch (dtype) {
    case COMM_F32: return "f32";
    case COMM_BF16: return "bf16";
    case COMM_F16: return "f16";
    }
    return "?";
}

float comm_bf16_to_f32(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t comm_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN, rounding could make it inf */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* GCC 12 on x86-64 has _Float16 with correct IEEE rounding in conversions. */
float comm_f16_to_f32(uint16_t v)
{
    _Float16 h;
    memcpy(&h, &v, 2);
    return (float)h;
}

uint16_t comm_f32_to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t v;
    memcpy(&v, &h, 2);
    return v;
}

enum { BLOCK = 2048 };

static void load_block(enum comm_dtype dtype, const void *src, size_t off, size_t n, float *acc)
{
    if (dtype == COMM_F32) {
        memcpy(acc, (const float *)src + off, n * 4);
    } else if (dtype == COMM_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (size_t i = 0; i < n; i++)
            acc[i] = comm_bf16_to_f32(s[i]);
    } else {
        const _Float16 *s = (const _Float16 *)src + off;
        for (size_t i = 0; i < n; i++)
            acc[i] = (float)s[i];
    }
}

static void combine_block(enum comm_dtype dtype, enum comm_op op, const void *src, size_t off, size_t n,
                          float *acc)
{
    float tmp[BLOCK];
    const float *v;
    if (dtype == COMM_F32) {
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

static void store_block(enum comm_dtype dtype, const float *acc, void *dst, size_t off, size_t n, bool nt)
{
    if (dtype == COMM_F32) {
        if (nt)
            comm_copy_nt((float *)dst + off, acc, n * 4);
        else
            memcpy((float *)dst + off, acc, n * 4);
    } else if (dtype == COMM_BF16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (size_t i = 0; i < n; i++)
            d[i] = comm_f32_to_bf16(acc[i]);
    } else {
        _Float16 *d = (_Float16 *)dst + off;
        for (size_t i = 0; i < n; i++)
            d[i] = (_Float16)acc[i];
    }
}

static void reduce_arrays(enum comm_dtype dtype, enum comm_op op, const void *const *srcs, int nsrc, void *dst,
                          size_t n, int divisor, bool nt)
{
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

void comm_reduce_arrays(enum comm_dtype dtype, enum comm_op op, const void *const *srcs, int nsrc, void *dst,
                        size_t n, int divisor)
{
    reduce_arrays(dtype, op, srcs, nsrc, dst, n, divisor, false);
}

void comm_reduce_arrays_stream(enum comm_dtype dtype, enum comm_op op, const void *const *srcs, int nsrc,
                               void *dst, size_t n, int divisor)
{
    reduce_arrays(dtype, op, srcs, nsrc, dst, n, divisor, n * comm_dtype_size(dtype) >= (1u << 20));
}
