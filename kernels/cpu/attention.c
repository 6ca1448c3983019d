/* Causal multi-head attention, flash-attention style: queries in blocks of ATT_BQ rows, keys in blocks of
 * ATT_BK with an online (running max / running sum) softmax, scores and products on sgemm tiles that read
 * q, k, v straight out of the packed qkv rows. Nothing of size t x t is ever stored; backward recomputes
 * each score tile from q, k and the saved log-sum-exp.
 *
 * Grouped-query attention: the qkv rows are [q (nh heads) | k (nkv heads) | v (nkv heads)], and query head
 * h reads key/value head h / (nh / nkv); nkv = nh is ordinary multi-head attention (GPT-2).
 *
 * Forward work is split over (batch, query head) pairs. Backward work is split over (batch, key/value
 * head) groups, the group's query heads one after another on one thread: the key/value gradients of one
 * key block receive contributions from every later query block of every query head of the group, so
 * keeping a group on one thread makes dqkv race-free and deterministic without atomics (and the bits do
 * not depend on the thread count). The workspace has a slot per pair, so its size does not depend on the
 * thread count at call time, but a pair works in the slot of its thread (no more threads than pairs are
 * started): a slot is 64 KiB of tiles, and a fresh, cold one for every pair would cost 2-3% once the
 * slots outgrow the cache (b * nh = 32 pairs at config S). The sgemm calls run inside the parallel region, where
 * the OpenMP build of OpenBLAS runs them single-threaded (no oversubscription).
 *
 * Head size 64 (every GPT-2) on a CPU with AVX-512 takes hand-written tiles instead of sgemm (further
 * down, "AVX-512 tiles"): same blocking, same online softmax, same recomputation in backward. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/fastmath.h"

#define ATT_BQ 64
#define ATT_BK 128

/* Floats per (batch, head) slot: a score/probability tile, a dP tile (backward) and the per-row
 * running max, running sum (forward) or D = rowsum(dO * O) (backward). */
#define ATT_SLOT_FLOATS (2 * ATT_BQ * ATT_BK + 2 * ATT_BQ)

/* the AVX-512 path uses four 64 x 64 tiles of a slot */
_Static_assert(ATT_SLOT_FLOATS >= 4 * 64 * 64, "attention workspace slot too small for the AVX-512 tiles");

static int check_shape(const char *op, int b, int t, int c, int nh, int nkv, int window)
{
    if (b < 0 || t < 0 || c <= 0 || nh <= 0 || c % nh != 0 || nkv <= 0 || nh % nkv != 0)
        return error_set(FSDP_EINVAL,
                         "kernels cpu: %s: bad shape b=%d t=%d c=%d nh=%d nkv=%d (c %% nh and nh %% nkv must be 0)",
                         op, b, t, c, nh, nkv);
    if (window < 0)
        return error_set(FSDP_EINVAL, "kernels cpu: %s: window %d must be >= 0 (0 = full causal attention)", op,
                         window);
    return 0;
}

/* Bytes of one (batch, head) slot: the fp32 tiles, or, where bf16 attention can run (this CPU has bf16
 * instructions, whatever the dtype at call time: the workspace is sized before set_matmul_dtype), what its
 * kernels need: the AVX512_BF16 tiles and per-pair layouts (head size 64), else bf16-rounded copies of the
 * pair's q, k, v and dO for the sgemm path. */
static size_t att_slot_bytes(int t, int hs)
{
    size_t f32 = ATT_SLOT_FLOATS * sizeof(float);
    if (!cpu_isa_get()->bf16)
        return f32;
    size_t lp = cpu_att16_usable(hs) ? cpu_att16_slot_bytes(t) : f32 + 4 * (size_t)t * hs * sizeof(float);
    lp = (lp + 63) / 64 * 64;
    return lp > f32 ? lp : f32;
}

size_t cpu_attention_workspace_bytes(int b, int t, int c, int nh, int nkv)
{
    (void)nkv;
    if (b <= 0 || nh <= 0 || t <= 0 || c <= 0 || c % nh != 0)
        return 64;
    return (size_t)b * (size_t)nh * att_slot_bytes(t, c / nh);
}

/* bf16 mode on the sgemm path (head sizes other than 64): the operands of every product rounded to bf16,
 * accumulation in fp32, so the numbers are those of the AVX512_BF16 tiles up to summation order. */
