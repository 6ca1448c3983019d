/* Context-parallel causal attention on CPU: a rank's query rows (at their global positions) against the
 * keys and values of the whole sequence (gathered from the context group), masked by global position, so
 * the query rows need not be contiguous (load-balanced chunks r and 2C-1-r). Grouped-query heads and the
 * block-major rows of an all-gather or all-to-all are read in place (kernels.h). No tq x tk matrix exists:
 * scores come in tiles with a running max and sum per query row (the log-sum-exp merge). Head size 64 on a
 * CPU with AVX-512 runs on attention.c's register-blocked tiles (attention_avx512.h), in fp32 or, in bf16
 * mode, on bf16-rounded operands (q, k, v, dO, and P and dS where they multiply; softmax statistics and sums
 * in fp32) as attention.c's bf16 tiles round them; other head sizes on sgemm tiles in fp32 and row by row in
 * bf16 mode. Work is split over (batch, head) pairs, in backward (batch, key/value head) pairs: a pair
 * writes only its own columns, so the accumulated key and value gradients are race-free and deterministic. */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

static int check(const char *op, const struct kernels_attention_cp *a)
{
    int nkv = a->nkv ? a->nkv : a->nh;
    bool bad_kv = nkv < 1 || a->nh % nkv != 0 || (a->ldkv && a->ldkv < nkv * (a->c / a->nh));
    if (a->b < 1 || a->tq < 0 || a->tk < 0 || a->c < 1 || a->nh < 1 || a->c % a->nh != 0 || a->ld < a->c ||
        bad_kv || a->ldkv < 0 || a->qblock < 0 || a->kblock < 0 || (a->qblock && a->tq % a->qblock) ||
        (a->kblock && a->tk % a->kblock) || (a->tq && !a->qpos) || (a->tk && !a->kpos))
        return error_set(FSDP_EINVAL,
                         "%s: bad shape b=%d tq=%d tk=%d c=%d nh=%d nkv=%d ld=%d ldkv=%d qblock=%d kblock=%d", op, a->b,
                         a->tq, a->tk, a->c, a->nh, a->nkv, a->ld, a->ldkv, a->qblock, a->kblock);
    if (a->window < 0)
        return error_set(FSDP_EINVAL, "%s: window %d must be >= 0 (0 = full causal attention)", op, a->window);
    return 0;
}

/* Key at position kp is visible to the query at qp: causal, and inside the sliding window (w > 0); the
 * difference in 64 bits, as qp may be a sentinel far below any position. */
static inline bool cp_visible(int kp, int qp, int w)
{
    return kp <= qp && (w <= 0 || (long long)qp - kp < w);
}

/* Row of element i of sequence bb in a layout of blocks of blk rows (kernels.h); blk 0 = t, one block. */
static inline size_t row_of(int bb, int i, int t, int blk, int b)
{
    if (!blk)
        blk = t;
    return ((size_t)(i / blk) * b + bb) * blk + i % blk;
}

/* x rounded to bf16 when lp (the operand of a bf16 product), else x. */
static inline float rd(float x, int lp)
{
    return lp ? dtype_bf16_to_f32(dtype_f32_to_bf16(x)) : x;
}

static float dot(const float *x, const float *y, int n, int lp)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += rd(x[i], lp) * rd(y[i], lp);
    return s;
}

static int scalar_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          const struct kernels_attention_cp *a)
{
    int hs = a->c / a->nh, pairs = a->b * a->nh, lp = cpu_matmul_compute_dtype() == DTYPE_BF16;
    int group = a->nh / (a->nkv ? a->nkv : a->nh), ldkv = a->ldkv ? a->ldkv : a->ld;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pairs; p++) {
        int bb = p / a->nh, h = p % a->nh, kh = h / group;
        for (int i = 0; i < a->tq; i++) {
            size_t qr = row_of(bb, i, a->tq, a->qblock, a->b);
            const float *qi = q + qr * a->ld + h * hs;
            float *oi = out + qr * a->c + h * hs;
            for (int d = 0; d < hs; d++)
                oi[d] = 0;
            /* Running max m and sum l: a key raising the max rescales what was summed so far. */
            float m = -INFINITY, l = 0;
            for (int j = 0; j < a->tk; j++) {
                if (!cp_visible(a->kpos[j], a->qpos[i], a->window))
                    continue;
                size_t kr = row_of(bb, j, a->tk, a->kblock, a->b);
                float s = scale * dot(qi, k + kr * ldkv + kh * hs, hs, lp);
                if (s > m) {
                    float corr = expf(m - s);
                    l *= corr;
                    for (int d = 0; d < hs; d++)
                        oi[d] *= corr;
                    m = s;
                }
                float e = expf(s - m), er = rd(e, lp);
                l += e;
                const float *vj = v + kr * ldkv + kh * hs;
                for (int d = 0; d < hs; d++)
                    oi[d] += er * rd(vj[d], lp);
            }
            float inv = l > 0 ? 1.0f / l : 0;
            for (int d = 0; d < hs; d++)
                oi[d] *= inv;
            lse[((size_t)bb * a->nh + h) * a->tq + i] = l > 0 ? m + logf(l) : -INFINITY;
        }
    }
    return 0;
}

