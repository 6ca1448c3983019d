/* LayerNorm over the channel dimension, saving mean and 1/std per row for backward. */
#include <math.h>
#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* Columns per task for the weight/bias gradient: reducing over rows by column strips keeps the sum
 * deterministic and race-free without per-thread partial buffers. */
#define LN_STRIP 64

CPU_SIMD_CLONES
static void ln_row_forward(float *out, float *mean_out, float *rstd_out, const float *x, const float *w,
                           const float *b, int c, float eps)
{
    /* The mean in double: residual-stream rows can carry a large common offset, and a float sum of
     * thousands of such values is off by enough to shift every normalised output. */
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < c; j++)
        sum += x[j];
    float mean = (float)(sum / c);
    /* Two passes (mean, then squared deviations) rather than E[x^2]-E[x]^2, which cancels badly for rows
     * with a large mean. */
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int j = 0; j < c; j++) {
        float d = x[j] - mean;
        var += d * d;
    }
    float rstd = 1.0f / sqrtf(var / (float)c + eps);
#pragma omp simd
    for (int j = 0; j < c; j++)
        out[j] = (x[j] - mean) * rstd * w[j] + b[j];
    *mean_out = mean;
    *rstd_out = rstd;
}

int cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cpu: layernorm_forward: bad n=%d c=%d eps=%g", n, c,
                         (double)eps);
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
    for (int i = 0; i < n; i++)
        ln_row_forward(out + (size_t)i * c, mean + i, rstd + i, inp + (size_t)i * c, weight, bias, c, eps);
    return 0;
}

/* What a row of residual_layernorm_forward needs besides its input. */
struct ln_rows {
    float *out, *mean, *rstd;
    const float *weight, *bias;
    int c;
    float eps;
};

static void ln_residual_row(void *ctx, int i, const float *x)
{
    const struct ln_rows *r = ctx;
    ln_row_forward(r->out + (size_t)i * r->c, r->mean + i, r->rstd + i, x, r->weight, r->bias, r->c, r->eps);
}

/* The residual add and the norm after it, row by row (cpu_residual_norm_rows). The row function is the one
 * layernorm_forward uses, so the bits are the same as the two ops'. */
int cpu_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                   const float *weight, const float *bias, int n, int c, float eps)
{
    struct ln_rows rows = {out, mean, rstd, weight, bias, c, eps};
    return cpu_residual_norm_rows("residual_layernorm_forward", res, out, a, b, n, c, eps, ln_residual_row, &rows);
}

CPU_SIMD_CLONES
static void ln_row_backward(float *dx, const float *dy, const float *x, const float *w, float mean,
                            float rstd, int c)
{
    float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
    for (int j = 0; j < c; j++) {
        float dn = dy[j] * w[j];
        sum_dn += dn;
        sum_dn_n += dn * (x[j] - mean) * rstd;
    }
    float mean_dn = sum_dn / (float)c, mean_dn_n = sum_dn_n / (float)c;
#pragma omp simd
    for (int j = 0; j < c; j++) {
        float nrm = (x[j] - mean) * rstd;
        dx[j] += (dy[j] * w[j] - mean_dn - nrm * mean_dn_n) * rstd;
    }
}

CPU_SIMD_CLONES
static void ln_strip_params(float *dw, float *db, const float *dy, const float *x, const float *mean,
                            const float *rstd, int n, int c, int j0, int j1)
{
    float aw[LN_STRIP] = {0}, ab[LN_STRIP] = {0};
    int m = j1 - j0;
    for (int i = 0; i < n; i++) {
        const float *g = dy + (size_t)i * c + j0, *xi = x + (size_t)i * c + j0;
        float mu = mean[i], rs = rstd[i];
#pragma omp simd
        for (int j = 0; j < m; j++) {
            aw[j] += g[j] * (xi[j] - mu) * rs;
            ab[j] += g[j];
        }
    }
    for (int j = 0; j < m; j++) {
        if (dw)
            dw[j0 + j] += aw[j];
        if (db)
            db[j0 + j] += ab[j];
    }
}

/* One thread: the input gradient and the weight/bias sums in one pass over the rows, while a row of dy
 * and x is in L1, instead of a second pass reading both again in column strips. Each column is still
 * summed over rows 0..n-1 with the same expression as ln_strip_params, so the sums have the same bits. */
#define LN_FUSED_MAX 4096

CPU_SIMD_CLONES
static void ln_rows_backward_fused(float *dinp, float *dw, float *db, const float *dy, const float *x,
                                   const float *w, const float *mean, const float *rstd, int n, int c)
{
    float aw[LN_FUSED_MAX], ab[LN_FUSED_MAX];
    for (int j = 0; j < c; j++)
        aw[j] = 0.0f, ab[j] = 0.0f;
    for (int i = 0; i < n; i++) {
        const float *g = dy + (size_t)i * c, *xi = x + (size_t)i * c;
        float mu = mean[i], rs = rstd[i];
        ln_row_backward(dinp + (size_t)i * c, g, xi, w, mu, rs, c);
#pragma omp simd
        for (int j = 0; j < c; j++) {
            aw[j] += g[j] * (xi[j] - mu) * rs;
            ab[j] += g[j];
        }
    }
    for (int j = 0; j < c; j++) {
        if (dw)
            dw[j] += aw[j];
        if (db)
            db[j] += ab[j];
    }
}

int cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int n, int c)
{
    if (n < 0 || c <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: layernorm_backward: bad n=%d c=%d", n, c);
    if (dinp && (dweight || dbias) && c <= LN_FUSED_MAX &&
        ((long)n * c <= CPU_CHUNK || omp_get_max_threads() == 1)) {
        ln_rows_backward_fused(dinp, dweight, dbias, dout, inp, weight, mean, rstd, n, c);
        return 0;
    }
    if (dinp) {
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
        for (int i = 0; i < n; i++)
            ln_row_backward(dinp + (size_t)i * c, dout + (size_t)i * c, inp + (size_t)i * c, weight,
                            mean[i], rstd[i], c);
    }
    if (dweight || dbias) {
        int strips = (c + LN_STRIP - 1) / LN_STRIP;
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
        for (int s = 0; s < strips; s++) {
            int j0 = s * LN_STRIP, j1 = j0 + LN_STRIP < c ? j0 + LN_STRIP : c;
            ln_strip_params(dweight, dbias, dout, inp, mean, rstd, n, c, j0, j1);
        }
    }
    return 0;
}