CPU_SIMD_CLONES
static void att_round_row(float *x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++)
        x[i] = dtype_bf16_to_f32(dtype_f32_to_bf16(x[i]));
}

/* dst rows (t x w, ld w) = src rows (leading dimension ld) rounded to bf16 and back. */
static void att_round_copy(float *dst, const float *src, size_t ld, int t, int w)
{
    for (int r = 0; r < t; r++) {
        memcpy(dst + (size_t)r * w, src + (size_t)r * ld, (size_t)w * sizeof(float));
        att_round_row(dst + (size_t)r * w, w);
    }
}

/* One row of a score tile: fold the valid keys (jmin .. jmax - 1: the causal limit and the sliding window)
 * into the running max m and sum l, turn the row into unnormalised probabilities exp(s - m_new) (rounded to
 * bf16 with round), zero the masked head and tail, and rescale the output row already accumulated by
 * exp(m_old - m_new). */
CPU_SIMD_CLONES
static void att_row_online(float *s, int nk, int jmin, int jmax, float *m, float *l, float *o, int hs, int round)
{
    jmin = jmin > 0 ? jmin : 0;
    if (jmax <= jmin) {
        for (int j = 0; j < nk; j++)
            s[j] = 0.0f;
        return;
    }
    float mx = s[jmin];
#pragma omp simd reduction(max : mx)
    for (int j = jmin + 1; j < jmax; j++)
        mx = s[j] > mx ? s[j] : mx;
    float m_new = *m > mx ? *m : mx;
    float sum = 0.0f;
    for (int j = 0; j < jmin; j++)
        s[j] = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = jmin; j < jmax; j++) {
        float p = fastmath_expf(s[j] - m_new);
        s[j] = p;
        sum += p;
    }
    for (int j = jmax; j < nk; j++)
        s[j] = 0.0f;
    float alpha = fastmath_expf(*m - m_new); /* 0 on the first block, where *m is -inf */
    if (alpha != 1.0f) {
#pragma omp simd
        for (int d = 0; d < hs; d++)
            o[d] *= alpha;
    }
    *l = *l * alpha + sum;
    *m = m_new;
    if (round) /* P as the operand of P V; l keeps the unrounded sum */
        att_round_row(s + jmin, jmax - jmin);
}

/* One query head of one sequence: where its q, k, v columns (k and v of its key/value head) and its
 * output, log-sum-exp and gradient columns start (row 0), and the row strides: ld for the q, k, v rows,
 * ldg for their gradient, ldo for out, lddo for dout (all equal to the tensors' own strides except where
 * the bf16 sgemm path reads rounded copies). Forward leaves dq, dk, dv, dout NULL. */
struct att_head {
    const float *q, *k, *v, *o, *dout, *lse_in;
    float *out, *lse, *dq, *dk, *dv;
    size_t ld, ldg, ldo, lddo;
};

/* The call's tensors and shape, from which att_head_at finds any head. */
struct att_call {
    const float *qkv, *dout, *o, *lse_in;
    float *out, *lse, *dqkv;
    int b, t, nh, nkv, hs;
};

static struct att_head att_head_at(const struct att_call *a, int bi, int h)
{
    const size_t ld = (size_t)(a->nh + 2 * a->nkv) * a->hs, ldo = (size_t)a->nh * a->hs;
    const size_t hs = (size_t)a->hs, row0 = (size_t)bi * a->t * ld, orow0 = (size_t)bi * a->t * ldo;
    const size_t qc = (size_t)h * hs, kvh = (size_t)(h / (a->nh / a->nkv));
    const size_t kc = (size_t)a->nh * hs + kvh * hs, vc = (size_t)(a->nh + a->nkv) * hs + kvh * hs;
    const size_t oc = orow0 + qc, lc = ((size_t)bi * a->nh + (size_t)h) * a->t;
    struct att_head r = {.q = a->qkv + row0 + qc, .k = a->qkv + row0 + kc, .v = a->qkv + row0 + vc, .ld = ld,
                         .ldg = ld, .ldo = ldo, .lddo = ldo};
    if (a->out)
        r.out = a->out + oc;
    if (a->lse)
        r.lse = a->lse + lc;
    if (a->o)
        r.o = a->o + oc;
    if (a->lse_in)
        r.lse_in = a->lse_in + lc;
    if (a->dout)
        r.dout = a->dout + oc;
    if (a->dqkv) {
        r.dq = a->dqkv + row0 + qc;
        r.dk = a->dqkv + row0 + kc;
        r.dv = a->dqkv + row0 + vc;
    }
    return r;
}

