/* Whole-buffer vector ops: residual add (also the one fused before a norm), scaling, axpy, squared norm. */
#include "common/error.h"
#include "kernels/cpu/cpu.h"

CPU_SIMD_CLONES
static void add_chunk(float *out, const float *a, const float *b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

CPU_SIMD_CLONES
static void scale_chunk(float *x, float s, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

CPU_SIMD_CLONES
static void axpy_chunk(float *y, float a, const float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* Squares and sums in double: the global gradient norm adds millions of terms of very different
 * magnitude, and float accumulation would lose the small ones. */
CPU_SIMD_CLONES
static double sqnorm_chunk(const float *x, size_t n)
{
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

int cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    if (n && (!out || !a || !b))
        return error_set(FSDP_EINVAL, "kernels cpu: residual_forward: NULL buffer");
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        add_chunk(out + lo, a + lo, b + lo, len);
    }
    return 0;
}

int cpu_residual_norm_rows(const char *op, float *res, const float *out, const float *a, const float *b, int n,
                           int c, float eps, void (*row)(void *ctx, int i, const float *x), void *ctx)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cpu: %s: bad n=%d c=%d eps=%g", op, n, c, (double)eps);
    if (out == res || out == a || out == b)
        return error_set(FSDP_EINVAL, "kernels cpu: %s: out aliases res, a or b", op);
#pragma omp parallel for schedule(static) if ((long)n * c > CPU_CHUNK)
    for (int i = 0; i < n; i++) {
        size_t o = (size_t)i * c;
#pragma omp simd
        for (int j = 0; j < c; j++)
            res[o + j] = a[o + j] + b[o + j];
        row(ctx, i, res + o);
    }
    return 0;
}

int cpu_scale(float *x, float s, size_t n)
{
    if (n && !x)
        return error_set(FSDP_EINVAL, "kernels cpu: scale: NULL buffer");
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        scale_chunk(x + lo, s, len);
    }
    return 0;
}

int cpu_axpy(float *y, float a, const float *x, size_t n)
{
    if (n && (!y || !x))
        return error_set(FSDP_EINVAL, "kernels cpu: axpy: NULL buffer");
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        axpy_chunk(y + lo, a, x + lo, len);
    }
    return 0;
}

/* The sum is split into a fixed number of blocks, whatever the thread count, and the block sums are
 * added in order: ranks running with different OMP_NUM_THREADS get the same bits. */
#define SQNORM_BLOCKS 256

/* Nothing to batch on the CPU: each buffer as sqnorm computes it, added in order. */
int cpu_sqnorm_sum(double *total, const float *const *xs, const size_t *ns, int count)
{
    if (!total || count < 0 || (count && (!xs || !ns)))
        return error_set(FSDP_EINVAL, "kernels cpu: sqnorm_sum: NULL argument or negative count %d", count);
    double s = 0.0;
    for (int i = 0; i < count; i++) {
        double one;
        FSDP_TRY(cpu_sqnorm(&one, xs[i], ns[i]));
        s += one;
    }
    *total = s;
    return 0;
}

int cpu_grad_clip(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale, double max_norm)
{
    if (!out || n < 1 || !sq || !(loss_scale > 0))
        return error_set(FSDP_EINVAL, "kernels cpu: grad_clip: NULL argument, %d norms or loss scale %g", n,
                         loss_scale);
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += sq[i];
    kernels_grad_clip_finish(out, s, loss_scale, max_norm);
    return 0;
}

int cpu_sqnorm(double *result, const float *x, size_t n)
{
    if (!result || (n && !x))
        return error_set(FSDP_EINVAL, "kernels cpu: sqnorm: NULL argument");
    double part[SQNORM_BLOCKS];
    size_t per = (n + SQNORM_BLOCKS - 1) / SQNORM_BLOCKS;
    per = (per + 63) & ~(size_t)63; /* whole cache lines per block */
#pragma omp parallel for schedule(static) if (n > CPU_CHUNK)
    for (int blk = 0; blk < SQNORM_BLOCKS; blk++) {
        size_t lo = (size_t)blk * per;
        part[blk] = lo < n ? sqnorm_chunk(x + lo, n - lo < per ? n - lo : per) : 0.0;
    }
    double total = 0.0;
    for (int blk = 0; blk < SQNORM_BLOCKS; blk++)
        total += part[blk];
    *result = total;
    return 0;
}
