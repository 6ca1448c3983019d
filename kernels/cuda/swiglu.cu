/* SwiGLU over rows [gate | up] (kernels.h): out = silu(gate) * up, one thread per output element. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

template <bool LP> __global__ void swiglu_forward_kernel(float *out, const float *gu, int n, int m, bool gu_lp)
{
    const size_t total = (size_t)n * m;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / m, j = i % m;
        const float g = cuda_act_load(gu, r * 2 * m + j, gu_lp), u = cuda_act_load(gu, r * 2 * m + m + j, gu_lp);
        cuda_act_store(out, i, g / (1.0f + __expf(-g)) * u, LP);
    }
}

/* d/dg silu(g) = s (1 + g (1 - s)), s = sigmoid(g). */
__global__ void swiglu_backward_kernel(float *dgu, const float *gu, const float *dout, int n, int m, bool gu_lp)
{
    const size_t total = (size_t)n * m;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / m, j = i % m;
        const float g = cuda_act_load(gu, r * 2 * m + j, gu_lp), u = cuda_act_load(gu, r * 2 * m + m + j, gu_lp);
        const float d = dout[i];
        const float s = 1.0f / (1.0f + __expf(-g));
        dgu[r * 2 * m + j] += d * u * (s * (1.0f + g * (1.0f - s)));
        dgu[r * 2 * m + m + j] += d * (g * s);
    }
}

int cuda_swiglu_forward(float *out, const float *gu, int n, int m)
{
    if (n < 0 || m <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: swiglu_forward: bad n=%d m=%d", n, m);
    if (n == 0)
        return 0;
    bool lp, gu_lp;
    FSDP_TRY(cuda_act_lowp("swiglu_forward", out, &lp));
    FSDP_TRY(cuda_act_lowp("swiglu_forward", gu, &gu_lp));
    unsigned grid = cuda_grid((size_t)n * m);
    if (lp)
        swiglu_forward_kernel<true><<<grid, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, gu, n, m, gu_lp);
    else
        swiglu_forward_kernel<false><<<grid, CUDA_THREADS, 0, cuda_ctx.stream>>>(out, gu, n, m, gu_lp);
    return cuda_check_launch("swiglu_forward");
}

int cuda_swiglu_backward(float *dgu, const float *gu, const float *dout, int n, int m)
{
    if (n < 0 || m <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: swiglu_backward: bad n=%d m=%d", n, m);
    if (n == 0)
        return 0;
    bool gu_lp;
    FSDP_TRY(cuda_act_lowp("swiglu_backward", gu, &gu_lp));
    swiglu_backward_kernel<<<cuda_grid((size_t)n * m), CUDA_THREADS, 0, cuda_ctx.stream>>>(dgu, gu, dout, n, m, gu_lp);
    return cuda_check_launch("swiglu_backward");
}