static int scalar_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *out, const float *lse, const struct kernels_attention_cp *a)
{
    int nkv = a->nkv ? a->nkv : a->nh, group = a->nh / nkv;
    int hs = a->c / a->nh, pairs = a->b * nkv, lp = cpu_matmul_compute_dtype() == DTYPE_BF16;
    int ldkv = a->ldkv ? a->ldkv : a->ld;
    float scale = 1.0f / sqrtf((float)hs);
    /* One (sequence, key/value head) pair per iteration, its query heads inside: the pair alone writes its
     * key/value columns, so the accumulation is race-free and deterministic. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pairs; p++) {
        int bb = p / nkv, kh = p % nkv;
        for (int h = kh * group; h < (kh + 1) * group; h++)
            for (int i = 0; i < a->tq; i++) {
                size_t qr = row_of(bb, i, a->tq, a->qblock, a->b);
                const float *qi = q + qr * a->ld + h * hs, *doi = dout + qr * a->c + h * hs;
                float *dqi = dq + qr * a->ld + h * hs;
                float L = lse[((size_t)bb * a->nh + h) * a->tq + i];
                if (L == -INFINITY)
                    continue;
                /* D of the dO that dP reads (rounded in bf16), so the row's dS sum to 0 */
                float D = 0;
                for (int d = 0; d < hs; d++)
                    D += rd(doi[d], lp) * out[qr * a->c + h * hs + d];
                for (int j = 0; j < a->tk; j++) {
                    if (!cp_visible(a->kpos[j], a->qpos[i], a->window))
                        continue;
                    size_t kr = row_of(bb, j, a->tk, a->kblock, a->b);
                    const float *kj = k + kr * ldkv + kh * hs, *vj = v + kr * ldkv + kh * hs;
                    float pr = expf(scale * dot(qi, kj, hs, lp) - L);
                    float ds = pr * (dot(doi, vj, hs, lp) - D) * scale;
                    float prr = rd(pr, lp), dsr = rd(ds, lp);
                    float *dkj = dk + kr * ldkv + kh * hs, *dvj = dv + kr * ldkv + kh * hs;
                    for (int d = 0; d < hs; d++) {
                        dvj[d] += prr * rd(doi[d], lp);
                        dqi[d] += dsr * rd(kj[d], lp);
                        dkj[d] += dsr * rd(qi[d], lp);
                    }
                }
            }
    }
    return 0;
}

/* ---- fp32: sgemm tiles ----
 * A tile is up to CP_BQ query rows by CP_BK key rows, each a run of consecutive rows of one block (so the
 * rows are equally spaced in memory), masked element by element by position; a tile with every key after
 * every query is skipped. Forward keeps a running max and sum per query row across key tiles (the
 * log-sum-exp merge), backward recomputes P from lse. The products run on OpenBLAS inside the parallel
 * region, one (sequence, head) pair per thread at a time. */
#define CP_BQ 128
#define CP_BK 256

/* Rows i .. of a sequence that stay in i's block: at most want. */
static int run_len(int i, int t, int blk, int want)
{
    int b = blk ? blk : t, end = (i / b + 1) * b;
    end = end < t ? end : t;
    return end - i < want ? end - i : want;
}

static int min_pos(const int *p, int n)
{
    int m = p[0];
    for (int i = 1; i < n; i++)
        m = p[i] < m ? p[i] : m;
    return m;
}

