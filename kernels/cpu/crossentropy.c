/* Fused softmax + cross-entropy over a padded vocabulary: per row one chunked pass computing the
 * log-sum-exp and the unnormalised exponentials (into dlogits), then one pass scaling them, so no
 * probability tensor exists beyond dlogits itself. The padded columns v..vp-1 are never read. */
#include <math.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

/* Vocabulary columns per chunk: a chunk of logits and its dlogits fit L1 together. */
#define XENT_CHUNK 2048
/* Chunks per row whose maxima fit the stack array below; wider vocabularies use wider chunks. */
#define XENT_MAX_CHUNKS 64

/* Max of x[0..n). */
CPU_SIMD_CLONES
static float xent_max(const float *x, int n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int j = 1; j < n; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

/* Sum of exp(x - m) over x[0..n); with e != NULL also stores each exp in e (e may equal x). */
CPU_SIMD_CLONES CPU_FP_CONTRACT
static float xent_expsum(float *e, const float *x, int n, float m)
{
    float s = 0.0f;
    if (e) {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < n; j++) {
            float p = fastmath_expf(x[j] - m);
            e[j] = p;
            s += p;
        }
    } else {
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < n; j++)
            s += fastmath_expf(x[j] - m);
    }
    return s;
}

CPU_SIMD_CLONES
static void xent_scale(float *x, int n, float a)
{
#pragma omp simd
    for (int j = 0; j < n; j++)
        x[j] *= a;
}

/* Loss of one row (0 when ignored); writes its losses entry and dlogits row when asked.
 * Each chunk is exponentiated once, against its own max: the exponentials go straight into dlogits and
 * are rescaled by dloss * exp(chunk max - lse) once the row's log-sum-exp is known, so the gradient
 * costs one exp per logit, not two (the row, ~200 KB at GPT-2's vocabulary, stays in L2 between the
 * two passes). */
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
    float xt = x[tgt]; /* read before dx (possibly the same row) is overwritten */
    int chunk = XENT_CHUNK;
    if ((v + chunk - 1) / chunk > XENT_MAX_CHUNKS)
        chunk = (v + XENT_MAX_CHUNKS - 1) / XENT_MAX_CHUNKS;
    int nch = (v + chunk - 1) / chunk;
    float cmax[XENT_MAX_CHUNKS], csum[XENT_MAX_CHUNKS];
    float m = -INFINITY;
    for (int c = 0; c < nch; c++) {
        int j0 = c * chunk, n = j0 + chunk < v ? chunk : v - j0;
        cmax[c] = xent_max(x + j0, n);
        csum[c] = xent_expsum(dx ? dx + j0 : NULL, x + j0, n, cmax[c]);
        m = cmax[c] > m ? cmax[c] : m;
    }
    float sum = 0.0f;
    for (int c = 0; c < nch; c++)
        sum += csum[c] * fastmath_expf(cmax[c] - m);
    float lse = m + logf(sum);
    float loss = lse - xt;
    if (losses)
        losses[i] = loss;
    if (dx) {
        for (int c = 0; c < nch; c++) {
            int j0 = c * chunk, n = j0 + chunk < v ? chunk : v - j0;
            xent_scale(dx + j0, n, dloss * fastmath_expf(cmax[c] - lse));
        }
        for (int j = v; j < vp; j++)
            dx[j] = 0.0f;
        dx[tgt] -= dloss;
    }
    return loss;
}

/* Rows are summed in a fixed number of blocks, added in order, so the loss sum has the same bits for any
 * thread count. */
#define XENT_BLOCKS 64

int cpu_crossentropy_forward_backward(float *losses, double *loss_acc, float *dlogits,
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
    if (loss_acc)
        *loss_acc += total;
    return 0;
}
