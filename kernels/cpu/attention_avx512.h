/* What the AVX-512 attention tiles of kernels/cpu/attention.c (fp32), attention_cp.c (context-parallel,
 * fp32) and attention_bf16.c (bf16 dot products) share: the target attributes, the exponential, the causal
 * mask of a diagonal tile, the tile epilogues, the 64 x 64 transpose of a query block, the column softmax,
 * the register-blocked tile products (attention.c describes the transposed tile layout) and their software
 * prefetch. Private to the CPU backend. */
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

/* Software prefetch of the rows the next query block (or, after the last block, the next pair) reads
 * first: its q, k, v rows, and in backward its dO, out and dq, dk, dv rows. A pair's rows sit a qkv row
 * apart, beyond what the hardware prefetchers follow, and once the batch outgrows the cache each new
 * block otherwise waits on a few hundred misses. The tile loops issue a few rows per register block, so
 * the misses overlap the FMAs instead of queueing all at once. */
#define ATT_PF_STREAMS 8
struct att_pf {
    const float *base[ATT_PF_STREAMS]; /* row 0 of each stream (a head's 64 floats of it) */
    size_t ld[ATT_PF_STREAMS];
    unsigned char write[ATT_PF_STREAMS];
    int nstreams, r0, total, pos, step; /* items are (row, stream), row = r0 + item / nstreams */
    int row, st;                        /* item pos's row and stream, kept as counters: no division */
};

#if ATT_HAVE_AVX512
#include <immintrin.h>

/* common/dtype.h's 16-lane bf16 rounding, dtype_f32x16_to_bf16_hi, for the bf16 tiles */
#define DTYPE_AVX512 1
#include "common/dtype.h"

#define ATT_TARGET __attribute__((target("avx512f,fma")))
/* The tile loops are whole functions in every file that includes this one, so each file's calls with
 * constant arguments (epilogue, trim) can be specialised; files that use none of them compile none. */
#define ATT_UNUSED __attribute__((unused))
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

/* Sliding window: query r of a tile (relative to its query block) sees key j (relative to its key block) only
 * while r < j + wo, wo = k0 - q0 + window the tile's window offset; ATT_NO_WINDOW for full causal attention.
 * The lanes of vector v that key row j may see under that rule. */
#define ATT_NO_WINDOW (1 << 24)
static inline __mmask16 att_window_mask(int j, int v, int wo)
{
    int sh = j + wo - 16 * v;
    return sh >= 16 ? (__mmask16)0xFFFF : sh <= 0 ? (__mmask16)0 : (__mmask16)((1u << sh) - 1u);
}

/* A query block's first key tile (64-aligned) under a window: tiles whose last key is before every query's
 * window are skipped whole. */
static inline int att_window_k0(int q0, int window)
{
    int lo = q0 - window + 1; /* the first query's first visible key */
    return window > 0 && lo > 0 ? lo / 64 * 64 : 0;
}

/* The window offset of the tile (q0, k0) for att_window_mask. */
static inline int att_window_wo(int q0, int k0, int window)
{
    return window > 0 ? k0 - q0 + window : ATT_NO_WINDOW;
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

/* The accumulators of rows 0 .. R-1 of a score tile set to 0, from vector V0 on (those before it are not
 * computed; see att_rows_epilogue). */
ATT_INLINE void att_rows_zero(const int R, const int V0, __m512 acc[ATT_R][4])
{
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = V0; v < 4; v++)
            acc[i][v] = _mm512_setzero_ps();
}

/* The epilogue of rows j .. j+R-1 of a transposed score tile dst (ld 64), their sums in acc (vectors below V0
 * not computed: masked for every row of the block on a diagonal tile, so only filled with the masked value):
 * the scores (-inf where masked), P = exp(s - colv) (0 where masked) or dS = pt (s - colv) scale. The fp32 and
 * bf16 tile products (attention_bf16.c) end with it. */
