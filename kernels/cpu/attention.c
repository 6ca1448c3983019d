/* Causal multi-head attention, flash-attention style: queries in blocks of ATT_BQ rows, keys in blocks of
 * ATT_BK with an online (running max / running sum) softmax, scores and products on sgemm tiles that read
 * q, k, v straight out of the packed (b*t, 3c) qkv rows. Nothing of size t x t is ever stored; backward
 * recomputes each score tile from q, k and the saved log-sum-exp.
 *
 * Work is split over (batch, head) pairs: within a pair the key/value gradients of one key block receive
 * contributions from every later query block, so keeping a pair on one thread makes dqkv race-free and
 * deterministic without atomics. Each pair owns a slot of the workspace, so the workspace size does not
 * depend on the thread count at call time. The sgemm calls run inside the parallel region, where the
 * OpenMP build of OpenBLAS runs them single-threaded (no oversubscription). */
#include <cblas.h>
#include <math.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

#define ATT_BQ 64
#define ATT_BK 128

/* Floats per (batch, head) slot: a score/probability tile, a dP tile (backward) and the per-row
 * running max, running sum (forward) or D = rowsum(dO * O) (backward). */
#define ATT_SLOT_FLOATS (2 * ATT_BQ * ATT_BK + 2 * ATT_BQ)

static int check_shape(const char *op, int b, int t, int c, int nh)
{
    if (b < 0 || t < 0 || c <= 0 || nh <= 0 || c % nh != 0)
        return error_set(FSDP_EINVAL, "kernels cpu: %s: bad shape b=%d t=%d c=%d nh=%d (c %% nh must be 0)",
                         op, b, t, c, nh);
    return 0;
}

size_t cpu_attention_workspace_bytes(int b, int t, int c, int nh)
{
    (void)t;
    (void)c;
    if (b <= 0 || nh <= 0)
        return 64;
    return (size_t)b * (size_t)nh * ATT_SLOT_FLOATS * sizeof(float);
}

/* One row of a score tile: fold the valid keys (the first jmax) into the running max m and sum l, turn
 * the row into unnormalised probabilities exp(s - m_new), zero the masked tail, and rescale the output
 * row already accumulated by exp(m_old - m_new). */
CPU_SIMD_CLONES
static void att_row_online(float *s, int nk, int jmax, float *m, float *l, float *o, int hs)
{
    if (jmax <= 0) {
        for (int j = 0; j < nk; j++)
            s[j] = 0.0f;
        return;
    }
    float mx = s[0];
#pragma omp simd reduction(max : mx)
    for (int j = 1; j < jmax; j++)
        mx = s[j] > mx ? s[j] : mx;
    float m_new = *m > mx ? *m : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < jmax; j++) {
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
}

static void att_forward_pair(float *out, float *lse, const float *qkv, int t, int c, int hs, float scale,
                             float *ws)
{
    const int ld_qkv = 3 * c;
    float *s = ws, *m = ws + 2 * ATT_BQ * ATT_BK, *l = m + ATT_BQ;
    for (int q0 = 0; q0 < t; q0 += ATT_BQ) {
        int q1 = q0 + ATT_BQ < t ? q0 + ATT_BQ : t, nq = q1 - q0;
        const float *q = qkv + (size_t)q0 * ld_qkv;
        float *o = out + (size_t)q0 * c;
        for (int r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            for (int d = 0; d < hs; d++)
                o[(size_t)r * c + d] = 0.0f;
        }
        for (int k0 = 0; k0 < q1; k0 += ATT_BK) {
            int k1 = k0 + ATT_BK < q1 ? k0 + ATT_BK : q1, nk = k1 - k0;
            const float *k = qkv + (size_t)k0 * ld_qkv + c, *v = qkv + (size_t)k0 * ld_qkv + 2 * c;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, ld_qkv, k, ld_qkv, 0.0f,
                        s, ATT_BK);
            for (int r = 0; r < nq; r++) {
                int jmax = q0 + r - k0 + 1; /* keys k0 .. q0+r are visible to query q0+r */
                jmax = jmax < nk ? jmax : nk;
                att_row_online(s + (size_t)r * ATT_BK, nk, jmax, m + r, l + r, o + (size_t)r * c, hs);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, s, ATT_BK, v, ld_qkv, 1.0f,
                        o, c);
        }
        for (int r = 0; r < nq; r++) {
            float inv = 1.0f / l[r];
            for (int d = 0; d < hs; d++)
                o[(size_t)r * c + d] *= inv;
            lse[q0 + r] = m[r] + logf(l[r]);
        }
    }
}

