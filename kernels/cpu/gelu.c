/* GELU with GPT-2's tanh approximation; tanh goes through the vectorisable exp. */
#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly to +-1 because fastmath_expf clamps. */
static inline float gelu_tanh(float u)
{
    return 1.0f - 2.0f / (fastmath_expf(2.0f * u) + 1.0f);
}

CPU_SIMD_CLONES
static void gelu_chunk_forward(float *out, const float *inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = gelu_tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
        out[i] = 0.5f * x * (1.0f + th);
    }
}

CPU_SIMD_CLONES
static void gelu_chunk_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = gelu_tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
        dinp[i] += grad * dout[i];
    }
}

int cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n && (!out || !inp))
        return error_set(FSDP_EINVAL, "kernels cpu: gelu_forward: NULL buffer");
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        gelu_chunk_forward(out + lo, inp + lo, len);
    }
    return 0;
}

int cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    if (n && (!dinp || !inp || !dout))
        return error_set(FSDP_EINVAL, "kernels cpu: gelu_backward: NULL buffer");
    size_t chunks = (n + CPU_CHUNK - 1) / CPU_CHUNK;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t ch = 0; ch < chunks; ch++) {
        size_t lo = ch * CPU_CHUNK, len = n - lo < CPU_CHUNK ? n - lo : CPU_CHUNK;
        gelu_chunk_backward(dinp + lo, inp + lo, dout + lo, len);
    }
    return 0;
}
