/* GELU with GPT-2's tanh approximation (gelu_new), forward and backward. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

template <bool LP> __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_K0 * (x + GELU_K1 * x * x * x));
        cuda_act_store(out, i, 0.5f * x * (1.0f + th), LP);
    }
}

__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_K0 * (x + GELU_K1 * x * x * x));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        dinp[i] += grad * dout[i];
    }
}

int cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n == 0)
        return 0;
    if (!out || !inp)
        return error_set(FSDP_EINVAL, "kernels cuda: gelu_forward: NULL buffer");
    bool lp;
    FSDP_TRY(cuda_act_lowp("gelu_forward", out, &lp));
    if (lp && out == inp) /* a 16-bit element would overwrite half of an fp32 input not read yet */
        return error_set(FSDP_EINVAL, "kernels cuda: gelu_forward: a bf16 activation output cannot alias the input");
    if (lp)
        gelu_forward_kernel<true><<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(out, inp, n);
    else
        gelu_forward_kernel<false><<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(out, inp, n);
    return cuda_check_launch("gelu_forward");
}

int cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (n == 0)
        return 0;
    if (!dinp || !inp || !dout)
        return error_set(FSDP_EINVAL, "kernels cuda: gelu_backward: NULL buffer");
    gelu_backward_kernel<<<cuda_grid(n), CUDA_THREADS, 0, cuda_ctx.stream>>>(dinp, inp, dout, n);
    return cuda_check_launch("gelu_backward");
}