static int max_pos(const int *p, int n)
{
    int m = p[0];
    for (int i = 1; i < n; i++)
        m = p[i] > m ? p[i] : m;
    return m;
}

/* One query row of a score tile: the running max m and sum l take the visible keys (cp_visible: kp[c] <= qp,
 * within the window w); s becomes the probabilities under the new max (0 where masked), o is rescaled to it. */
CPU_SIMD_CLONES
static void cp_row_online(float *s, const int *kp, int nk, int qp, int w, float *m, float *l, float *o, int hs)
{
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int c = 0; c < nk; c++) {
        float x = cp_visible(kp[c], qp, w) ? s[c] : -INFINITY;
        mx = x > mx ? x : mx;
    }
    if (mx == -INFINITY) { /* nothing visible yet in this row */
        for (int c = 0; c < nk; c++)
            s[c] = 0;
        return;
    }
    float corr = fastmath_expf(*m - mx), sum = 0; /* 0 while *m is -inf */
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < nk; c++) {
        float e = cp_visible(kp[c], qp, w) ? fastmath_expf(s[c] - mx) : 0.0f;
        s[c] = e;
        sum += e;
    }
    if (corr != 1.0f) {
#pragma omp simd
        for (int d = 0; d < hs; d++)
            o[d] *= corr;
    }
    *l = *l * corr + sum;
    *m = mx;
}

/* One query row in backward: p (scores in) becomes P = exp(s - lse) on the visible keys, dp (dO V^T in)
 * becomes dS = P (dP - D) scale; a row that saw no key (lse -inf) has P = 0. */
CPU_SIMD_CLONES
static void cp_row_grad(float *p, float *dp, const int *kp, int nk, int qp, int w, float lse, float D, float scale)
{
    if (lse == -INFINITY)
        qp = -1;
#pragma omp simd
    for (int c = 0; c < nk; c++) {
        float e = cp_visible(kp[c], qp, w) ? fastmath_expf(p[c] - lse) : 0.0f;
        p[c] = e;
        dp[c] = e * (dp[c] - D) * scale;
    }
}

CPU_SIMD_CLONES
static float cp_dot(const float *x, const float *y, int n)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
}

/* Whether some query of a tile (positions qmin .. qmax) sees some key of keys j0 .. j0+nk-1: not when every
 * key is after every query, nor (window) when every key is before every query's window. */
static bool cp_tile_seen(const struct kernels_attention_cp *a, int j0, int nk, int qmin, int qmax)
{
    if (min_pos(a->kpos + j0, nk) > qmax)
        return false;
    return a->window <= 0 || (long long)qmin - max_pos(a->kpos + j0, nk) < a->window;
}

static int tiled_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                         const struct kernels_attention_cp *a)
{
    int nkv = a->nkv ? a->nkv : a->nh, group = a->nh / nkv, hs = a->c / a->nh, pairs = a->b * a->nh;
    int ldkv = a->ldkv ? a->ldkv : a->ld;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float s[CP_BQ * CP_BK], m[CP_BQ], l[CP_BQ];
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pairs; p++) {
            int bb = p / a->nh, h = p % a->nh, kh = h / group;
            for (int i0 = 0; i0 < a->tq;) {
                int nq = run_len(i0, a->tq, a->qblock, CP_BQ), qmax = max_pos(a->qpos + i0, nq);
                int qmin = min_pos(a->qpos + i0, nq);
                size_t qr = row_of(bb, i0, a->tq, a->qblock, a->b);
                const float *qt = q + qr * a->ld + h * hs;
                float *ot = out + qr * a->c + h * hs;
                for (int r = 0; r < nq; r++) {
                    m[r] = -INFINITY;
                    l[r] = 0;
                    for (int d = 0; d < hs; d++)
                        ot[(size_t)r * a->c + d] = 0;
                }
                for (int j0 = 0; j0 < a->tk;) {
                    int nk = run_len(j0, a->tk, a->kblock, CP_BK);
                    if (cp_tile_seen(a, j0, nk, qmin, qmax)) {
                        size_t kr = row_of(bb, j0, a->tk, a->kblock, a->b);
                        const float *kt = k + kr * ldkv + kh * hs, *vt = v + kr * ldkv + kh * hs;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, qt, a->ld, kt, ldkv,
                                    0.0f, s, CP_BK);
                        for (int r = 0; r < nq; r++)
                            cp_row_online(s + (size_t)r * CP_BK, a->kpos + j0, nk, a->qpos[i0 + r], a->window, m + r, l + r,
                                          ot + (size_t)r * a->c, hs);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, s, CP_BK, vt, ldkv,
                                    1.0f, ot, a->c);
                    }
                    j0 += nk;
                }
                for (int r = 0; r < nq; r++) {
                    float inv = l[r] > 0 ? 1.0f / l[r] : 0;
                    for (int d = 0; d < hs; d++)
                        ot[(size_t)r * a->c + d] *= inv;
                    lse[((size_t)bb * a->nh + h) * a->tq + i0 + r] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
                }
                i0 += nq;
            }
        }
    }
    return 0;
}

