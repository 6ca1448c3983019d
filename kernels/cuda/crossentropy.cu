/* Fused softmax cross-entropy over a padded vocabulary: one block per row; each thread keeps an online
 * (max, sum) over its strided columns, the block combines them into the row's log-sum-exp, and a second
 * sweep writes dlogits. No probability tensor exists; logits are read twice (the second time mostly
 * from L2 for GPT-2's 50k vocabulary). Padded columns v..vp-1 are never read. Logits and dlogits may be bf16
 * activations (act.cu), llm.c's and autocast's bf16 logits: half the bytes of the step's largest tensor. */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define XENT_THREADS 512

__global__ void __launch_bounds__(XENT_THREADS)
    xent_kernel(float *losses, double *row_loss, float *dlogits, const float *logits, const int32_t *targets,
                int v, int vp, float dloss, bool x_lp, bool dx_lp)
{
    __shared__ float shf[32];
    __shared__ float sh_xt;
    int row = blockIdx.x;
    /* logits and dlogits may be bf16 activations (act.cu): read and written in their own elements */
    const float *x = cuda_act_row(logits, (size_t)row * vp, x_lp);
    float *dx = dlogits ? cuda_act_row(dlogits, (size_t)row * vp, dx_lp) : NULL;
    int tgt = targets[row];
    if (tgt < 0 || tgt >= v) { /* -1: ignored; out of range: skipped here, reported by the range check */
        if (dx)
            for (int j = threadIdx.x; j < vp; j += blockDim.x)
                cuda_act_store(dx, j, 0.0f, dx_lp);
        if (threadIdx.x == 0) {
            if (losses)
                losses[row] = 0.0f;
            if (row_loss)
                row_loss[row] = 0.0;
        }
        return;
    }
    if (threadIdx.x == 0)
        sh_xt = cuda_act_load(x, tgt, x_lp); /* read before dx (possibly the same row) is overwritten */
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float xj = cuda_act_load(x, j, x_lp);
        if (xj > m) {
            s *= __expf(m - xj);
            m = xj;
        }
        s += __expf(xj - m);
    }
    /* Block max, then every thread rescales its sum to it. */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float bm = cuda_warp_max(m);
    if (lane == 0)
        shf[warp] = bm;
    __syncthreads();
    bm = cuda_warp_max(lane < nw ? shf[lane] : -INFINITY);
    float scaled = m == -INFINITY ? 0.0f : s * __expf(m - bm);
    float total = cuda_block_sum(scaled, shf);
    float lse = bm + logf(total);
    float xt = sh_xt; /* published by the __syncthreads inside the reductions */
    __syncthreads();  /* every thread has read x[tgt] before anyone overwrites it */
    if (dx) {
        for (int j = threadIdx.x; j < v; j += blockDim.x)
            cuda_act_store(dx, j, dloss * (__expf(cuda_act_load(x, j, x_lp) - lse) - (j == tgt ? 1.0f : 0.0f)),
                              dx_lp);
        for (int j = v + threadIdx.x; j < vp; j += blockDim.x)
            cuda_act_store(dx, j, 0.0f, dx_lp);
    }
    if (threadIdx.x == 0) {
        float loss = lse - xt;
        if (losses)
            losses[row] = loss;
        if (row_loss)
            row_loss[row] = loss;
    }
}

/* One block adds the row losses in a fixed order (the same bits on every run) and the total to the caller's
 * device accumulator: the loss never leaves the device here, so the step's backward is queued behind the
 * forward without a host round trip. */
__global__ void xent_sum_kernel(double *acc, const double *row_loss, int n)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += row_loss[i];
    s = cuda_block_sum(s, sh);
    if (threadIdx.x == 0)
        *acc += s;
}

int cuda_crossentropy_forward_backward(float *losses, double *loss_acc, float *dlogits, const float *logits,
                                       const int32_t *targets, int n, int v, int vp, float dloss)
{
    if (n < 0 || v <= 0 || vp < v)
        return error_set(FSDP_EINVAL, "kernels cuda: crossentropy: bad shape n=%d v=%d vp=%d (need vp >= v)", n,
                         v, vp);
    FSDP_TRY(cuda_check_ids("crossentropy", "target (or -1 to ignore)", targets, n, -1, v));
    if (n == 0)
        return 0;
    bool x_lp, dx_lp = false;
    FSDP_TRY(cuda_act_lowp("crossentropy", logits, &x_lp));
    if (dlogits)
        FSDP_TRY(cuda_act_lowp("crossentropy", dlogits, &dx_lp));
    void *row_loss = NULL;
    if (loss_acc)
        FSDP_TRY(cuda_scratch("crossentropy", &row_loss, (size_t)n * sizeof(double)));
    xent_kernel<<<n, XENT_THREADS, 0, cuda_ctx.stream>>>(losses, (double *)row_loss, dlogits, logits, targets, v,
                                                         vp, dloss, x_lp, dx_lp);
    FSDP_TRY(cuda_check_launch("crossentropy"));
    if (!loss_acc)
        return 0;
    xent_sum_kernel<<<1, 1024, 0, cuda_ctx.stream>>>(loss_acc, (const double *)row_loss, n);
    return cuda_check_launch("crossentropy (loss sum)");
}
