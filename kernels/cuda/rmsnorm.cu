/* RMSNorm over the channel dimension (Llama's LlamaRMSNorm), laid out like layernorm.cu: one warp per row
 * (8 rows per 256-thread block), reductions in shuffles; the weight gradient reduces over rows in fixed
 * chunks (partials, then the chunks in order), so it is deterministic without atomics. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define RMS_ROWS_PER_BLOCK (CUDA_THREADS / 32)

/* A row's norm from its lane's part of the sum of squares. */
template <bool LP>
static __device__ void rms_row_finish(float *y, float *rstd, const float *x, const float *w, int c, float eps, int row,
                                      int lane, float ss)
{
    float rs = rsqrtf(cuda_warp_sum(ss) / (float)c + eps);
    for (int j = lane; j < c; j += 32)
        cuda_act_store(y, j, (x[j] * rs) * w[j], LP);
    if (lane == 0)
        rstd[row] = rs;
}

template <bool LP>
__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *w, int n, int c,
                                       float eps)
{
    int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *x = inp + (size_t)row * c;
    float ss = 0.0f;
    for (int j = lane; j < c; j += 32)
        ss += x[j] * x[j];
    rms_row_finish<LP>(cuda_act_row(out, (size_t)row * c, LP), rstd, x, w, c, eps, row, lane, ss);
}

/* The residual add and the norm in one launch: the first pass writes res = a + b and sums its squares, the
 * second reads res back (the lane's own writes), with rmsnorm_forward_kernel's arithmetic (the same bits). */
template <bool LP>
__global__ void residual_rmsnorm_forward_kernel(float *res, float *out, float *rstd, const float *a, const float *b,
                                                const float *w, int n, int c, float eps)
{
    int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    size_t o = (size_t)row * c;
    float ss = 0.0f;
    for (int j = lane; j < c; j += 32) {
        float r = a[o + j] + b[o + j];
        res[o + j] = r;
        ss += r * r;
    }
    rms_row_finish<LP>(cuda_act_row(out, o, LP), rstd, res + o, w, c, eps, row, lane, ss);
}

/* With nrm = x rstd: dx += rstd (dy w - nrm mean(dy w nrm)). */
__global__ void rmsnorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                             const float *rstd, int n, int c)
{
    int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *x = inp + (size_t)row * c, *dy = dout + (size_t)row * c;
    float rs = rstd[row], s = 0.0f;
    for (int j = lane; j < c; j += 32)
        s += dy[j] * w[j] * (x[j] * rs);
    float mean = cuda_warp_sum(s) / (float)c;
    float *dx = dinp + (size_t)row * c;
    for (int j = lane; j < c; j += 32)
        dx[j] += (dy[j] * w[j] - (x[j] * rs) * mean) * rs;
}

/* part: [chunks][c], the dweight partial of each row chunk. */
__global__ void rmsnorm_backward_weight_partial_kernel(float *part, const float *dout, const float *inp,
                                                       const float *rstd, int n, int c, int chunk_rows)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    int r0 = blockIdx.y * chunk_rows, r1 = min(r0 + chunk_rows, n);
    float aw = 0.0f;
    for (int i = r0; i < r1; i++)
        aw += dout[(size_t)i * c + j] * (inp[(size_t)i * c + j] * rstd[i]);
    part[(size_t)blockIdx.y * c + j] = aw;
}

__global__ void rmsnorm_backward_weight_finish_kernel(float *dweight, const float *part, int c, int chunks)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    float aw = 0.0f;
    for (int k = 0; k < chunks; k++)
        aw += part[(size_t)k * c + j];
    dweight[j] += aw;
}

int cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: rmsnorm_forward: bad n=%d c=%d eps=%g", n, c, (double)eps);
    if (n == 0)
        return 0;
    bool lp;
    FSDP_TRY(cuda_act_lowp("rmsnorm_forward", out, &lp));
    unsigned blocks = (unsigned)((n + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK);
    if (lp)
        rmsnorm_forward_kernel<true><<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, rstd, inp, weight, n, c, eps);
    else
        rmsnorm_forward_kernel<false><<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, rstd, inp, weight, n, c, eps);
    return cuda_check_launch("rmsnorm_forward");
}

int cuda_residual_rmsnorm_forward(float *res, float *out, float *rstd, const float *a, const float *b,
                                  const float *weight, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: residual_rmsnorm_forward: bad n=%d c=%d eps=%g", n, c,
                         (double)eps);
    if (out == res || out == a || out == b)
        return error_set(FSDP_EINVAL, "kernels cuda: residual_rmsnorm_forward: out aliases res, a or b");
    if (n == 0)
        return 0;
    bool lp;
    FSDP_TRY(cuda_act_lowp("residual_rmsnorm_forward", out, &lp));
    unsigned blocks = (unsigned)((n + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK);
    if (lp)
        residual_rmsnorm_forward_kernel<true>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(res, out, rstd, a, b, weight, n, c, eps);
    else
        residual_rmsnorm_forward_kernel<false>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(res, out, rstd, a, b, weight, n, c, eps);
    return cuda_check_launch("residual_rmsnorm_forward");
}

int cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int n, int c)
{
    if (n < 0 || c <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: rmsnorm_backward: bad n=%d c=%d", n, c);
    if (n == 0)
        return 0;
    if (dinp) {
        unsigned blocks = (unsigned)((n + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK);
        rmsnorm_backward_dinp_kernel<<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(dinp, dout, inp, weight, rstd, n,
                                                                                   c);
        FSDP_TRY(cuda_check_launch("rmsnorm_backward dinp"));
    }
    if (dweight) {
        int chunk_rows = cuda_chunk_rows(n, c), chunks = (n + chunk_rows - 1) / chunk_rows;
        void *part;
        FSDP_TRY(cuda_scratch("rmsnorm_backward", &part, (size_t)chunks * c * sizeof(float)));
        dim3 grid((c + CUDA_THREADS - 1) / CUDA_THREADS, chunks);
        rmsnorm_backward_weight_partial_kernel<<<grid, CUDA_THREADS, 0, cuda_ctx.stream>>>((float *)part, dout, inp,
                                                                                           rstd, n, c, chunk_rows);
        rmsnorm_backward_weight_finish_kernel<<<grid.x, CUDA_THREADS, 0, cuda_ctx.stream>>>(
            dweight, (const float *)part, c, chunks);
        FSDP_TRY(cuda_check_launch("rmsnorm_backward dweight"));
    }
    return 0;
}