/* The first key a query block starting at q0 can see: 0, or the first query's window start. Key blocks
 * start there, so blocks wholly before every query's window are never computed. */
static int att_first_key(int q0, int window)
{
    return window > 0 && q0 - window + 1 > 0 ? q0 - window + 1 : 0;
}

/* One pair on sgemm tiles (round: the P of P V rounded to bf16, the bf16 sgemm path). */
static void att_forward_pair(const struct att_head *a, int t, int hs, int window, float scale, float *ws, int round)
{
    const size_t ld = a->ld, ldo = a->ldo;
    float *s = ws, *m = ws + 2 * ATT_BQ * ATT_BK, *l = m + ATT_BQ;
    for (int q0 = 0; q0 < t; q0 += ATT_BQ) {
        int q1 = q0 + ATT_BQ < t ? q0 + ATT_BQ : t, nq = q1 - q0;
        const float *q = a->q + (size_t)q0 * ld;
        float *o = a->out + (size_t)q0 * ldo;
        for (int r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            for (int d = 0; d < hs; d++)
                o[(size_t)r * ldo + d] = 0.0f;
        }
        for (int k0 = att_first_key(q0, window); k0 < q1; k0 += ATT_BK) {
            int k1 = k0 + ATT_BK < q1 ? k0 + ATT_BK : q1, nk = k1 - k0;
            const float *k = a->k + (size_t)k0 * ld, *v = a->v + (size_t)k0 * ld;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, (int)ld, k, (int)ld, 0.0f,
                        s, ATT_BK);
            for (int r = 0; r < nq; r++) {
                /* keys k0 .. q0+r are visible to query q0+r, from q0+r-window+1 on under a window */
                int jmax = q0 + r - k0 + 1, jmin = window > 0 ? q0 + r - window + 1 - k0 : 0;
                jmax = jmax < nk ? jmax : nk;
                att_row_online(s + (size_t)r * ATT_BK, nk, jmin, jmax, m + r, l + r, o + (size_t)r * ldo, hs, round);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, s, ATT_BK, v, (int)ld, 1.0f,
                        o, (int)ldo);
        }
        for (int r = 0; r < nq; r++) {
            float inv = 1.0f / l[r];
            for (int d = 0; d < hs; d++)
                o[(size_t)r * ldo + d] *= inv;
            a->lse[q0 + r] = m[r] + logf(l[r]);
        }
    }
}


/* The prefetch streams of a head's forward (q, k, v, out) or backward (those and dq, dk, dv, dO). */
static void att_pf_pair(struct att_pf *pf, const struct att_head *a)
{
    const float *in[3] = {a->q, a->k, a->v};
    float *grad[3] = {a->dq, a->dk, a->dv};
    int n = 0;
    for (int part = 0; part < 3; part++) {
        pf->base[n] = in[part], pf->ld[n] = a->ld, pf->write[n++] = 0;
        if (a->dq)
            pf->base[n] = grad[part], pf->ld[n] = a->ld, pf->write[n++] = 1;
    }
    /* forward writes out, backward reads it */
    pf->base[n] = a->dq ? a->o : a->out, pf->ld[n] = a->ldo, pf->write[n++] = !a->dq;
    if (a->dout)
        pf->base[n] = a->dout, pf->ld[n] = a->ldo, pf->write[n++] = 0;
    pf->nstreams = n;
}

/* The prefetch streams of head (bi, h), or NULL when bi is past the batch (nothing follows). */
static struct att_pf *att_pf_head(struct att_pf *pf, const struct att_call *a, int bi, int h)
{
    if (bi >= a->b)
        return NULL;
    struct att_head n = att_head_at(a, bi, h);
    att_pf_pair(pf, &n);
    return pf;
}

