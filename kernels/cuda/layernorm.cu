/* LayerNorm over the channel dimension. One warp per row (8 rows per 256-thread block): a GPT row of
 * 768..1600 floats is 24..50 loads per lane, reductions stay in shuffles and no shared memory or
 * __syncthreads is needed. The parameter gradients reduce over rows in fixed chunks (partials, then the
 * chunks in order), so they are deterministic without atomics. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define LN_ROWS_PER_BLOCK (CUDA_THREADS / 32)

/* A row's norm from its lane's part of the row sum: the mean (the sum in double, as on the CPU: residual rows
 * can carry a large common offset that a float sum would lose), the variance from deviations (a second pass,
 * not E[x^2]-E[x]^2, which cancels badly for such rows), the output. */
template <bool LP>
static __device__ void ln_row_finish(float *y, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                     int c, float eps, int row, int lane, double sum)
{
    float mu = (float)(cuda_warp_sum(sum) / c);
    float var = 0.0f;
    for (int j = lane; j < c; j += 32) {
        float d = x[j] - mu;
        var += d * d;
    }
    float rs = rsqrtf(cuda_warp_sum(var) / (float)c + eps);
    for (int j = lane; j < c; j += 32)
        cuda_act_store(y, j, (x[j] - mu) * rs * w[j] + b[j], LP);
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

template <bool LP>
__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *w, const float *b, int n, int c, float eps)
{
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *x = inp + (size_t)row * c;
    double sum = 0.0;
    for (int j = lane; j < c; j += 32)
        sum += x[j];
    ln_row_finish<LP>(cuda_act_row(out, (size_t)row * c, LP), mean, rstd, x, w, b, c, eps, row, lane, sum);
}

/* The residual add and the norm in one launch: the first pass writes res = a + b and sums it, the later
 * passes read res back (the lane's own writes, mostly from cache), so the stream is read once less than
 * residual_forward + layernorm_forward, with the same arithmetic in the same order (the same bits). */
template <bool LP>
__global__ void residual_layernorm_forward_kernel(float *res, float *out, float *mean, float *rstd, const float *a,
                                                  const float *b, const float *w, const float *bias, int n, int c,
                                                  float eps)
{
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    size_t o = (size_t)row * c;
    double sum = 0.0;
    for (int j = lane; j < c; j += 32) {
        float r = a[o + j] + b[o + j];
        res[o + j] = r;
        sum += r;
    }
    ln_row_finish<LP>(cuda_act_row(out, o, LP), mean, rstd, res + o, w, bias, c, eps, row, lane, sum);
}

__global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                               const float *mean, const float *rstd, int n, int c)
{
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const float *x = inp + (size_t)row * c, *dy = dout + (size_t)row * c;
    float mu = mean[row], rs = rstd[row];
    float sum_dn = 0.0f, sum_dn_n = 0.0f;
    for (int j = lane; j < c; j += 32) {
        float dn = dy[j] * w[j];
        sum_dn += dn;
        sum_dn_n += dn * (x[j] - mu) * rs;
    }
    float mean_dn = cuda_warp_sum(sum_dn) / (float)c, mean_dn_n = cuda_warp_sum(sum_dn_n) / (float)c;
    float *dx = dinp + (size_t)row * c;
    for (int j = lane; j < c; j += 32) {
        float nrm = (x[j] - mu) * rs;
        dx[j] += (dy[j] * w[j] - mean_dn - nrm * mean_dn_n) * rs;
    }
}

/* part: [2][chunks][c], the dweight then the dbias partial of each row chunk. */
__global__ void layernorm_backward_params_partial_kernel(float *part, const float *dout, const float *inp,
                                                         const float *mean, const float *rstd, int n, int c,
                                                         int chunks, int chunk_rows)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    int r0 = blockIdx.y * chunk_rows, r1 = min(r0 + chunk_rows, n);
    float aw = 0.0f, ab = 0.0f;
    for (int i = r0; i < r1; i++) {
        float g = dout[(size_t)i * c + j];
        aw += g * (inp[(size_t)i * c + j] - mean[i]) * rstd[i];
        ab += g;
    }
    part[(size_t)blockIdx.y * c + j] = aw;
    part[((size_t)chunks + blockIdx.y) * c + j] = ab;
}

__global__ void layernorm_backward_params_finish_kernel(float *dweight, float *dbias, const float *part, int c,
                                                        int chunks)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    float aw = 0.0f, ab = 0.0f;
    for (int k = 0; k < chunks; k++) {
        aw += part[(size_t)k * c + j];
        ab += part[((size_t)chunks + k) * c + j];
    }
    if (dweight)
        dweight[j] += aw;
    if (dbias)
        dbias[j] += ab;
}

int cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                           const float *bias, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: layernorm_forward: bad n=%d c=%d eps=%g", n, c, (double)eps);
    if (n == 0)
        return 0;
    bool lp;
    FSDP_TRY(cuda_act_lowp("layernorm_forward", out, &lp));
    unsigned blocks = (unsigned)((n + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    if (lp)
        layernorm_forward_kernel<true>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, mean, rstd, inp, weight, bias, n, c, eps);
    else
        layernorm_forward_kernel<false>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, mean, rstd, inp, weight, bias, n, c, eps);
    return cuda_check_launch("layernorm_forward");
}

int cuda_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *weight, const float *bias, int n, int c, float eps)
{
    if (n < 0 || c <= 0 || !(eps >= 0.0f))
        return error_set(FSDP_EINVAL, "kernels cuda: residual_layernorm_forward: bad n=%d c=%d eps=%g", n, c,
                         (double)eps);
    if (out == res || out == a || out == b)
        return error_set(FSDP_EINVAL, "kernels cuda: residual_layernorm_forward: out aliases res, a or b");
    if (n == 0)
        return 0;
    bool lp;
    FSDP_TRY(cuda_act_lowp("residual_layernorm_forward", out, &lp));
    unsigned blocks = (unsigned)((n + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    if (lp)
        residual_layernorm_forward_kernel<true>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(res, out, mean, rstd, a, b, weight, bias, n, c, eps);
    else
        residual_layernorm_forward_kernel<false>
            <<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(res, out, mean, rstd, a, b, weight, bias, n, c, eps);
    return cuda_check_launch("residual_layernorm_forward");
}

int cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int n, int c)
{
    if (n < 0 || c <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: layernorm_backward: bad n=%d c=%d", n, c);
    if (n == 0)
        return 0;
    if (dinp) {
        unsigned blocks = (unsigned)((n + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
        layernorm_backward_dinp_kernel<<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(dinp, dout, inp, weight, mean,
                                                                                     rstd, n, c);
        FSDP_TRY(cuda_check_launch("layernorm_backward dinp"));
    }
    if (dweight || dbias) {
        int chunk_rows = cuda_chunk_rows(n, c), chunks = (n + chunk_rows - 1) / chunk_rows;
        void *part;
        FSDP_TRY(cuda_scratch("layernorm_backward", &part, 2 * (size_t)chunks * c * sizeof(float)));
        dim3 grid((c + CUDA_THREADS - 1) / CUDA_THREADS, chunks);
        layernorm_backward_params_partial_kernel<<<grid, CUDA_THREADS, 0, cuda_ctx.stream>>>(
            (float *)part, dout, inp, mean, rstd, n, c, chunks, chunk_rows);
        layernorm_backward_params_finish_kernel<<<grid.x, CUDA_THREADS, 0, cuda_ctx.stream>>>(
            dweight, dbias, (const float *)part, c, chunks);
        FSDP_TRY(cuda_check_launch("layernorm_backward dweight/dbias"));
    }
    return 0;
}
