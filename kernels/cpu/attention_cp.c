/* Context-parallel causal attention on CPU: a rank's query rows (at their global positions) against the
 * keys and values of the whole sequence (gathered from the context group), masked by global position, so
 * the query rows need not be contiguous (load-balanced chunks r and 2C-1-r). One row at a time with a
 * running max and sum (the log-sum-exp merge): nothing is allocated, no tq x tk matrix exists. Grouped-query
 * heads and the block-major rows of an all-gather or all-to-all are read in place (kernels.h). Work is split
 * over (batch, head) pairs, in backward (batch, key/value head) pairs: a pair writes only its own columns,
 * so the accumulated key and value gradients are race-free and deterministic. When the matmuls compute in bf16, the products take
 * bf16-rounded operands as attention.c's do (q, k, v, dO, and P and dS where they multiply), with the
 * softmax statistics and every sum in fp32. */
#include <math.h>
#include <stdbool.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

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
    return 0;
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

int cpu_attention_cp_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const struct kernels_attention_cp *a)
{
    FSDP_TRY(check("attention_cp_forward", a));
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
                if (a->kpos[j] > a->qpos[i])
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

int cpu_attention_cp_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const struct kernels_attention_cp *a)
{
    FSDP_TRY(check("attention_cp_backward", a));
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
                    if (a->kpos[j] > a->qpos[i])
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
