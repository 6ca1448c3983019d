/* Causal attention of one (batch, head) pair with bf16 products, for head size 64 on a CPU with AVX512_BF16:
 * the tiles of attention.c's AVX-512 path with every product (S = Q K^T, O = P V; backward P again,
 * dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q) on vdpbf16ps, which multiplies pairs of bf16 values and
 * adds both products to an fp32 lane: twice the multiply-adds of an fp32 FMA per instruction. The softmax
 * statistics (running max and sum, log-sum-exp, D = rowsum(dO O)) and every accumulation stay fp32; the
 * probabilities and dS are rounded to bf16 only as operands of the products that read them, the sum l is of
 * the unrounded probabilities (as PyTorch's CPU flash attention does).
 *
 * vdpbf16ps pairs elements along the contraction: lane r of the result gains x[2e] y_r[2e] + x[2e+1]
 * y_r[2e+1]. So one operand is broadcast as a 32-bit pair (two neighbours along the contraction, which a
 * row-major bf16 row holds) and the other is a vector of 16 such pairs, one per output lane: the "pair
 * layout" P[e][lane] = (Z[2e][lane], Z[2e+1][lane]) of a matrix Z whose rows run along the contraction.
 * Per pair the kernels build, once, what every query block reads: K and V as bf16 rows (broadcast operands
 * of S^T = K Q^T and dP^T = V dO^T) and V, K, Q, dO in pair layout (vector operands of P V, dS K, dS^T Q,
 * P^T dO); per query block the transposed scaled Q (and dO) in pair layout; per tile the probabilities and dS
 * in the layout their product needs. Rounding is common/dtype.h's (nearest even, NaN kept). */
#include <string.h>

#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu.h"

#if ATT_HAVE_AVX512

#define ATT16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,fma")))
#define ATT16_INLINE __attribute__((target("avx512f,avx512bw,avx512bf16,fma"), always_inline)) static inline

/* Bytes of the pieces of a slot: fp32 64 x 64 tiles, 32 x 64 pair tiles (4096 bf16 either way), and per-pair
 * layouts of ceil(t / 2) pair rows of 64 lanes. */
#define T32_BYTES (64 * 64 * 4)
#define T16_BYTES (64 * 64 * 2)

static size_t pair_rows_bytes(int t)
{
    return ((size_t)(t + 1) / 2) * 64 * 4;
}

size_t cpu_att16_slot_bytes(int t)
{
    return 4 * T32_BYTES + 5 * T16_BYTES + 5 * pair_rows_bytes(t);
}

int cpu_att16_usable(int hs)
{
    return hs == 64 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
}

/* 16 pairs (a[i], b[i]) as 32-bit lanes: a in the low half (the even element of the pair). */
ATT16_INLINE __m512i att16_pairs(__m512 a, __m512 b)
{
    return _mm512_or_si512(_mm512_srli_epi32(dtype_f32x16_to_bf16_hi(a), 16),
                           _mm512_and_si512(dtype_f32x16_to_bf16_hi(b), _mm512_set1_epi32((int)0xffff0000u)));
}

/* Rows [0, n) of src (64 floats each, leading dimension ld) as bf16 rows, 32 pairs each; zero rows from n
 * up to rows. */
ATT16_TARGET static void att16_rows(uint32_t *dst, const float *src, size_t ld, int n, int rows)
{
    for (int j = 0; j < rows; j++)
        for (int v = 0; v < 4; v++) {
            __m256i h = j < n ? _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                                    dtype_f32x16_to_bf16_hi(_mm512_loadu_ps(src + (size_t)j * ld + 16 * v)), 16))
                              : _mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(dst + (size_t)j * 32 + 8 * v), h);
        }
}

/* Pair layout of rows [0, n) of src (64 lanes each, leading dimension ld): dst[e][lane] = (src[2e][lane],
 * src[2e+1][lane]), rows from n on read as 0, for pair rows e < ceil(rows / 2). With clamp, negative values
 * (the -inf of masked scores left in a probability tile) become 0. */
ATT16_TARGET static void att16_pair_rows(uint32_t *dst, const float *src, size_t ld, int n, int rows, int clamp)
{
    const __m512 zero = _mm512_setzero_ps();
    for (int e = 0; 2 * e < rows; e++)
        for (int v = 0; v < 4; v++) {
            __m512 a = 2 * e < n ? _mm512_loadu_ps(src + (size_t)(2 * e) * ld + 16 * v) : zero;
            __m512 b = 2 * e + 1 < n ? _mm512_loadu_ps(src + (size_t)(2 * e + 1) * ld + 16 * v) : zero;
            if (clamp) /* max(0, x) keeps a NaN x (maxps returns its second operand when one is NaN) */
                a = _mm512_max_ps(zero, a), b = _mm512_max_ps(zero, b);
            _mm512_storeu_si512(dst + (size_t)e * 64 + 16 * v, att16_pairs(a, b));
        }
}

