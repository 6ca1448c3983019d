/* Fused softmax + cross-entropy over a padded vocabulary: per row one chunked pass for the log-sum-exp
 * (online max/sum) and one pass writing dlogits, so no probability tensor exists and logits are read
 * twice at most. The padded columns v..vp-1 are never read. */
#include <math.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

/* Vocabulary columns per online-softmax step: fits L1 with room for the dlogits row. */
#define XENT_CHUNK 2048

CPU_SIMD_CLONES
static float xent_row_lse(const float *x, int v)
{
    float m = -INFINITY, sum = 0.0f;
    for (int j0 = 0; j0 < v; j0 += XENT_CHUNK) {
        int j1 = j0 + XENT_CHUNK < v ? j0 + XENT_CHUNK : v;
        float cm = x[j0];
#pragma omp simd reduction(max : cm)
        for (int j = j0 + 1; j < j1; j++)
            cm = x[j] > cm ? x[j] : cm;
        if (cm > m) {
            sum *= fastmath_expf(m - cm);
            m = cm;
        }
        float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
        for (int j = j0; j < j1; j++)
            cs += fastmath_expf(x[j] - m);
        sum += cs;
    }
    return m + logf(sum);
}

CPU_SIMD_CLONES
static void xent_row_grad(float *dx, const float *x, int v, int vp, float lse, float dloss)
{
#pragma omp simd
    for (int j = 0; j < v; j++)
        dx[j] = dloss * fastmath_expf(x[j] - lse);
    for (int j = v; j < vp; j++)
        dx[j] = 0.0f;
}

/* Loss of one row (0 when ignored); writes its losses entry and dlogits row when asked. */
static double xent_row(float *losses, float *dlogits, const float *logits, const int32_t *targets, int i,
                       int v, int vp, float dloss)
{
    const float *x = logits + (size_t)i * vp;
    float *dx = dlogits ? dlogits + (size_t)i * vp : NULL;
    int tgt = targets[i];
    if (tgt < 0) {
        if (losses)
            losses[i] = 0.0f;
        if (dx)
            for (int j = 0; j < vp; j++)
                dx[j] = 0.0f;
        return 0.0;
    }
    float lse = xent_row_lse(x, v);
    float xt = x[tgt]; /* read before dx (possibly the same row) is overwritten */
    float loss = lse - xt;
    if (losses)
        losses[i] = loss;
    if (dx) {
        xent_row_grad(dx, x, v, vp, lse, dloss);
        dx[tgt] -= dloss;
    }
    return loss;
}

/* Rows are summed in a fixed number of blocks, added in order, so loss_sum has the same bits for any
 * thread count. */
#define XENT_BLOCKS 64

int cpu_crossentropy_forward_backward(float *losses, double *loss_sum, float *dlogits,
                                      const float *logits, const int32_t *targets, int n, int v, int vp,
                                      float dloss)
{
    if (n < 0 || v <= 0 || vp < v)
        return error_set(FSDP_EINVAL, "kernels cpu: crossentropy: bad shape n=%d v=%d vp=%d (need vp >= v)",
                         n, v, vp);
    for (int i = 0; i < n; i++)
        if (targets[i] < -1 || targets[i] >= v)
            return error_set(FSDP_ERANGE, "kernels cpu: crossentropy: target %d at row %d is outside [0, %d) "
                             "and not -1 (ignore)", (int)targets[i], i, v);
    double part[XENT_BLOCKS];
    int per = (n + XENT_BLOCKS - 1) / XENT_BLOCKS;
#pragma omp parallel for schedule(dynamic, 1) if ((long)n * v > CPU_CHUNK)
    for (int blk = 0; blk < XENT_BLOCKS; blk++) {
        int r0 = blk * per, r1 = r0 + per < n ? r0 + per : n;
        double s = 0.0;
        for (int i = r0; i < r1; i++)
            s += xent_row(losses, dlogits, logits, targets, i, v, vp, dloss);
        part[blk] = s;
    }
    double total = 0.0;
    for (int blk = 0; blk < XENT_BLOCKS; blk++)
        total += part[blk];
    if (loss_sum)
        *loss_sum = total;
    return 0;
}
