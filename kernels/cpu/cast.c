/* dtype conversions f32 <-> bf16 <-> f16, round to nearest even, written with integer bit operations so
 * the result does not depend on the compiler's or CPU's half-precision support. */
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t cast_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign and top payload, force quiet */
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; overflow carries into
     * the exponent and correctly yields inf. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cast_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

static inline uint16_t cast_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t x = u & 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf stays inf; NaN stays NaN (quiet, top payload bits kept) */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (x <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 exactly is a tie, to even = 0) */
            return (uint16_t)sign;
        uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* value = m * 2^(e-150); f16 subnormal unit is 2^-24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (x - 0x38000000u) >> 13; /* rebias exponent 127 -> 15, keep 10 mantissa bits */
    uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is the correct rounding */
    return (uint16_t)(sign | r);
}

static inline float cast_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -f : f;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t kernels_f32_to_bf16(float x)
{
    return cast_f32_to_bf16(x);
}

float kernels_bf16_to_f32(uint16_t x)
{
    return cast_bf16_to_f32(x);
}

uint16_t kernels_f32_to_f16(float x)
{
    return cast_f32_to_f16(x);
}

float kernels_f16_to_f32(uint16_t x)
{
    return cast_f16_to_f32(x);
}

size_t kernels_dtype_size(enum kernels_dtype dtype)
{
    return dtype == KERNELS_F32 ? 4 : 2;
}

int cpu_cast(void *dst, enum kernels_dtype dst_dtype, const void *src, enum kernels_dtype src_dtype,
             size_t n)
{
    if ((unsigned)dst_dtype > KERNELS_F16 || (unsigned)src_dtype > KERNELS_F16)
        return error_set(FSDP_EINVAL, "kernels cpu: cast: unknown dtype %d -> %d", (int)src_dtype,
                         (int)dst_dtype);
    if (n == 0)
        return 0;
    if (!dst || !src)
        return error_set(FSDP_EINVAL, "kernels cpu: cast: NULL buffer");
    if (dst_dtype == src_dtype) {
        memmove(dst, src, n * kernels_dtype_size(dst_dtype));
        return 0;
    }
    /* Every pair goes through f32, which represents bf16 and f16 exactly, so one rounding happens. */
    long nn = (long)n;
#pragma omp parallel for schedule(static) if (nn > CPU_CHUNK)
    for (long i = 0; i < nn; i++) {
        float f;
        switch (src_dtype) {
        case KERNELS_BF16: f = cast_bf16_to_f32(((const uint16_t *)src)[i]); break;
        case KERNELS_F16: f = cast_f16_to_f32(((const uint16_t *)src)[i]); break;
        default: f = ((const float *)src)[i]; break;
        }
        switch (dst_dtype) {
        case KERNELS_BF16: ((uint16_t *)dst)[i] = cast_f32_to_bf16(f); break;
        case KERNELS_F16: ((uint16_t *)dst)[i] = cast_f32_to_f16(f); break;
        default: ((float *)dst)[i] = f; break;
        }
    }
    return 0;
}