static int tiled_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const float *out, const float *lse, const struct kernels_attention_cp *a)
{
    int nkv = a->nkv ? a->nkv : a->nh, group = a->nh / nkv, hs = a->c / a->nh, pairs = a->b * nkv;
    int ldkv = a->ldkv ? a->ldkv : a->ld;
    float scale = 1.0f / sqrtf((float)hs);
    /* One (sequence, key/value head) pair per iteration, its query heads inside: the pair alone writes its
     * key/value columns. */
#pragma omp parallel
    {
        float pt[CP_BQ * CP_BK], dp[CP_BQ * CP_BK], dsum[CP_BQ];
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pairs; p++) {
            int bb = p / nkv, kh = p % nkv;
            for (int h = kh * group; h < (kh + 1) * group; h++)
                for (int i0 = 0; i0 < a->tq;) {
                    int nq = run_len(i0, a->tq, a->qblock, CP_BQ), qmax = max_pos(a->qpos + i0, nq);
                    int qmin = min_pos(a->qpos + i0, nq);
                    size_t qr = row_of(bb, i0, a->tq, a->qblock, a->b);
                    const float *qt = q + qr * a->ld + h * hs, *dot_ = dout + qr * a->c + h * hs;
                    const float *ot = out + qr * a->c + h * hs;
                    float *dqt = dq + qr * a->ld + h * hs;
                    const float *L = lse + ((size_t)bb * a->nh + h) * a->tq + i0;
                    for (int r = 0; r < nq; r++)
                        dsum[r] = cp_dot(dot_ + (size_t)r * a->c, ot + (size_t)r * a->c, hs);
                    for (int j0 = 0; j0 < a->tk;) {
                        int nk = run_len(j0, a->tk, a->kblock, CP_BK);
                        if (cp_tile_seen(a, j0, nk, qmin, qmax)) {
                            size_t kr = row_of(bb, j0, a->tk, a->kblock, a->b);
                            const float *kt = k + kr * ldkv + kh * hs, *vt = v + kr * ldkv + kh * hs;
                            float *dkt = dk + kr * ldkv + kh * hs, *dvt = dv + kr * ldkv + kh * hs;
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, qt, a->ld, kt,
                                        ldkv, 0.0f, pt, CP_BK);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, dot_, a->c, vt,
                                        ldkv, 0.0f, dp, CP_BK);
                            for (int r = 0; r < nq; r++)
                                cp_row_grad(pt + (size_t)r * CP_BK, dp + (size_t)r * CP_BK, a->kpos + j0, nk,
                                            a->qpos[i0 + r], a->window, L[r], dsum[r], scale);
                            /* dV += P^T dO; dQ += dS K; dK += dS^T Q */
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, pt, CP_BK, dot_,
                                        a->c, 1.0f, dvt, ldkv);
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, dp, CP_BK, kt,
                                        ldkv, 1.0f, dqt, a->ld);
                            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, dp, CP_BK, qt,
                                        a->ld, 1.0f, dkt, ldkv);
                        }
                        j0 += nk;
                    }
                    i0 += nq;
                }
        }
    }
    return 0;
}

/* ---- head size 64: the AVX-512 tiles of attention.c (attention_avx512.h) ----
 * Runs of up to 64 rows that are consecutive in memory and in position, so a tile of a query run and a key
 * run is either wholly visible (every key at or before every query), wholly masked (skipped), the diagonal
 * of the sequence (the same positions: the tiles' own causal mask and trimmed contractions), or cut by the
 * causal line elsewhere, masked element by element by position. The load-balanced chunks of a context group
 * are multiples of 64 rows long at the lengths that matter, so the last kind is rare. */