/* ---- AVX-512 tiles for head size 64 -------------------------------------------------------------------
 *
 * The sgemm calls above spend most of their time packing and in OpenBLAS's small-matrix kernels: a
 * 64x64x64 product is too small to amortise either. With hs = 64 a row of q, k, v or dO is exactly four
 * zmm registers, so every product of the tile loop is a register-blocked outer-product kernel here.
 *
 * Tiles are 64 queries x 64 keys and the score tile is stored transposed, S^T[j][r] (key j, query r, 64
 * queries = four vectors per row), because then
 *   - S^T = K (scale Q^T) and dP^T = V dO^T broadcast one element of a k / v row against a row of the
 *     transposed query (dO) block, which is transposed once per query block and reused for every key block;
 *   - the softmax runs down the columns, 16 queries per vector, with no horizontal reductions;
 *   - O += P V and dQ += dS K read the coefficient of (r, j) at S^T + j*64 + r, dV += P^T dO and
 *     dK += dS^T Q read it at S^T + j*64 + r as well: every product broadcasts one coefficient against a
 *     64-wide row of v, k, dO or q, which are read in place from the packed rows.
 * Accumulators stay in registers for R output rows at a time (4 x R zmm). On the diagonal tile the
 * contraction of O, dQ, dK and dV stops at the causal limit of the row block, so the masked triangle costs
 * (almost) nothing there. */
#if ATT_HAVE_AVX512

/* Points pf at the next query block's rows, or at the first block of the next pair (next != NULL) after
 * the last block; iters is how many register blocks the tile loops will run until then. */
static void att_pf_next(struct att_pf *pf, const struct att_pf *next, int q0, int t, int iters)
{
    if (q0 + 64 < t) {
        att_pf_start(pf, q0 + 64, q0 + 128 < t ? q0 + 128 : t, iters);
    } else if (next) {
        *pf = *next;
        att_pf_start(pf, 0, t < 64 ? t : 64, iters);
    } else {
        att_pf_start(pf, 0, 0, iters);
    }
}

/* Workspace of a pair: forward qt | st | ot, backward qt | dot | pt | dpt (64 x 64 floats each). */
ATT_TARGET static void att512_forward_pair(const struct att_head *a, int t, int window, float scale, float *ws,
                                           const struct att_pf *next)
{
    const size_t ld = a->ld;
    float *qt = ws, *st = ws + 4096, *ot = ws + 2 * 4096;
    _Alignas(64) float m[64], l[64], alpha[64];
    struct att_pf pf;
    att_pf_pair(&pf, a);
    for (int q0 = 0; q0 < t; q0 += 64) {
        int nq = t - q0 < 64 ? t - q0 : 64;
        att_transpose64(qt, a->q + (size_t)q0 * ld, ld, nq, scale);
        /* two tile calls of 64 / ATT_R register blocks per key block */
        const int kfirst = att_window_k0(q0, window);
        att_pf_next(&pf, next, q0, t, ((q0 - kfirst) / 64 + 1) * 2 * (64 / ATT_R));
        for (int r = 0; r < 64; r++)
            m[r] = -INFINITY, l[r] = 0.0f;
        /* rows of ot past nq are computed too (from zero queries) and never written out; a query that sees no
         * key of the first tile (its window starts later) keeps m = -inf and l = 0 until one it sees */
        for (int k0 = kfirst; k0 <= q0; k0 += 64) {
            int diag = k0 == q0, nk = diag ? nq : 64;
            const float *k = a->k + (size_t)k0 * ld, *v = a->v + (size_t)k0 * ld;
            att_tile_xyt(ATT_EPI_SCORES, st, k, ld, qt, nk, diag, att_window_wo(q0, k0, window), NULL, NULL, 0.0f,
                         &pf);
            att_softmax_cols(st, nk, diag, m, l, alpha);
            att_tile_acc(ot, 64, nq, st, 1, 64, v, ld, nk, diag ? ATT_TRIM_HI : ATT_TRIM_NONE, alpha,
                         k0 == kfirst, &pf);
        }
        for (int r = 0; r < nq; r++) {
            float inv = 1.0f / l[r], *o = a->out + (size_t)(q0 + r) * a->ldo;
            for (int d = 0; d < 64; d++)
                o[d] = ot[r * 64 + d] * inv;
            a->lse[q0 + r] = m[r] + logf(l[r]);
        }
    }
}

