/* Context-parallel causal attention on CPU: a rank's query rows (at their global positions) against the
 * keys and values of the whole sequence (gathered from the context group), masked by global position, so
 * the query rows need not be contiguous (load-balanced chunks r and 2C-1-r). One row at a time with a
 * running max and sum (the log-sum-exp merge): nothing is allocated, no tq x tk matrix exists. Work is
 * split over (batch, head) pairs; a pair writes only its own head's columns, so the accumulated key and
 * value gradients are race-free and deterministic. When the matmuls compute in bf16, the products take
 * bf16-rounded operands as attention.c's do (q, k, v, dO, and P and dS where they multiply), with the
 * softmax statistics and every sum in fp32. */
#include <math.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

static int check(const char *op, const struct kernels_attention_cp *a)
{
    if (a->b < 1 || a->tq < 0 || a->tk < 0 || a->c < 1 || a->nh < 1 || a->c % a->nh != 0 || a->ld < a->c ||
        (a->tq && !a->qpos) || (a->tk && !a->kpos))
        return error_set(FSDP_EINVAL, "%s: bad shape b=%d tq=%d tk=%d c=%d nh=%d ld=%d", op, a->b, a->tq, a->tk,
                         a->c, a->nh, a->ld);
    return 0;
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
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pairs; p++) {
        int bb = p / a->nh, h = p % a->nh;
        for (int i = 0; i < a->tq; i++) {
            const float *qi = q + ((size_t)bb * a->tq + i) * a->ld + h * hs;
            float *oi = out + ((size_t)bb * a->tq + i) * a->c + h * hs;
            for (int d = 0; d < hs; d++)
                oi[d] = 0;
            /* Running max m and sum l: a key raising the max rescales what was summed so far. */
            float m = -INFINITY, l = 0;
            for (int j = 0; j < a->tk; j++) {
                if (a->kpos[j] > a->qpos[i])
                    continue;
                float s = scale * dot(qi, k + ((size_t)bb * a->tk + j) * a->ld + h * hs, hs, lp);
                if (s > m) {
                    float corr = expf(m - s);
                    l *= corr;
                    for (int d = 0; d < hs; d++)
                        oi[d] *= corr;
                    m = s;
                }
                float e = expf(s - m), er = rd(e, lp);
                l += e;
                const float *vj = v + ((size_t)bb * a->tk + j) * a->ld + h * hs;
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
    int hs = a->c / a->nh, pairs = a->b * a->nh, lp = cpu_matmul_compute_dtype() == DTYPE_BF16;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pairs; p++) {
        int bb = p / a->nh, h = p % a->nh;
        for (int i = 0; i < a->tq; i++) {
            size_t qr = (size_t)bb * a->tq + i;
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
                size_t kr = (size_t)bb * a->tk + j;
                const float *kj = k + kr * a->ld + h * hs, *vj = v + kr * a->ld + h * hs;
                float pr = expf(scale * dot(qi, kj, hs, lp) - L);
                float ds = pr * (dot(doi, vj, hs, lp) - D) * scale;
                float prr = rd(pr, lp), dsr = rd(ds, lp);
                float *dkj = dk + kr * a->ld + h * hs, *dvj = dv + kr * a->ld + h * hs;
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