#if ATT_HAVE_AVX512
#define CP_T 64

/* Rows i .. of a sequence in i's block whose positions go up by one: at most CP_T. */
static int cp_run(int i, int t, int blk, const int *pos)
{
    int n = run_len(i, t, blk, CP_T), r = 1;
    while (r < n && pos[i + r] == pos[i] + r)
        r++;
    return r;
}

enum cp_tile { CP_SKIP, CP_FULL, CP_DIAG, CP_CUT };

/* How query run qp[0..nq) meets key run kp[0..nk) (both consecutive positions). */
static enum cp_tile cp_classify(const int *qp, int nq, const int *kp, int nk)
{
    if (kp[0] > qp[nq - 1])
        return CP_SKIP;
    if (kp[nk - 1] <= qp[0])
        return CP_FULL;
    return kp[0] == qp[0] && nk == nq ? CP_DIAG : CP_CUT;
}

/* A transposed tile st (key rows, 64 query lanes) cut by the causal line: fill where key j's position is
 * after query lane r's (qp64: the run's positions, INT_MAX in the padding lanes). */
ATT_TARGET static void cp512_cut(float *st, int nk, const int *kp, const int *qp64, float fill)
{
    const __m512 f = _mm512_set1_ps(fill);
    __m512i qv[4];
    for (int v = 0; v < 4; v++)
        qv[v] = _mm512_loadu_si512(qp64 + 16 * v);
    for (int j = 0; j < nk; j++) {
        __m512i kj = _mm512_set1_epi32(kp[j]);
        for (int v = 0; v < 4; v++) {
            __mmask16 m = _mm512_cmp_epi32_mask(qv[v], kj, _MM_CMPINT_LT);
            float *x = st + (size_t)j * 64 + 16 * v;
            _mm512_storeu_ps(x, _mm512_mask_mov_ps(_mm512_loadu_ps(x), m, f));
        }
    }
}

static void cp_lanes(int *qp64, const int *qp, int nq)
{
    for (int r = 0; r < 64; r++)
        qp64[r] = r < nq ? qp[r] : INT_MAX;
}

/* x rounded to bf16 and back, lane by lane. */
ATT_INLINE __m512 cp512_round(__m512 x)
{
    return _mm512_castsi512_ps(_mm512_and_si512(dtype_f32x16_to_bf16_hi(x), _mm512_set1_epi32((int)0xffff0000u)));
}

/* rows x 64 floats at x (leading dimension 64) rounded in place. */
ATT_TARGET static void cp512_round_tile(float *x, int rows)
{
    for (int i = 0; i < rows * 64; i += 16)
        _mm512_storeu_ps(x + i, cp512_round(_mm512_loadu_ps(x + i)));
}

/* dst (n rows of 64, leading dimension 64) = src rows (leading dimension ld), rounded with lp. */
ATT_TARGET static void cp512_copy_rows(float *dst, const float *src, size_t ld, int n, int lp)
{
    for (int r = 0; r < n; r++)
        for (int d = 0; d < 64; d += 16) {
            __m512 x = _mm512_loadu_ps(src + (size_t)r * ld + d);
            _mm512_storeu_ps(dst + (size_t)r * 64 + d, lp ? cp512_round(x) : x);
        }
}

/* bf16 mode: the key and value rows of sequence bb's key/value head kh, rounded, indexed by key (ld 64), so
 * every tile reads rounded operands without rounding them again for every query run. */
static void cp512_round_kv(float *kr, float *vr, const float *k, const float *v, size_t ldkv, int bb, int kh,
                           const struct kernels_attention_cp *a)
{
    for (int j0 = 0; j0 < a->tk;) {
        int n = run_len(j0, a->tk, a->kblock, a->tk);
        size_t row = row_of(bb, j0, a->tk, a->kblock, a->b);
        cp512_copy_rows(kr + (size_t)j0 * 64, k + row * ldkv + kh * 64, ldkv, n, 1);
        cp512_copy_rows(vr + (size_t)j0 * 64, v + row * ldkv + kh * 64, ldkv, n, 1);
        j0 += n;
    }
}

/* The operands of one (sequence, key/value head): k and v in place, or (lp) their rounded copies. */
struct cp512_kv {
    const float *k, *v;
    size_t ld;
    int by_key; /* rows indexed by key j (the copies), else by memory row */
};