ATT_TARGET static void att512_backward_pair(const struct att_head *a, int t, int window, float scale, float *ws,
                                            const struct att_pf *next)
{
    const size_t ld = a->ld, ldo = a->ldo;
    float *qt = ws, *dot = ws + 4096, *pt = ws + 2 * 4096, *dpt = ws + 3 * 4096;
    _Alignas(64) float lsev[64], dsum[64];
    struct att_pf pf;
    att_pf_pair(&pf, a);
    for (int q0 = 0; q0 < t; q0 += 64) {
        int nq = t - q0 < 64 ? t - q0 : 64;
        const float *q = a->q + (size_t)q0 * ld, *dO = a->dout + (size_t)q0 * ldo;
        float *dq = a->dq + (size_t)q0 * ld;
        att_transpose64(qt, q, ld, nq, scale);
        att_transpose64(dot, dO, ldo, nq, 1.0f);
        const int kfirst = att_window_k0(q0, window);
        /* five tile calls of 64 / ATT_R register blocks per key block */
        att_pf_next(&pf, next, q0, t, ((q0 - kfirst) / 64 + 1) * 5 * (64 / ATT_R));
        for (int r = 0; r < 64; r++) {
            /* padding queries: lse +inf makes their probabilities exactly 0 */
            lsev[r] = r < nq ? a->lse_in[q0 + r] : INFINITY;
            float s = 0.0f;
            if (r < nq) {
                const float *x = dO + (size_t)r * ldo, *y = a->o + (size_t)(q0 + r) * ldo;
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(y));
                for (int d = 16; d < 64; d += 16)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d), acc);
                s = _mm512_reduce_add_ps(acc);
            }
            dsum[r] = s;
        }
        for (int k0 = kfirst; k0 <= q0; k0 += 64) {
            int diag = k0 == q0, nk = diag ? nq : 64, wo = att_window_wo(q0, k0, window);
            const float *k = a->k + (size_t)k0 * ld, *v = a->v + (size_t)k0 * ld;
            float *dk = a->dk + (size_t)k0 * ld, *dv = a->dv + (size_t)k0 * ld;
            enum att_trim by_key = diag ? ATT_TRIM_LO : ATT_TRIM_NONE, by_query = diag ? ATT_TRIM_HI : ATT_TRIM_NONE;
            /* P is 0 outside the window, so the products need no trim of their own for it */
            att_tile_xyt(ATT_EPI_PROBS, pt, k, ld, qt, nk, diag, wo, lsev, NULL, 0.0f, &pf);
            /* dV += P^T dO */
            att_tile_acc(dv, ld, nk, pt, 64, 1, dO, ldo, nq, by_key, NULL, 0, &pf);
            /* dS^T = P^T (dP^T - D) scale, dP^T = V dO^T */
            att_tile_xyt(ATT_EPI_DS, dpt, v, ld, dot, nk, diag, wo, dsum, pt, scale, &pf);
            /* dQ += dS K ; dK += dS^T Q */
            att_tile_acc(dq, ld, nq, dpt, 1, 64, k, ld, nk, by_query, NULL, 0, &pf);
            att_tile_acc(dk, ld, nk, dpt, 64, 1, q, ld, nq, by_key, NULL, 0, &pf);
        }
    }
}

/* __builtin_cpu_supports reads the CPU model libgcc filled in at load time (a load and a test); it also
 * checks that the OS saves the AVX-512 registers. */
static int att512_usable(int hs)
{
    return hs == 64 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}
#else
static int att512_usable(int hs)
{
    (void)hs;
    return 0;
}
/* never called (att512_usable is 0), so the callers need no #if */
static inline void att512_forward_pair(const struct att_head *a, int t, int window, float scale, float *ws,
                                       const struct att_pf *next)
{
    (void)a, (void)t, (void)window, (void)scale, (void)ws, (void)next;
}
static inline void att512_backward_pair(const struct att_head *a, int t, int window, float scale, float *ws,
                                        const struct att_pf *next)
{
    (void)a, (void)t, (void)window, (void)scale, (void)ws, (void)next;
}
#endif

/* Threads for the pairs: never more than there are pairs, so thread number i can own workspace slot i. */
static int att_threads(int pairs)
{
    int n = omp_get_max_threads();
    return n < pairs ? n : pairs;
}

