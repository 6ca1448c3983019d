/* Element types of tensors and messages (f32, bf16, f16), their sizes, and the conversions between them:
 * one definition that the CPU kernels, the CUDA kernels and the collectives all use, so every path rounds
 * to the same bits.
 *
 * f32 -> bf16 and f32 -> f16 round to nearest, ties to even, written with integer bit operations so the
 * result depends neither on the compiler's or processor's half-precision support nor on the floating-point
 * environment (rounding mode, flush-to-zero):
 * - NaN stays NaN: sign and top payload bits are kept and the quiet bit is set (rounding the bits as a
 *   number could carry a NaN into inf). bf16/f16 -> f32 keeps the bits as they are.
 * - f32 -> bf16 overflows to inf by the carry of the rounding; f32 -> f16 gives inf from 65520 (halfway
 *   between 65504, the largest f16, and 2^16) up.
 * - Subnormals are produced and read exactly.
 * Any other pair converts through f32, which holds bf16 and f16 exactly, so one rounding happens.
 *
 * Everything here is static inline and marked DTYPE_HD, so C sources and CUDA device code (nvcc) compile
 * the same functions. This is the only place that rounds to bf16 or f16: dtype_f32_bits_to_bf16 (the
 * branch-free scalar form, for loops that vectorise) and dtype_f32x16_to_bf16_hi (16 lanes of AVX-512, at
 * the end of the file) give dtype_f32_to_bf16's bits. */
#ifndef FSDP_COMMON_DTYPE_H
#define FSDP_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DTYPE_HD __host__ __device__
#else
#define DTYPE_HD
#endif

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_BF16 = 1, /* bfloat16 bits in uint16_t */
    DTYPE_F16 = 2,  /* IEEE binary16 bits in uint16_t */
};

/* The bit of dtype d in a set of dtypes (e.g. struct kernels.matmul_dtypes). */
#define DTYPE_BIT(d) (1u << (unsigned)(d))

/* Whether d is one of the values above (an int from a file or a caller). */
static inline DTYPE_HD int dtype_valid(enum dtype d)
{
    return (unsigned)d <= (unsigned)DTYPE_F16;
}

/* Bytes of one element: 4 for f32, 2 for the 16-bit types. */
static inline DTYPE_HD size_t dtype_size(enum dtype d)
{
    return d == DTYPE_F32 ? 4 : 2;
}

/* "f32", "bf16", "f16"; "?" for a value outside the enum. */
static inline const char *dtype_name(enum dtype d)
{
    switch (d) {
    case DTYPE_F32: return "f32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_F16: return "f16";
    }
    return "?";
}

static inline DTYPE_HD uint32_t dtype_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static inline DTYPE_HD float dtype_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

static inline DTYPE_HD uint16_t dtype_f32_to_bf16(float f)
{
    uint32_t u = dtype_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign and top payload, force quiet */
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; overflow carries into the
     * exponent and correctly yields inf. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* dtype_f32_to_bf16 of the float with bits u, written as branch-free integer operations, so that loops
 * calling it vectorise (the NaN branch above keeps GCC from it); the same bits. */
static inline DTYPE_HD uint16_t dtype_f32_bits_to_bf16(uint32_t u)
{
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)(nan ? quiet : rounded);
}

static inline DTYPE_HD float dtype_bf16_to_f32(uint16_t h)
{
    return dtype_bits_f32((uint32_t)h << 16);
}

static inline DTYPE_HD uint16_t dtype_f32_to_f16(float f)
{
    uint32_t u = dtype_f32_bits(f);
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

static inline DTYPE_HD float dtype_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return dtype_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24: exact, and a normal f32 */
        return sign ? -f : f;
    }
    return dtype_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Element i of a buffer of type d, as f32 (exact). */
static inline DTYPE_HD float dtype_load_f32(enum dtype d, const void *buf, size_t i)
{
    if (d == DTYPE_BF16)
        return dtype_bf16_to_f32(((const uint16_t *)buf)[i]);
    if (d == DTYPE_F16)
        return dtype_f16_to_f32(((const uint16_t *)buf)[i]);
    return ((const float *)buf)[i];
}

/* Stores f as element i of a buffer of type d, rounded to nearest even. */
static inline DTYPE_HD void dtype_store_f32(enum dtype d, void *buf, size_t i, float f)
{
    if (d == DTYPE_BF16)
        ((uint16_t *)buf)[i] = dtype_f32_to_bf16(f);
    else if (d == DTYPE_F16)
        ((uint16_t *)buf)[i] = dtype_f32_to_f16(f);
    else
        ((float *)buf)[i] = f;
}

#endif /* FSDP_COMMON_DTYPE_H */

/* The 16-lane AVX-512 form of dtype_f32_to_bf16, for the files that already compile AVX-512 functions:
 * they define DTYPE_AVX512 before including this header. No file is built with -mavx512f; the functions
 * that use this one carry target("avx512f,...") attributes (kernels/cpu/attention_avx512.h) and run only
 * where the CPU has AVX-512, so this function carries target("avx512f") and is always inlined into them.
 * It sits outside the include guard, so a file that included this header before defining DTYPE_AVX512
 * still gets it. */
#if defined(DTYPE_AVX512) && !defined(FSDP_COMMON_DTYPE_AVX512_H) && !defined(__CUDACC__)
#define FSDP_COMMON_DTYPE_AVX512_H
#if !defined(__x86_64__) || !defined(__GNUC__)
#error "DTYPE_AVX512 needs GCC or Clang on x86-64"
#endif
#include <immintrin.h>

/* Lanes of x rounded to bf16 as dtype_f32_to_bf16 rounds (nearest even, NaN kept and made quiet): the bf16
 * in the upper half of each 32-bit lane, the lower half not cleared (shift or mask it). */
__attribute__((target("avx512f"), always_inline)) static inline __m512i dtype_f32x16_to_bf16_hi(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}
#endif