int cpu_attention_forward(float *out, float *lse, const float *qkv, int b, int t, int c, int nh,
                          void *workspace)
{
    int rc = check_shape("attention_forward", b, t, c, nh);
    if (rc)
        return rc;
    if (b == 0 || t == 0)
        return 0;
    if (!workspace)
        return error_set(FSDP_EINVAL, "kernels cpu: attention_forward: NULL workspace (size it with "
                                      "attention_workspace_bytes)");
    const int hs = c / nh;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = b * nh;
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1)
    for (int p = 0; p < pairs; p++) {
        int bi = p / nh, h = p % nh;
        att_forward_pair(out + (size_t)bi * t * c + (size_t)h * hs, lse + (size_t)p * t,
                         qkv + (size_t)bi * t * 3 * c + (size_t)h * hs, t, c, hs, scale,
                         (float *)workspace + (size_t)p * ATT_SLOT_FLOATS);
    }
    return 0;
}

/* Recomputes one row of probabilities p = exp(s - lse) (0 where masked). */
CPU_SIMD_CLONES
static void att_row_probs(float *s, int nk, int jmax, float lse)
{
    int lim = jmax < 0 ? 0 : jmax;
#pragma omp simd
    for (int j = 0; j < lim; j++)
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

static void att_backward_pair(float *dqkv, const float *dout, const float *qkv, const float *out,
                              const float *lse, int t, int c, int hs, float scale, float *ws)
{
    const int ld_qkv = 3 * c;
    float *p = ws, *dp = ws + ATT_BQ * ATT_BK, *dsum = ws + 2 * ATT_BQ * ATT_BK;
    for (int q0 = 0; q0 < t; q0 += ATT_BQ) {
        int q1 = q0 + ATT_BQ < t ? q0 + ATT_BQ : t, nq = q1 - q0;
        const float *q = qkv + (size_t)q0 * ld_qkv, *dO = dout + (size_t)q0 * c;
        float *dq = dqkv + (size_t)q0 * ld_qkv;
        for (int r = 0; r < nq; r++)
            dsum[r] = att_row_dot(dO + (size_t)r * c, out + (size_t)(q0 + r) * c, hs);
        for (int k0 = 0; k0 < q1; k0 += ATT_BK) {
            int k1 = k0 + ATT_BK < q1 ? k0 + ATT_BK : q1, nk = k1 - k0;
            const float *k = qkv + (size_t)k0 * ld_qkv + c, *v = qkv + (size_t)k0 * ld_qkv + 2 * c;
            float *dk = dqkv + (size_t)k0 * ld_qkv + c, *dv = dqkv + (size_t)k0 * ld_qkv + 2 * c;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, scale, q, ld_qkv, k, ld_qkv, 0.0f,
                        p, ATT_BK);
            for (int r = 0; r < nq; r++) {
                int jmax = q0 + r - k0 + 1;
                att_row_probs(p + (size_t)r * ATT_BK, nk, jmax < nk ? jmax : nk, lse[q0 + r]);
            }
            /* dV += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, p, ATT_BK, dO, c, 1.0f, dv,
                        ld_qkv);
            /* dP = dO V^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, dO, c, v, ld_qkv, 0.0f, dp,
                        ATT_BK);
            for (int r = 0; r < nq; r++)
                att_row_dscores(dp + (size_t)r * ATT_BK, p + (size_t)r * ATT_BK, nk, dsum[r], scale);
            /* dQ += dS K ; dK += dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, dp, ATT_BK, k, ld_qkv, 1.0f,
                        dq, ld_qkv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, dp, ATT_BK, q, ld_qkv, 1.0f,
                        dk, ld_qkv);
        }
    }
}

int cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int b, int t, int c, int nh, void *workspace)
{
    int rc = check_shape("attention_backward", b, t, c, nh);
    if (rc)
        return rc;
    if (b == 0 || t == 0)
        return 0;
    if (!workspace)
        return error_set(FSDP_EINVAL, "kernels cpu: attention_backward: NULL workspace (size it with "
                                      "attention_workspace_bytes)");
    const int hs = c / nh;
    const float scale = 1.0f / sqrtf((float)hs);
    const int pairs = b * nh;
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1)
    for (int p = 0; p < pairs; p++) {
        int bi = p / nh, h = p % nh;
        size_t qoff = (size_t)bi * t * 3 * c + (size_t)h * hs, ooff = (size_t)bi * t * c + (size_t)h * hs;
        att_backward_pair(dqkv + qoff, dout + ooff, qkv + qoff, out + ooff, lse + (size_t)p * t, t, c, hs,
                          scale, (float *)workspace + (size_t)p * ATT_SLOT_FLOATS);
    }
    return 0;
}
