/* What the AVX-512 attention tiles of kernels/cpu/attention.c (fp32) and attention_bf16.c (bf16 dot
 * products) share: the target attributes, the exponential, the causal mask of a diagonal tile, the tile
 * epilogues, the 64 x 64 transpose of a query block and the column softmax. Private to the CPU backend. */
#ifndef FSDP_KERNELS_CPU_ATTENTION_AVX512_H
#define FSDP_KERNELS_CPU_ATTENTION_AVX512_H

#include <math.h>
#include <stddef.h>

/* hs = 64 on a CPU with AVX-512 takes the register-blocked tiles below instead of sgemm; the baseline-only
 * build (KERNELS_NO_SIMD_CLONES) keeps the sgemm path everywhere, so it can be tested on any machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(KERNELS_NO_SIMD_CLONES)
#define ATT_HAVE_AVX512 1
#else
#define ATT_HAVE_AVX512 0
#endif

#if ATT_HAVE_AVX512
#include <immintrin.h>

#define ATT_TARGET __attribute__((target("avx512f,fma")))
#define ATT_INLINE __attribute__((target("avx512f,fma"), always_inline)) static inline
#define ATT_R 4 /* output rows per register block: 16 accumulators + 4 row loads + 1 broadcast */

/* Left alone, GCC folds the four row loads into every FMA as memory operands, loading each row R times
 * per step: the load ports, not the FMA units, then bound the kernels. An empty asm that "modifies" the
 * registers makes the loaded values opaque, so each row is loaded once and reused from registers. */
#define ATT_IN_REGS(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))

/* fastmath_expf on 16 lanes in half the instructions: with t = x log2 e, n = round(t) (vrndscaleps) and
 * r = t - n (exact), 2^r by a degree-5 polynomial on [-1/2, 1/2] (relative error 1.7e-7 in float, within
 * fastmath_expf's 2 ulp) and 2^n by vscalefps: ten instructions, five of them FMAs, against twenty-one
 * (Cody-Waite reduction, degree-7 form, exponent bits built by hand). The column softmax of the forward
 * pass (an eighth of it) runs 1.5x faster, the backward's probability tile 1.05x. The argument is a score
 * minus its column's maximum or its row's log-sum-exp, never far above 0, so there is no upper clamp;
 * below -87.3 (and -inf, the masked scores) gives exactly 0, as fastmath_expf does. Scaling the query
 * block by log2(e)/sqrt(hs) instead (one multiply less here) costs accuracy: 1/sqrt(64) is a power of
 * two and log2(e)/8 is not, and that rounding took the large-score test from 0.52 to 0.76 of its
 * tolerance. */
ATT_INLINE __m512 att_exp512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-126.0f);
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __mmask16 keep = _mm512_cmp_ps_mask(t, lo, _CMP_NLT_UQ);
    t = _mm512_max_ps(t, lo);
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3264727313e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6715129912e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5507335812e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022242427e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314700365e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* Lanes of vector v (queries 16v .. 16v+15) that key row j of a diagonal tile may see: query r sees key
 * j when r >= j. */
static inline __mmask16 att_diag_mask(int j, int v)
{
    int sh = j - 16 * v;
    return sh <= 0 ? (__mmask16)0xFFFF : sh >= 16 ? (__mmask16)0 : (__mmask16)(0xFFFFu << sh);
}

enum att_epi {
    ATT_EPI_SCORES, /* forward: store the scores, -inf where masked */
    ATT_EPI_PROBS,  /* backward: P = exp(s - lse[r]), 0 where masked */
    ATT_EPI_DS,     /* backward: dS = P (dP - D[r]) scale, P read from pt (0 where masked) */
};

/* In-register transpose of 16 rows of 16: after it, x[k] holds column k. Three rounds of shuffles, each
 * swapping ever larger blocks: 1 x 1 (unpack), 2 x 2 inside 128-bit lanes, then whole lanes. */
ATT_INLINE void att_transpose16(__m512 x[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
    }
    /* lane L of x[4a + k] = column 4L + k of rows 4a .. 4a+3 */
    for (int a = 0; a < 16; a += 4) {
        x[a] = _mm512_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(1, 0, 1, 0));
        x[a + 1] = _mm512_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(3, 2, 3, 2));
        x[a + 2] = _mm512_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(1, 0, 1, 0));
        x[a + 3] = _mm512_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* lanes (0, 2) and (1, 3) of row groups 0/1 and 2/3 */
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_shuffle_f32x4(x[k], x[k + 4], 0x88);
        t[k + 4] = _mm512_shuffle_f32x4(x[k], x[k + 4], 0xdd);
        t[k + 8] = _mm512_shuffle_f32x4(x[k + 8], x[k + 12], 0x88);
        t[k + 12] = _mm512_shuffle_f32x4(x[k + 8], x[k + 12], 0xdd);
    }
    for (int k = 0; k < 8; k++) {
        x[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        x[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}

/* dst[d][r] = s src[r][d] for r < n, 0 for n <= r < 64: the transposed query (or dO) block, in 16 x 16
 * blocks (element-wise it is a strided store per float, as slow as a third of a tile product). */
ATT_TARGET static inline void att_transpose64(float *dst, const float *src, size_t lds, int n, float s)
{
    const __m512 vs = _mm512_set1_ps(s);
    for (int rb = 0; rb < 64; rb += 16)
        for (int db = 0; db < 64; db += 16) {
            __m512 x[16];
            for (int i = 0; i < 16; i++)
                x[i] = rb + i < n ? _mm512_mul_ps(_mm512_loadu_ps(src + (size_t)(rb + i) * lds + db), vs)
                                  : _mm512_setzero_ps();
            att_transpose16(x);
            for (int k = 0; k < 16; k++)
                _mm512_storeu_ps(dst + (size_t)(db + k) * 64 + rb, x[k]);
        }
}

/* Online softmax down the columns of the score tile (nk key rows): new running max, probabilities
 * exp(s - m) in place, running sum rescaled, and alpha = exp(m_old - m_new) for the output rows. On a
 * diagonal tile, key rows from 16 (v + 1) on are masked (-inf) for every query of vector v: they are left
 * alone, as the product with v never reads them (its contraction for queries r stops at key r). */
ATT_TARGET static inline void att_softmax_cols(float *st, int nk, int diag, float *m, float *l, float *alpha)
{
    for (int v = 0; v < 4; v++) {
        __m512 mold = _mm512_loadu_ps(m + 16 * v), mx = mold;
        const int nj = diag && 16 * (v + 1) < nk ? 16 * (v + 1) : nk;
        for (int j = 0; j < nj; j++)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + j * 64 + 16 * v));
        /* a column with nothing visible yet keeps -inf; subtract 0 there so no inf - inf appears */
        __m512 msub = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                                         _mm512_setzero_ps());
        __m512 a = att_exp512(_mm512_sub_ps(mold, msub)), sum = _mm512_setzero_ps();
        for (int j = 0; j < nj; j++) {
            __m512 p = att_exp512(_mm512_sub_ps(_mm512_loadu_ps(st + j * 64 + 16 * v), msub));
            _mm512_storeu_ps(st + j * 64 + 16 * v, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v), a, sum));
        _mm512_storeu_ps(m + 16 * v, mx);
        _mm512_storeu_ps(alpha + 16 * v, a);
    }
}

#endif
#endif