/* held: the pair (bb * nkv + kh) whose rounded rows kr, vr already hold (-1: none), so consecutive query
 * heads of one key/value head round them once. */
static struct cp512_kv cp512_kv_at(const float *k, const float *v, size_t ldkv, float *kr, float *vr, int lp, int bb,
                                   int kh, int *held, const struct kernels_attention_cp *a)
{
    if (!lp)
        return (struct cp512_kv){k + kh * 64, v + kh * 64, ldkv, 0};
    int pair = bb * (a->nkv ? a->nkv : a->nh) + kh;
    if (*held != pair)
        cp512_round_kv(kr, vr, k, v, ldkv, bb, kh, a);
    *held = pair;
    return (struct cp512_kv){kr, vr, 64, 1};
}

static size_t cp512_key_row(const struct cp512_kv *kv, int bb, int j0, const struct kernels_attention_cp *a)
{
    return kv->by_key ? (size_t)j0 : row_of(bb, j0, a->tk, a->kblock, a->b);
}

/* bf16 mode (lp) runs the same tiles on bf16-rounded operands: q, k, v and dO rounded once, P and dS rounded
 * after the softmax statistics and dS took their unrounded values. Products of two bf16 values are exact in
 * fp32, so the numbers are those of the AVX512_BF16 tiles up to summation order. */
ATT_TARGET static int cp512_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const struct kernels_attention_cp *a, int lp)
{
    int nkv = a->nkv ? a->nkv : a->nh, group = a->nh / nkv, pairs = a->b * a->nh, failed = 0;
    size_t ldkv = a->ldkv ? a->ldkv : a->ld;
    const float scale = 0.125f; /* 1 / sqrt(64), a power of two: scaling commutes with rounding */
#pragma omp parallel reduction(| : failed)
    {
        _Alignas(64) float qt[64 * 64], st[64 * 64], ot[64 * 64];
        _Alignas(64) float m[64], l[64], alpha[64];
        _Alignas(64) int qp64[64];
        float *kr = lp ? malloc((size_t)a->tk * 2 * 64 * sizeof(float)) : NULL;
        float *vr = kr ? kr + (size_t)a->tk * 64 : NULL;
        int held = -1; /* the (sequence, key/value head) whose rounded rows kr, vr hold */
        failed = lp && !kr;
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pairs; p++) {
            int bb = p / a->nh, h = p % a->nh, kh = h / group;
            if (failed)
                continue;
            struct cp512_kv kv = cp512_kv_at(k, v, ldkv, kr, vr, lp, bb, kh, &held, a);
            for (int i0 = 0; i0 < a->tq;) {
                int nq = cp_run(i0, a->tq, a->qblock, a->qpos);
                const int *qp = a->qpos + i0;
                size_t qr = row_of(bb, i0, a->tq, a->qblock, a->b);
                att_transpose64(qt, q + qr * a->ld + h * 64, a->ld, nq, scale);
                if (lp)
                    cp512_round_tile(qt, 64);
                cp_lanes(qp64, qp, nq);
                for (int r = 0; r < 64; r++)
                    m[r] = -INFINITY, l[r] = 0.0f;
                int first = 1;
                for (int j0 = 0; j0 < a->tk;) {
                    int nk = cp_run(j0, a->tk, a->kblock, a->kpos);
                    enum cp_tile kind = cp_classify(qp, nq, a->kpos + j0, nk);
                    if (kind != CP_SKIP) {
                        size_t kr0 = cp512_key_row(&kv, bb, j0, a);
                        const float *kt = kv.k + kr0 * kv.ld, *vt = kv.v + kr0 * kv.ld;
                        int diag = kind == CP_DIAG;
                        att_tile_xyt(ATT_EPI_SCORES, st, kt, kv.ld, qt, nk, diag, ATT_NO_WINDOW, NULL, NULL, 0.0f, NULL);
                        if (kind == CP_CUT)
                            cp512_cut(st, nk, a->kpos + j0, qp64, -INFINITY);
                        att_softmax_cols(st, nk, diag, m, l, alpha);
                        if (lp) /* P as the operand of P V; l kept the unrounded sum */
                            cp512_round_tile(st, nk);
                        att_tile_acc(ot, 64, nq, st, 1, 64, vt, kv.ld, nk, diag ? ATT_TRIM_HI : ATT_TRIM_NONE,
                                     alpha, first, NULL);
                        first = 0;
                    }
                    j0 += nk;
                }
                for (int r = 0; r < nq; r++) {
                    float *o = out + (qr + r) * a->c + h * 64;
                    float inv = !first && l[r] > 0 ? 1.0f / l[r] : 0.0f;
                    for (int d = 0; d < 64; d++)
                        o[d] = inv > 0 ? ot[r * 64 + d] * inv : 0.0f;
                    lse[((size_t)bb * a->nh + h) * a->tq + i0 + r] = inv > 0 ? m[r] + logf(l[r]) : -INFINITY;
                }
                i0 += nq;
            }
        }
        free(kr);
    }
    return failed ? error_set(FSDP_ENOMEM, "attention_cp_forward: cannot allocate %zu bytes of rounded keys and values",
                              (size_t)a->tk * 2 * 64 * sizeof(float))
                  : 0;
}