ATT_INLINE void att_rows_epilogue(const int R, const int V0, enum att_epi epi, float *dst, __m512 acc[ATT_R][4],
                                  int j, int diag, int wo, const float *colv, const float *pt, float scale)
{
    const __m512 masked = _mm512_set1_ps(epi == ATT_EPI_SCORES ? -INFINITY : 0.0f);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            float *o = dst + (size_t)(j + i) * 64 + 16 * v;
            if (v < V0) {
                _mm512_storeu_ps(o, masked);
                continue;
            }
            __mmask16 m = (diag ? att_diag_mask(j + i, v) : (__mmask16)0xFFFF) & att_window_mask(j + i, v, wo);
            __m512 s = acc[i][v];
            if (epi == ATT_EPI_SCORES)
                s = _mm512_mask_mov_ps(masked, m, s);
            else if (epi == ATT_EPI_PROBS)
                s = _mm512_maskz_mov_ps(m, att_exp512(_mm512_sub_ps(s, _mm512_loadu_ps(colv + 16 * v))));
            else
                s = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(pt + (size_t)(j + i) * 64 + 16 * v),
                                                _mm512_sub_ps(s, _mm512_loadu_ps(colv + 16 * v))),
                                  _mm512_set1_ps(scale));
            _mm512_storeu_ps(o, s);
        }
}

/* Rows j .. j+R-1 of a transposed tile dst (ld 64): dst[j][r] = sum_d x[j][d] yt[d][r], x rows with
 * leading dimension ldx, yt the transposed 64 x 64 query (or dO) block; then the epilogue. Vectors below
 * V0 (queries before 16 V0) are masked for every row of the block on a diagonal tile: they are not
 * computed, only filled with the masked value. */
ATT_INLINE void att_rows_xyt(const int R, const int V0, enum att_epi epi, float *dst, const float *x,
                             size_t ldx, const float *yt, int j, int diag, int wo, const float *colv,
                             const float *pt, float scale)
{
    __m512 acc[ATT_R][4];
    att_rows_zero(R, V0, acc);
    const float *xj = x + (size_t)j * ldx;
    for (int d = 0; d < 64; d++) {
        __m512 y[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            y[v] = _mm512_loadu_ps(yt + d * 64 + 16 * v);
        ATT_IN_REGS(y[0], y[1], y[2], y[3]);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 b = _mm512_set1_ps(xj[(size_t)i * ldx + d]);
#pragma GCC unroll 4
            for (int v = V0; v < 4; v++)
                acc[i][v] = _mm512_fmadd_ps(b, y[v], acc[i][v]);
        }
    }
    att_rows_epilogue(R, V0, epi, dst, acc, j, diag, wo, colv, pt, scale);
}

ATT_UNUSED static void att_pf_start(struct att_pf *pf, int r0, int r1, int iters)
{
    pf->r0 = r0;
    pf->total = r1 > r0 ? (r1 - r0) * pf->nstreams : 0;
    pf->pos = 0;
    pf->row = r0;
    pf->st = 0;
    pf->step = iters > 0 ? (pf->total + iters - 1) / iters : pf->total;
}

ATT_UNUSED static inline void att_pf_issue(struct att_pf *pf)
{
    if (!pf)
        return;
    int end = pf->pos + pf->step < pf->total ? pf->pos + pf->step : pf->total;
    for (; pf->pos < end; pf->pos++) {
        int st = pf->st, row = pf->row;
        if (++pf->st == pf->nstreams)
            pf->st = 0, pf->row++;
        const float *p = pf->base[st] + (size_t)row * pf->ld[st];
        if (pf->write[st])
            for (int d = 0; d < 64; d += 16)
                __builtin_prefetch(p + d, 1, 3);
        else
            for (int d = 0; d < 64; d += 16)
                __builtin_prefetch(p + d, 0, 2); /* to L2: L1 holds the tiles */
    }
}