/* Rows j .. j+R-1 of the transposed tile dst: dst[j][r] = sum_d x[j][d] yt[d][r], x the bf16 rows (32 pairs
 * each) of k or v, ytp the pair layout of the transposed (scaled) query or dO block; then att_rows_epilogue. */
ATT16_INLINE void att16_rows_xyt(const int R, const int V0, enum att_epi epi, float *dst, const uint32_t *x,
                                 const uint32_t *ytp, int j, int diag, int wo, const float *colv,
                                 const float *pt, float scale)
{
    __m512 acc[ATT_R][4];
    att_rows_zero(R, V0, acc);
    const uint32_t *xj = x + (size_t)j * 32;
    for (int e = 0; e < 32; e++) {
        __m512i y0 = _mm512_loadu_si512(ytp + e * 64), y1 = _mm512_loadu_si512(ytp + e * 64 + 16);
        __m512i y2 = _mm512_loadu_si512(ytp + e * 64 + 32), y3 = _mm512_loadu_si512(ytp + e * 64 + 48);
        ATT_IN_REGS(y0, y1, y2, y3);
        const __m512i y[4] = {y0, y1, y2, y3};
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512i b = _mm512_set1_epi32((int)xj[(size_t)i * 32 + e]);
#pragma GCC unroll 4
            for (int v = V0; v < 4; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)b, (__m512bh)y[v]);
        }
    }
    att_rows_epilogue(R, V0, epi, dst, acc, j, diag, wo, colv, pt, scale);
}