ATT_TARGET static int cp512_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                     const float *k, const float *v, const float *out, const float *lse,
                                     const struct kernels_attention_cp *a, int lp)
{
    int nkv = a->nkv ? a->nkv : a->nh, group = a->nh / nkv, pairs = a->b * nkv, failed = 0;
    size_t ldkv = a->ldkv ? a->ldkv : a->ld, ld = a->ld, c = a->c;
    const float scale = 0.125f;
    /* One (sequence, key/value head) pair per iteration, its query heads inside: the pair alone writes its
     * key/value columns. */
#pragma omp parallel reduction(| : failed)
    {
        _Alignas(64) float qt[64 * 64], dot_t[64 * 64], pt[64 * 64], dpt[64 * 64], qrow[64 * 64], drow[64 * 64];
        _Alignas(64) float lsev[64], dsum[64];
        _Alignas(64) int qp64[64];
        float *kr = lp ? malloc((size_t)a->tk * 2 * 64 * sizeof(float)) : NULL;
        float *vr = kr ? kr + (size_t)a->tk * 64 : NULL;
        int held = -1;
        failed = lp && !kr;
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pairs; p++) {
            int bb = p / nkv, kh = p % nkv;
            if (failed)
                continue;
            struct cp512_kv kv = cp512_kv_at(k, v, ldkv, kr, vr, lp, bb, kh, &held, a);
            for (int h = kh * group; h < (kh + 1) * group; h++)
                for (int i0 = 0; i0 < a->tq;) {
                    int nq = cp_run(i0, a->tq, a->qblock, a->qpos);
                    const int *qp = a->qpos + i0;
                    size_t qr = row_of(bb, i0, a->tq, a->qblock, a->b);
                    const float *qb = q + qr * ld + h * 64, *dob = dout + qr * c + h * 64, *ob = out + qr * c + h * 64;
                    float *dqb = dq + qr * ld + h * 64;
                    const float *L = lse + ((size_t)bb * a->nh + h) * a->tq + i0;
                    /* the operands q and dO of the products: in place, or rounded copies */
                    const float *qz = qb, *dz = dob;
                    size_t ldq = ld, lddo = c;
                    if (lp) {
                        cp512_copy_rows(qrow, qb, ld, nq, 1);
                        cp512_copy_rows(drow, dob, c, nq, 1);
                        qz = qrow, dz = drow, ldq = lddo = 64;
                    }
                    att_transpose64(qt, qz, ldq, nq, scale);
                    att_transpose64(dot_t, dz, lddo, nq, 1.0f);
                    cp_lanes(qp64, qp, nq);
                    for (int r = 0; r < 64; r++) {
                        /* +inf: probabilities exactly 0 for padding lanes and rows that saw no key */
                        lsev[r] = r < nq && L[r] != -INFINITY ? L[r] : INFINITY;
                        /* D of the dO that dP reads */
                        dsum[r] = r < nq ? cp_dot(dz + (size_t)r * lddo, ob + (size_t)r * c, 64) : 0.0f;
                    }
                    for (int j0 = 0; j0 < a->tk;) {
                        int nk = cp_run(j0, a->tk, a->kblock, a->kpos);
                        enum cp_tile kind = cp_classify(qp, nq, a->kpos + j0, nk);
                        if (kind != CP_SKIP) {
                            size_t kr0 = cp512_key_row(&kv, bb, j0, a), kg = row_of(bb, j0, a->tk, a->kblock, a->b);
                            const float *kt = kv.k + kr0 * kv.ld, *vt = kv.v + kr0 * kv.ld;
                            float *dkt = dk + kg * ldkv + kh * 64, *dvt = dv + kg * ldkv + kh * 64;
                            int diag = kind == CP_DIAG;
                            enum att_trim by_key = diag ? ATT_TRIM_LO : ATT_TRIM_NONE;
                            enum att_trim by_query = diag ? ATT_TRIM_HI : ATT_TRIM_NONE;
                            att_tile_xyt(ATT_EPI_PROBS, pt, kt, kv.ld, qt, nk, diag, ATT_NO_WINDOW, lsev, NULL, 0.0f, NULL);
                            if (kind == CP_CUT)
                                cp512_cut(pt, nk, a->kpos + j0, qp64, 0.0f);
                            /* dS^T = P^T (dP^T - D) scale, dP^T = V dO^T, from the unrounded P: 0 wherever P is */
                            att_tile_xyt(ATT_EPI_DS, dpt, vt, kv.ld, dot_t, nk, diag, ATT_NO_WINDOW, dsum, pt, scale, NULL);
                            if (lp) {
                                cp512_round_tile(pt, nk);
                                cp512_round_tile(dpt, nk);
                            }
                            /* dV += P^T dO ; dQ += dS K ; dK += dS^T Q */
                            att_tile_acc(dvt, ldkv, nk, pt, 64, 1, dz, lddo, nq, by_key, NULL, 0, NULL);
                            att_tile_acc(dqb, ld, nq, dpt, 1, 64, kt, kv.ld, nk, by_query, NULL, 0, NULL);
                            att_tile_acc(dkt, ldkv, nk, dpt, 64, 1, qz, ldq, nq, by_key, NULL, 0, NULL);
                        }
                        j0 += nk;
                    }
                    i0 += nq;
                }
        }
        free(kr);
    }
    return failed ? error_set(FSDP_ENOMEM, "attention_cp_backward: cannot allocate %zu bytes of rounded keys and values",
                              (size_t)a->tk * 2 * 64 * sizeof(float))
                  : 0;
}

