/* SwiGLU, Llama's MLP activation: out = silu(gate) * up over rows [gate | up], as the adjacent
 * gate_proj and up_proj weights produce them in one GEMM. silu(g) = g sigmoid(g) = g / (1 + exp(-g)). */
#include "common/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/fastmath.h"

CPU_SIMD_CLONES
static void swiglu_row_forward(float *out, const float *gate, const float *up, int m)
{
#pragma omp simd
    for (int j = 0; j < m; j++) {
        float g = gate[j];
        out[j] = g / (1.0f + fastmath_expf(-g)) * up[j];
    }
}

/* d/dg silu(g) = s (1 + g (1 - s)), s = sigmoid(g). */
CPU_SIMD_CLONES
static void swiglu_row_backward(float *dgate, float *dup, const float *gate, const float *up, const float *dout,
                                int m)
{
#pragma omp simd
    for (int j = 0; j < m; j++) {
        float g = gate[j], s = 1.0f / (1.0f + fastmath_expf(-g)), d = dout[j];
        dgate[j] += d * up[j] * (s * (1.0f + g * (1.0f - s)));
        dup[j] += d * (g * s);
    }
}

int cpu_swiglu_forward(float *out, const float *gu, int n, int m)
{
    if (n < 0 || m <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: swiglu_forward: bad n=%d m=%d", n, m);
#pragma omp parallel for schedule(static) if ((long)n * m > CPU_CHUNK)
    for (int i = 0; i < n; i++)
        swiglu_row_forward(out + (size_t)i * m, gu + (size_t)i * 2 * m, gu + (size_t)i * 2 * m + m, m);
    return 0;
}

int cpu_swiglu_backward(float *dgu, const float *gu, const float *dout, int n, int m)
{
    if (n < 0 || m <= 0)
        return error_set(FSDP_EINVAL, "kernels cpu: swiglu_backward: bad n=%d m=%d", n, m);
#pragma omp parallel for schedule(static) if ((long)n * m > CPU_CHUNK)
    for (int i = 0; i < n; i++) {
        size_t r = (size_t)i * 2 * m;
        swiglu_row_backward(dgu + r, dgu + r + m, gu + r, gu + r + m, dout + (size_t)i * m, m);
    }
    return 0;
}
