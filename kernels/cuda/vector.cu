/* Whole-buffer vector ops: residual add, scaling, axpy, squared norm. Grid-stride loops over size_t
 * indices so buffers above 2^31 elements (a large model's flat shard) work. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#include <string.h>

#define GRID_STRIDE(i, n)                                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= s;
}

__global__ void axpy_kernel(float *y, float a, const float *x, size_t n)
{
    GRID_STRIDE(i, n) y[i] += a * x[i];
}

int cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    if (n == 0)
        return 0;
    if (!out || !a || !b)
        return error_set(FSDP_EINVAL, "kernels cuda: residual_forward: NULL buffer");
    add_kernel<<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(out, a, b, n);
    return cuda_check_launch("residual_forward");
}

int cuda_scale(float *x, float s, size_t n)
{
    if (n == 0)
        return 0;
    if (!x)
        return error_set(FSDP_EINVAL, "kernels cuda: scale: NULL buffer");
    scale_kernel<<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(x, s, n);
    return cuda_check_launch("scale");
}

int cuda_axpy(float *y, float a, const float *x, size_t n)
{
    if (n == 0)
        return 0;
    if (!y || !x)
        return error_set(FSDP_EINVAL, "kernels cuda: axpy: NULL buffer");
    axpy_kernel<<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(y, a, x, n);
    return cuda_check_launch("axpy");
}

/* Squares summed in double (the global gradient norm adds millions of terms of very different
 * magnitude). A fixed grid of per-block partials, then one block adding them in a fixed order: the
 * result is the same bits on every run, with no atomics. */
#define SQNORM_MAX_BLOCKS 1024

__global__ void sqnorm_partial_kernel(double *part, const float *x, size_t n)
{
    __shared__ double sh[32];
    double s = 0.0;
    GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
    s = cuda_block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void sqnorm_finish_kernel(double *part, int nparts)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        s += part[i];
    s = cuda_block_sum(s, sh);
    if (threadIdx.x == 0)
        part[0] = s;
}

/* One thread adds m slices' sums (slot 0 of each, stride apart) in order to *total, from 0 on the first
 * batch (the host's loop over the units did the same additions before). */
__global__ void sqnorm_add_slices_kernel(double *total, const double *part, int m, size_t stride, int first)
{
    double s = first ? 0.0 : *total;
    for (int i = 0; i < m; i++)
        s += part[(size_t)i * stride];
    *total = s;
}

/* The partial and finishing kernels of each buffer into its own slice of the scratch (the sum in slot 0 of the
 * slice, as sqnorm's), then one thread adds the slices in order, CUDA_SCALARS buffers at a time: the step's
 * squared norm never leaves the device (an optimizer step read it back once per unit, then once per step). */
int cuda_sqnorm_sum(double *total, const float *const *xs, const size_t *ns, int count)
{
    if (!total || count < 0 || (count && (!xs || !ns)))
        return error_set(FSDP_EINVAL, "kernels cuda: sqnorm_sum: NULL argument or negative count %d", count);
    if (count == 0)
        return cuda_check("sqnorm_sum", cudaMemsetAsync(total, 0, sizeof *total, cuda_ctx.stream));
    for (int lo = 0; lo < count; lo += CUDA_SCALARS) {
        int m = count - lo < CUDA_SCALARS ? count - lo : CUDA_SCALARS;
        void *scratch;
        FSDP_TRY(cuda_scratch("sqnorm_sum", &scratch, (size_t)m * SQNORM_MAX_BLOCKS * sizeof(double)));
        double *part = (double *)scratch;
        FSDP_TRY(cuda_check("sqnorm_sum", cudaMemsetAsync(part, 0, (size_t)m * SQNORM_MAX_BLOCKS * sizeof(double),
                                                          cuda_ctx.stream)));
        for (int i = 0; i < m; i++) {
            size_t n = ns[lo + i];
            if (n == 0)
                continue; /* its slot stays 0 */
            if (!xs[lo + i])
                return error_set(FSDP_EINVAL, "kernels cuda: sqnorm_sum: NULL buffer %d", lo + i);
            unsigned blocks = cuda_grid(n);
            if (blocks > SQNORM_MAX_BLOCKS)
                blocks = SQNORM_MAX_BLOCKS;
            double *slice = part + (size_t)i * SQNORM_MAX_BLOCKS;
            sqnorm_partial_kernel<<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>(slice, xs[lo + i], n);
            sqnorm_finish_kernel<<<1, CUDA_THREADS, 0, cuda_ctx.stream>>>(slice, (int)blocks);
        }
        sqnorm_add_slices_kernel<<<1, 1, 0, cuda_ctx.stream>>>(total, part, m, SQNORM_MAX_BLOCKS, lo == 0);
        FSDP_TRY(cuda_check_launch("sqnorm_sum"));
    }
    return 0;
}

__global__ void grad_clip_kernel(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale,
                                 double max_norm)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += sq[i];
    kernels_grad_clip_finish(out, s, loss_scale, max_norm);
}

int cuda_grad_clip(struct kernels_grad_clip *out, const double *sq, int n, double loss_scale, double max_norm)
{
    if (!out || n < 1 || !sq || !(loss_scale > 0))
        return error_set(FSDP_EINVAL, "kernels cuda: grad_clip: NULL argument, %d norms or loss scale %g", n,
                         loss_scale);
    grad_clip_kernel<<<1, 1, 0, cuda_ctx.stream>>>(out, sq, n, loss_scale, max_norm);
    return cuda_check_launch("grad_clip");
}

int cuda_sqnorm(double *result, const float *x, size_t n)
{
    if (!result)
        return error_set(FSDP_EINVAL, "kernels cuda: sqnorm: NULL result");
    *result = 0.0;
    if (n == 0)
        return 0;
    if (!x)
        return error_set(FSDP_EINVAL, "kernels cuda: sqnorm: NULL buffer");
    unsigned blocks = cuda_grid(n);
    if (blocks > SQNORM_MAX_BLOCKS)
        blocks = SQNORM_MAX_BLOCKS;
    void *part;
    FSDP_TRY(cuda_scratch("sqnorm", &part, SQNORM_MAX_BLOCKS * sizeof(double)));
    sqnorm_partial_kernel<<<blocks, CUDA_THREADS, 0, cuda_ctx.stream>>>((double *)part, x, n);
    sqnorm_finish_kernel<<<1, CUDA_THREADS, 0, cuda_ctx.stream>>>((double *)part, (int)blocks);
    FSDP_TRY(cuda_check_launch("sqnorm"));
    FSDP_TRY(cuda_check("sqnorm", cudaMemcpyAsync(cuda_ctx.scalar_host, part, sizeof *result,
                                                  cudaMemcpyDeviceToHost, cuda_ctx.stream)));
    FSDP_TRY(cuda_sync("sqnorm"));
    *result = cuda_ctx.scalar_host[0];
    return 0;
}
