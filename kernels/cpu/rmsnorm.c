/* RMSNorm over the channel dimension (Llama's LlamaRMSNorm): out = inp / rms(inp) * weight, saving 1/rms
 * per row for backward. */
#include <math.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* Columns per task for the weight gradient: reducing over rows by column strips keeps the sum
 * deterministic and race-free without per-thread partial buffers. */
#define RMS_STRIP 64

CPU_SIMD_CLONES
static void rms_row_forward(float *out, float *rstd_out, const float *x, const float *w, int c, float eps)
{
    /* The mean of squares has no cancellation (every term is >= 0), so a float sum over the vector lanes
     * is accurate to a few ulp, as torch's own reduction is. */
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < c; j++)
        ss += x[j] * x[j];
    float rstd = 1.0f / sqrtf(ss / (float)c + eps);
    /* (x rstd) w, in this order, as transformers computes it */
#pragma omp simd
    for (int j = 0; j < c; j++)
        out[j] = (x[j] * rstd) * w[j];
    *rstd_out = rstd;
}

int cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cpu: rmsnorm_forward: bad n=%d c=%d eps=%g", n, c, (double)eps);
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
    for (int i = 0; i < n; i++)
        rms_row_forward(out + (size_t)i * c, rstd + i, inp + (size_t)i * c, weight, c, eps);
    return 0;
}

/* What a row of residual_rmsnorm_forward needs besides its input. */
struct rms_rows {
    float *out, *rstd;
    const float *weight;
    int c;
    float eps;
};

static void rms_residual_row(void *ctx, int i, const float *x)
{
    const struct rms_rows *r = ctx;
    rms_row_forward(r->out + (size_t)i * r->c, r->rstd + i, x, r->weight, r->c, r->eps);
}

/* The residual add and the norm after it, row by row (cpu_residual_norm_rows), with rmsnorm_forward's own row
 * function: the same bits as the two ops. */
int cpu_residual_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b,
                                 const float *weight, int n, int c, float eps)
{
    struct rms_rows rows = {out, rstd, weight, c, eps};
    return cpu_residual_norm_rows("residual_rmsnorm_forward", res, out, a, b, n, c, eps, rms_residual_row, &rows);
}

/* With nrm = x rstd: dx = rstd (dy w - nrm mean(dy w nrm)). */
CPU_SIMD_CLONES
static void rms_row_backward(float *dx, const float *dy, const float *x, const float *w, float rstd, int c)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < c; j++)
        s += dy[j] * w[j] * (x[j] * rstd);
    float mean = s / (float)c;
#pragma omp simd
    for (int j = 0; j < c; j++)
        dx[j] += (dy[j] * w[j] - (x[j] * rstd) * mean) * rstd;
}

CPU_SIMD_CLONES
static void rms_strip_weight(float *dw, const float *dy, const float *x, const float *rstd, int n, int c, int j0,
                             int j1)
{
    float aw[RMS_STRIP] = {0};
    int m = j1 - j0;
    for (int i = 0; i < n; i++) {
        const float *g = dy + (size_t)i * c + j0, *xi = x + (size_t)i * c + j0;
        float rs = rstd[i];
#pragma omp simd
        for (int j = 0; j < m; j++)
            aw[j] += g[j] * (xi[j] * rs);
    }
    for (int j = 0; j < m; j++)
        dw[j0 + j] += aw[j];
}

/* One thread: the input gradient and the weight sums in one pass over the rows, while a row of dy and x
 * is in L1. Each column is summed over rows 0..n-1 with the same expression as rms_strip_weight, so the
 * sums have the same bits whichever path runs. */
#define RMS_FUSED_MAX 8192

CPU_SIMD_CLONES
static void rms_rows_backward_fused(float *dinp, float *dw, const float *dy, const float *x, const float *w,
                                    const float *rstd, int n, int c)
{
    float aw[RMS_FUSED_MAX];
    for (int j = 0; j < c; j++)
        aw[j] = 0.0f;
    for (int i = 0; i < n; i++) {
        const float *g = dy + (size_t)i * c, *xi = x + (size_t)i * c;
        float rs = rstd[i];
        rms_row_backward(dinp + (size_t)i * c, g, xi, w, rs, c);
#pragma omp simd
        for (int j = 0; j < c; j++)
            aw[j] += g[j] * (xi[j] * rs);
    }
    for (int j = 0; j < c; j++)
        dw[j] += aw[j];
}

int cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                         const float *rstd, int n, int c)
{
    if (n < 0 || c <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: rmsnorm_backward: bad n=%d c=%d", n, c);
    if (dinp && dweight && c <= RMS_FUSED_MAX && ((long)n * c <= CPU_CHUNK || omp_get_max_threads() == 1)) {
        rms_rows_backward_fused(dinp, dweight, dout, inp, weight, rstd, n, c);
        return 0;
    }
    if (dinp) {
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
        for (int i = 0; i < n; i++)
            rms_row_backward(dinp + (size_t)i * c, dout + (size_t)i * c, inp + (size_t)i * c, weight, rstd[i], c);
    }
    if (dweight) {
        int strips = (c + RMS_STRIP - 1) / RMS_STRIP;
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
        for (int s = 0; s < strips; s++) {
            int j0 = s * RMS_STRIP, j1 = j0 + RMS_STRIP < c ? j0 + RMS_STRIP : c;
            rms_strip_weight(dweight, dout, inp, rstd, n, c, j0, j1);
        }
    }
    return 0;
}