int cpu_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh, int nkv,
                          int window, void *workspace)
{
    FSDP_TRY(check_shape("attention_forward", b, t, c, nh, nkv, window));
    if (b == 0 || t == 0)
        return 0;
    if (!workspace)
        return error_set(FSDP_EINVAL, "kernels cpu: attention_forward: NULL workspace (size it with "
                                      "attention_workspace_bytes)");
    const int hs = c / nh;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = b * nh, bf16 = cpu_matmul_compute_dtype() == DTYPE_BF16;
    const int fast16 = bf16 && cpu_att16_usable(hs), fast = !bf16 && att512_usable(hs);
    const size_t slot = att_slot_bytes(t, hs);
    const struct att_call call = {.qkv = qkv, .out = out, .lse = lse, .b = b, .t = t, .nh = nh, .nkv = nkv, .hs = hs};
#pragma omp parallel num_threads(att_threads(pairs)) if (pairs > 1)
    {
        float *ws = (float *)((char *)workspace + (size_t)omp_get_thread_num() * slot);
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < pairs; p++) {
            struct att_head a = att_head_at(&call, p / nh, p % nh);
            if (fast16) {
                cpu_att16_forward_pair(a.out, a.ldo, a.lse, a.q, a.k, a.v, a.ld, t, window, scale, ws);
            } else if (fast) {
                /* the pair this thread most likely takes next (the one its stride lands on) */
                int pn = p + omp_get_num_threads();
                struct att_pf next;
                att512_forward_pair(&a, t, window, scale, ws, att_pf_head(&next, &call, pn / nh, pn % nh));
            } else if (bf16) {
                /* the pair's q, k, v rounded, after the fp32 tiles of the slot */
                float *r = ws + ATT_SLOT_FLOATS;
                att_round_copy(r, a.q, a.ld, t, hs);
                att_round_copy(r + (size_t)t * hs, a.k, a.ld, t, hs);
                att_round_copy(r + 2 * (size_t)t * hs, a.v, a.ld, t, hs);
                struct att_head ra = a;
                ra.q = r, ra.k = r + (size_t)t * hs, ra.v = r + 2 * (size_t)t * hs, ra.ld = (size_t)hs;
                att_forward_pair(&ra, t, hs, window, scale, ws, 1);
            } else {
                att_forward_pair(&a, t, hs, window, scale, ws, 0);
            }
        }
    }
    return 0;
}

/* Recomputes one row of probabilities p = exp(s - lse) for keys jmin .. jmax - 1 (0 where masked). */
CPU_SIMD_CLONES
static void att_row_probs(float *s, int nk, int jmin, int jmax, float lse)
{
    int lo = jmin > 0 ? jmin : 0, lim = jmax < lo ? lo : jmax;
    for (int j = 0; j < lo; j++)
        s[j] = 0.0f;
#pragma omp simd
    for (int j = lo; j < lim; j++)
        s[j] = fastmath_expf(s[j] - lse);
    for (int j = lim; j < nk; j++)
        s[j] = 0.0f;
}

/* dS = P * (dP - D) * scale, in place of dP (masked entries have P = 0 so they vanish). */
CPU_SIMD_CLONES
static void att_row_dscores(float *dp, const float *p, int nk, float dsum, float scale)
{
#pragma omp simd
    for (int j = 0; j < nk; j++)
        dp[j] = p[j] * (dp[j] - dsum) * scale;
}

CPU_SIMD_CLONES
static float att_row_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One pair's backward on sgemm tiles: the head's q, k, v (ld) and dO (lddo) are the products' operands
 * (bf16-rounded copies with round), out (ldo) gives D = rowsum(dO O) with the same dO; dq, dk, dv (ldg)
 * accumulate. */