static int cp512_usable(const struct kernels_attention_cp *a)
{
    /* a sliding window takes the sgemm tiles (fp32) or the row-by-row path (bf16), which mask by position */
    return a->c / a->nh == 64 && a->window == 0 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("fma");
}
#else
static int cp512_usable(const struct kernels_attention_cp *a)
{
    (void)a;
    return 0;
}
/* never called (cp512_usable is 0), so the callers need no #if */
static int cp512_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                         const struct kernels_attention_cp *a, int lp)
{
    (void)out, (void)lse, (void)q, (void)k, (void)v, (void)a, (void)lp;
    return 0;
}
static int cp512_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const float *out, const float *lse, const struct kernels_attention_cp *a,
                          int lp)
{
    (void)dq, (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)a, (void)lp;
    return 0;
}
#endif

/* bf16 mode at other head sizes takes the row-by-row path, whose products round their operands as
 * attention.c's do. */
int cpu_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const struct kernels_attention_cp *a)
{
    FSDP_TRY(check("attention_cp_forward", a));
    if (a->tq == 0)
        return 0;
    int lp = cpu_matmul_compute_dtype() == DTYPE_BF16;
    if (a->tk > 0 && cp512_usable(a))
        return cp512_forward(out, lse, q, k, v, a, lp);
    return lp || a->tk == 0 ? scalar_forward(out, lse, q, k, v, a) : tiled_forward(out, lse, q, k, v, a);
}

int cpu_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const struct kernels_attention_cp *a)
{
    FSDP_TRY(check("attention_cp_backward", a));
    if (a->tq == 0 || a->tk == 0)
        return 0;
    int lp = cpu_matmul_compute_dtype() == DTYPE_BF16;
    if (cp512_usable(a))
        return cp512_backward(dq, dk, dv, dout, q, k, v, out, lse, a, lp);
    return lp ? scalar_backward(dq, dk, dv, dout, q, k, v, out, lse, a)
              : tiled_backward(dq, dk, dv, dout, q, k, v, out, lse, a);
}