ATT16_TARGET static void att16_tile_xyt(enum att_epi epi, float *dst, const uint32_t *x, const uint32_t *ytp, int n,
                                        int diag, int wo, const float *colv, const float *pt, float scale)
{
    int j = 0;
    for (; j + ATT_R <= n; j += ATT_R) {
        switch (diag ? j / 16 : 0) {
        case 0: att16_rows_xyt(ATT_R, 0, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
        case 1: att16_rows_xyt(ATT_R, 1, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
        case 2: att16_rows_xyt(ATT_R, 2, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
        default: att16_rows_xyt(ATT_R, 3, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
        }
    }
    switch (n - j) {
    case 3: att16_rows_xyt(3, 0, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
    case 2: att16_rows_xyt(2, 0, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
    case 1: att16_rows_xyt(1, 0, epi, dst, x, ytp, j, diag, wo, colv, pt, scale); break;
    default: break;
    }
}

/* Rows o .. o+R-1 of out (ld ldo, 64 wide): out[o+i] = (zero ? 0 : alpha ? alpha[i] out[o+i] : out[o+i])
 * + sum over pairs e0 <= e < e1 of coef pair (i, e) . zp[e], coef pairs at coef[i*so + e*sx] (32-bit units),
 * zp the pair layout of the rows along the contraction. */
ATT16_INLINE void att16_rows_acc(const int R, float *out, size_t ldo, const uint32_t *coef, size_t so, size_t sx,
                                 const uint32_t *zp, int e0, int e1, const float *alpha, int zero)
{
    __m512 acc[ATT_R][4];
    att_rows_load(R, acc, out, ldo, alpha, zero);
    for (int e = e0; e < e1; e++) {
        const uint32_t *ze = zp + (size_t)e * 64;
        __m512i z0 = _mm512_loadu_si512(ze), z1 = _mm512_loadu_si512(ze + 16);
        __m512i z2 = _mm512_loadu_si512(ze + 32), z3 = _mm512_loadu_si512(ze + 48);
        ATT_IN_REGS(z0, z1, z2, z3);
        const uint32_t *ce = coef + (size_t)e * sx;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)ce[(size_t)i * so]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], b, (__m512bh)z0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], b, (__m512bh)z1);
            acc[i][2] = _mm512_dpbf16_ps(acc[i][2], b, (__m512bh)z2);
            acc[i][3] = _mm512_dpbf16_ps(acc[i][3], b, (__m512bh)z3);
        }
    }
    att_rows_store(R, acc, out, ldo);
}

/* n output rows in blocks of ATT_R; on a diagonal tile the contraction of block o starts at o (lo: rows are
 * keys) or stops after o + R (hi: rows are queries), rounded out to whole pairs: the coefficients past the
 * causal limit are 0 in the tile, and those past nx are 0 padding. */
ATT16_TARGET static void att16_tile_acc(float *out, size_t ldo, int n, const uint32_t *coef, size_t so, size_t sx,
                                        const uint32_t *zp, int nx, int trim_lo, int trim_hi, const float *alpha,
                                        int zero)
{
    for (int o = 0; o < n; o += ATT_R) {
        int R = n - o < ATT_R ? n - o : ATT_R;
        int x0 = trim_lo ? o : 0, x1 = trim_hi ? (o + R < nx ? o + R : nx) : nx;
        int e0 = x0 / 2, e1 = (x1 + 1) / 2;
        float *ob = out + (size_t)o * ldo;
        const uint32_t *cb = coef + (size_t)o * so;
        const float *ab = alpha ? alpha + o : NULL;
        switch (R) {
        case ATT_R: att16_rows_acc(ATT_R, ob, ldo, cb, so, sx, zp, e0, e1, ab, zero); break;
        case 3: att16_rows_acc(3, ob, ldo, cb, so, sx, zp, e0, e1, ab, zero); break;
        case 2: att16_rows_acc(2, ob, ldo, cb, so, sx, zp, e0, e1, ab, zero); break;
        default: att16_rows_acc(1, ob, ldo, cb, so, sx, zp, e0, e1, ab, zero); break;
        }
    }
}

/* The slot's pieces, in the order cpu_att16_slot_bytes counts them. */
struct att16_ws {
    float *f[4];     /* fp32 64 x 64 tiles */
    uint32_t *h[5];  /* bf16 64 x 64 tiles (32 x 64 pairs) */
    uint32_t *p[5];  /* per-pair layouts, ceil(t / 2) x 64 pairs */
};

static void att16_carve(struct att16_ws *w, void *ws, int t)
{
    char *at = ws;
    for (int i = 0; i < 4; i++, at += T32_BYTES)
        w->f[i] = (float *)at;
    for (int i = 0; i < 5; i++, at += T16_BYTES)
        w->h[i] = (uint32_t *)at;
    for (int i = 0; i < 5; i++, at += pair_rows_bytes(t))
        w->p[i] = (uint32_t *)at;
}

ATT16_TARGET void cpu_att16_forward_pair(float *out, size_t ldo, float *lse, const float *q, const float *k,
                                         const float *v, size_t ld, int t, int window, float scale, void *ws)
{
    struct att16_ws w;
    att16_carve(&w, ws, t);
    float *qt = w.f[0], *st = w.f[1], *ot = w.f[2];
    uint32_t *qtp = w.h[0], *ptp = w.h[1], *kr = w.p[0], *vp = w.p[1];
    _Alignas(64) float m[64], l[64], alpha[64];
    att16_rows(kr, k, ld, t, t);
    att16_pair_rows(vp, v, ld, t, t + (t & 1), 0);
    for (int q0 = 0; q0 < t; q0 += 64) {
        int nq = t - q0 < 64 ? t - q0 : 64;
        att_transpose64(qt, q + (size_t)q0 * ld, ld, nq, scale);
        att16_pair_rows(qtp, qt, 64, 64, 64, 0);
        for (int r = 0; r < 64; r++)
            m[r] = -INFINITY, l[r] = 0.0f;
        /* key tiles before every query's window are skipped (att_window_k0 is 64-aligned: even for the pairs) */
        const int kfirst = att_window_k0(q0, window);
        for (int k0 = kfirst; k0 <= q0; k0 += 64) {
            int diag = k0 == q0, nk = diag ? nq : 64;
            att16_tile_xyt(ATT_EPI_SCORES, st, kr + (size_t)k0 * 32, qtp, nk, diag, att_window_wo(q0, k0, window),
                           NULL, NULL, 0.0f);
            att_softmax_cols(st, nk, diag, m, l, alpha);
            att16_pair_rows(ptp, st, 64, nk, 64, 1);
            att16_tile_acc(ot, 64, nq, ptp, 1, 64, vp + (size_t)(k0 / 2) * 64, nk, 0, diag, alpha, k0 == kfirst);
        }
        for (int r = 0; r < nq; r++) {
            float inv = 1.0f / l[r], *o = out + (size_t)(q0 + r) * ldo;
            for (int d = 0; d < 64; d++)
                o[d] = ot[r * 64 + d] * inv;
            lse[q0 + r] = m[r] + logf(l[r]);
        }
    }
}

ATT16_TARGET void cpu_att16_backward_pair(float *dq_all, float *dk_all, float *dv_all, const float *dout,
                                          const float *q_all, const float *k_all, const float *v_all,
                                          const float *out, size_t ld, size_t ldo, const float *lse, int t,
                                          int window, float scale, void *ws)
{
    struct att16_ws w;
    att16_carve(&w, ws, t);
    float *qt = w.f[0], *dot = w.f[1], *pt = w.f[2], *dpt = w.f[3];
    uint32_t *qtp = w.h[0], *dotp = w.h[1], *pt16 = w.h[2], *dsp = w.h[3], *ds16 = w.h[4];
    uint32_t *kr = w.p[0], *vr = w.p[1], *kp = w.p[2], *qp = w.p[3], *dop = w.p[4];
    _Alignas(64) float lsev[64], dsum[64];
    const int te = t + (t & 1);
    att16_rows(kr, k_all, ld, t, t);
    att16_rows(vr, v_all, ld, t, t);
    att16_pair_rows(kp, k_all, ld, t, te, 0);
    att16_pair_rows(qp, q_all, ld, t, te, 0);
    att16_pair_rows(dop, dout, ldo, t, te, 0);
    for (int q0 = 0; q0 < t; q0 += 64) {
        int nq = t - q0 < 64 ? t - q0 : 64;
        const float *q = q_all + (size_t)q0 * ld, *dO = dout + (size_t)q0 * ldo;
        float *dq = dq_all + (size_t)q0 * ld;
        att_transpose64(qt, q, ld, nq, scale);
        att_transpose64(dot, dO, ldo, nq, 1.0f);
        att16_pair_rows(qtp, qt, 64, 64, 64, 0);
        att16_pair_rows(dotp, dot, 64, 64, 64, 0);
        for (int r = 0; r < 64; r++) {
            /* padding queries: lse +inf makes their probabilities exactly 0 */
            lsev[r] = r < nq ? lse[q0 + r] : INFINITY;
            float s = 0.0f;
            if (r < nq) {
                /* D = rowsum(dO O) of the rounded dO that dP = dO V^T reads, so sum_j dS_j stays 0 */
                const float *a = dO + (size_t)r * ldo, *b = out + (size_t)(q0 + r) * ldo;
                __m512 acc = _mm512_setzero_ps();
                for (int d = 0; d < 64; d += 16) {
                    __m512 ar = _mm512_castsi512_ps(
                        _mm512_and_si512(dtype_f32x16_to_bf16_hi(_mm512_loadu_ps(a + d)), _mm512_set1_epi32((int)0xffff0000u)));
                    acc = _mm512_fmadd_ps(ar, _mm512_loadu_ps(b + d), acc);
                }
                s = _mm512_reduce_add_ps(acc);
            }
            dsum[r] = s;
        }
        for (int k0 = att_window_k0(q0, window); k0 <= q0; k0 += 64) {
            int diag = k0 == q0, nk = diag ? nq : 64, wo = att_window_wo(q0, k0, window);
            float *dk = dk_all + (size_t)k0 * ld, *dv = dv_all + (size_t)k0 * ld;
            att16_tile_xyt(ATT_EPI_PROBS, pt, kr + (size_t)k0 * 32, qtp, nk, diag, wo, lsev, NULL, 0.0f);
            /* dV += P^T dO: rows are keys, the contraction runs over queries (pairs along a row of pt) */
            att16_rows(pt16, pt, 64, nk, 64);
            att16_tile_acc(dv, ld, nk, pt16, 32, 1, dop + (size_t)(q0 / 2) * 64, nq, diag, 0, NULL, 0);
            /* dS^T = P^T (dP^T - D) scale, dP^T = V dO^T */
            att16_tile_xyt(ATT_EPI_DS, dpt, vr + (size_t)k0 * 32, dotp, nk, diag, wo, dsum, pt, scale);
            /* dQ += dS K (contraction over keys: pairs down the columns); dK += dS^T Q (over queries) */
            att16_pair_rows(dsp, dpt, 64, nk, 64, 0);
            att16_rows(ds16, dpt, 64, nk, 64);
            att16_tile_acc(dq, ld, nq, dsp, 1, 64, kp + (size_t)(k0 / 2) * 64, nk, 0, diag, NULL, 0);
            att16_tile_acc(dk, ld, nk, ds16, 32, 1, qp + (size_t)(q0 / 2) * 64, nq, diag, 0, NULL, 0);
        }
    }
}

#else

size_t cpu_att16_slot_bytes(int t)
{
    (void)t;
    return 0;
}

int cpu_att16_usable(int hs)
{
    (void)hs;
    return 0;
}

void cpu_att16_forward_pair(float *out, size_t ldo, float *lse, const float *q, const float *k, const float *v,
                            size_t ld, int t, int window, float scale, void *ws)
{
    (void)out, (void)ldo, (void)lse, (void)q, (void)k, (void)v, (void)ld, (void)t, (void)window, (void)scale, (void)ws;
}

void cpu_att16_backward_pair(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, size_t ld, size_t ldo, const float *lse, int t,
                             int window, float scale, void *ws)
{
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)ld, (void)ldo, (void)lse;
    (void)t, (void)window, (void)scale, (void)ws;
}

#endif