static void att_backward_pair(const struct att_head *a, int t, int hs, int window, float scale, float *ws, int round)
{
    const size_t ld = a->ld, ldg = a->ldg, ldo = a->ldo, lddo = a->lddo;
    float *p = ws, *dp = ws + ATT_BQ * ATT_BK, *dsum = ws + 2 * ATT_BQ * ATT_BK;
    for (int q0 = 0; q0 < t; q0 += ATT_BQ) {
        int q1 = q0 + ATT_BQ < t ? q0 + ATT_BQ : t, nq = q1 - q0;
        const float *q = a->q + (size_t)q0 * ld, *dO = a->dout + (size_t)q0 * lddo;
        float *dq = a->dq + (size_t)q0 * ldg;
        for (int r = 0; r < nq; r++)
            dsum[r] = att_row_dot(dO + (size_t)r * lddo, a->o + (size_t)(q0 + r) * ldo, hs);
        for (int k0 = att_first_key(q0, window); k0 < q1; k0 += ATT_BK) {
            int k1 = k0 + ATT_BK < q1 ? k0 + ATT_BK : q1, nk = k1 - k0;
            const float *k = a->k + (size_t)k0 * ld, *v = a->v + (size_t)k0 * ld;
            float *dk = a->dk + (size_t)k0 * ldg, *dv = a->dv + (size_t)k0 * ldg;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, (int)ld, k, (int)ld, 0.0f,
                        p, ATT_BK);
            for (int r = 0; r < nq; r++) {
                int jmax = q0 + r - k0 + 1, jmin = window > 0 ? q0 + r - window + 1 - k0 : 0;
                att_row_probs(p + (size_t)r * ATT_BK, nk, jmin, jmax < nk ? jmax : nk, a->lse_in[q0 + r]);
            }
            /* dP = dO V^T; dS from the unrounded P */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, dO, (int)lddo, v, (int)ld, 0.0f,
                        dp, ATT_BK);
            for (int r = 0; r < nq; r++) {
                att_row_dscores(dp + (size_t)r * ATT_BK, p + (size_t)r * ATT_BK, nk, dsum[r], scale);
                if (round) {
                    att_round_row(p + (size_t)r * ATT_BK, nk);
                    att_round_row(dp + (size_t)r * ATT_BK, nk);
                }
            }
            /* dV += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, p, ATT_BK, dO, (int)lddo, 1.0f, dv,
                        (int)ldg);
            /* dQ += dS K ; dK += dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, dp, ATT_BK, k, (int)ld, 1.0f,
                        dq, (int)ldg);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, dp, ATT_BK, q, (int)ld, 1.0f,
                        dk, (int)ldg);
        }
    }
}

int cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int b, int t, int c, int nh, int nkv, int window, void *workspace)
{
    FSDP_TRY(check_shape("attention_backward", b, t, c, nh, nkv, window));
    if (b == 0 || t == 0)
        return 0;
    if (!workspace)
        return error_set(FSDP_EINVAL, "kernels cpu: attention_backward: NULL workspace (size it with "
                                      "attention_workspace_bytes)");
    const int hs = c / nh, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hs);
    const int groups = b * nkv, bf16 = cpu_matmul_compute_dtype() == DTYPE_BF16;
    const int fast16 = bf16 && cpu_att16_usable(hs), fast = !bf16 && att512_usable(hs);
    const size_t slot = att_slot_bytes(t, hs);
    const struct att_call call = {.qkv = qkv, .dout = dout, .o = out, .lse_in = lse, .dqkv = dqkv, .b = b, .t = t,
                                  .nh = nh, .nkv = nkv, .hs = hs};
#pragma omp parallel num_threads(att_threads(groups)) if (groups > 1)
    {
        float *ws = (float *)((char *)workspace + (size_t)omp_get_thread_num() * slot);
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < groups; p++) {
            int bi = p / nkv, h0 = p % nkv * group;
            for (int h = h0; h < h0 + group; h++) {
                struct att_head a = att_head_at(&call, bi, h);
                if (fast16) {
                    cpu_att16_backward_pair(a.dq, a.dk, a.dv, a.dout, a.q, a.k, a.v, a.o, a.ld, a.ldo, a.lse_in, t, window,
                                            scale, ws);
                } else if (fast) {
                    /* next: the group's next query head, else the first of the group this thread's stride
                     * lands on */
                    int pn = p + omp_get_num_threads();
                    struct att_pf next, *np = h + 1 < h0 + group ? att_pf_head(&next, &call, bi, h + 1)
                                                                 : att_pf_head(&next, &call, pn / nkv, pn % nkv * group);
                    att512_backward_pair(&a, t, window, scale, ws, np);
                } else if (bf16) {
                    float *r = ws + ATT_SLOT_FLOATS, *rdo = r + 3 * (size_t)t * hs;
                    att_round_copy(r, a.q, a.ld, t, hs);
                    att_round_copy(r + (size_t)t * hs, a.k, a.ld, t, hs);
                    att_round_copy(r + 2 * (size_t)t * hs, a.v, a.ld, t, hs);
                    att_round_copy(rdo, a.dout, a.ldo, t, hs);
                    struct att_head ra = a;
                    ra.q = r, ra.k = r + (size_t)t * hs, ra.v = r + 2 * (size_t)t * hs, ra.ld = (size_t)hs;
                    ra.dout = rdo, ra.lddo = (size_t)hs;
                    att_backward_pair(&ra, t, hs, window, scale, ws, 1);
                } else {
                    att_backward_pair(&a, t, hs, window, scale, ws, 0);
                }
            }
        }
    }
    return 0;
}