ATT_TARGET ATT_UNUSED static void att_tile_xyt(enum att_epi epi, float *dst, const float *x, size_t ldx,
                                               const float *yt, int n, int diag, int wo, const float *colv,
                                               const float *pt, float scale, struct att_pf *pf)
{
    int j = 0;
    for (; j + ATT_R <= n; j += ATT_R) {
        att_pf_issue(pf);
        /* on the diagonal, key j is invisible to queries r < j: whole vectors below j / 16 for the block */
        switch (diag ? j / 16 : 0) {
        case 0: att_rows_xyt(ATT_R, 0, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
        case 1: att_rows_xyt(ATT_R, 1, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
        case 2: att_rows_xyt(ATT_R, 2, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
        default: att_rows_xyt(ATT_R, 3, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
        }
    }
    /* the last few rows (t not a multiple of ATT_R) are computed whole */
    switch (n - j) {
    case 3: att_rows_xyt(3, 0, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
    case 2: att_rows_xyt(2, 0, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
    case 1: att_rows_xyt(1, 0, epi, dst, x, ldx, yt, j, diag, wo, colv, pt, scale); break;
    default: break;
    }
}

/* The accumulators of output rows 0 .. R-1 of out (ld ldo, 64 wide) before a tile's products are added: 0
 * (zero), or the rows as they are, rescaled by alpha[i] where alpha is given; and their store after. */
ATT_INLINE void att_rows_load(const int R, __m512 acc[ATT_R][4], const float *out, size_t ldo, const float *alpha,
                              int zero)
{
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            acc[i][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(out + (size_t)i * ldo + 16 * v);
        if (alpha && !zero) {
            __m512 a = _mm512_set1_ps(alpha[i]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
                acc[i][v] = _mm512_mul_ps(acc[i][v], a);
        }
    }
}

ATT_INLINE void att_rows_store(const int R, __m512 acc[ATT_R][4], float *out, size_t ldo)
{
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm512_storeu_ps(out + (size_t)i * ldo + 16 * v, acc[i][v]);
}

/* Rows o .. o+R-1 of out (ld ldo, 64 wide): out[o+i] = (zero ? 0 : alpha ? alpha[i] out[o+i] : out[o+i])
 * + sum_{x0 <= x < x1} coef[i*so + x*sx] z[x], z rows with leading dimension ldz. out, coef, alpha point
 * at row o's entries. */
ATT_INLINE void att_rows_acc(const int R, float *out, size_t ldo, const float *coef, size_t so, size_t sx,
                             const float *z, size_t ldz, int x0, int x1, const float *alpha, int zero)
{
    __m512 acc[ATT_R][4];
    att_rows_load(R, acc, out, ldo, alpha, zero);
    for (int x = x0; x < x1; x++) {
        const float *zx = z + (size_t)x * ldz;
        __m512 z0 = _mm512_loadu_ps(zx), z1 = _mm512_loadu_ps(zx + 16);
        __m512 z2 = _mm512_loadu_ps(zx + 32), z3 = _mm512_loadu_ps(zx + 48);
        ATT_IN_REGS(z0, z1, z2, z3);
        const float *cx = coef + (size_t)x * sx;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 b = _mm512_set1_ps(cx[(size_t)i * so]);
            acc[i][0] = _mm512_fmadd_ps(b, z0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(b, z1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(b, z2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(b, z3, acc[i][3]);
        }
    }
    att_rows_store(R, acc, out, ldo);
}

/* n output rows in blocks of ATT_R. The contraction of block o runs over x in [lo, hi) where, on a
 * diagonal tile (causal), lo = o (rows indexed by key: queries before the key see nothing) or
 * hi = o + R (rows indexed by query: keys after the block are invisible); masked coefficients are 0, so
 * trimming only skips work. */
enum att_trim { ATT_TRIM_NONE, ATT_TRIM_LO, ATT_TRIM_HI };

ATT_TARGET ATT_UNUSED static void att_tile_acc(float *out, size_t ldo, int n, const float *coef, size_t so,
                                               size_t sx, const float *z, size_t ldz, int nx, enum att_trim trim,
                                               const float *alpha, int zero, struct att_pf *pf)
{
    int o = 0;
    for (; o < n; o += ATT_R) {
        att_pf_issue(pf);
        int R = n - o < ATT_R ? n - o : ATT_R;
        int x0 = trim == ATT_TRIM_LO ? o : 0, x1 = trim == ATT_TRIM_HI ? (o + R < nx ? o + R : nx) : nx;
        float *ob = out + (size_t)o * ldo;
        const float *cb = coef + (size_t)o * so, *ab = alpha ? alpha + o : NULL;
        switch (R) {
        case ATT_R: att_rows_acc(ATT_R, ob, ldo, cb, so, sx, z, ldz, x0, x1, ab, zero); break;
        case 3: att_rows_acc(3, ob, ldo, cb, so, sx, z, ldz, x0, x1, ab, zero); break;
        case 2: att_rows_acc(2, ob, ldo, cb, so, sx, z, ldz, x0, x1, ab, zero); break;
        default: att_rows_acc(1, ob, ldo, cb, so, sx, z, ldz, x0, x1, ab, zero); break;
        }
    }
}

#endif
#endif
