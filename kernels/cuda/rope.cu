/* Rotary position embeddings in place on the head columns of packed rows (kernels.h): one thread per
 * (row, head, pair j), rotating x[j] and x[j + hs/2] by the angle of the row's position. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

__global__ void rope_kernel(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                            float sign)
{
    const int half = hs / 2;
    const size_t per_row = (size_t)nheads * half, total = (size_t)n * per_row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int row = (int)(i / per_row), rem = (int)(i % per_row), h = rem / half, j = rem % half;
        const float *cs = freqs + (size_t)pos[row] * hs;
        const float c = cs[j], s = sign * cs[half + j];
        float *a = x + (size_t)row * ld + (size_t)h * hs + j, *b = a + half;
        const float x1 = *a, x2 = *b;
        *a = x1 * c - x2 * s;
        *b = x2 * c + x1 * s;
    }
}

static int rope_apply(const char *op, float *x, int n, int ld, int nheads, int hs, const int32_t *pos,
                      const float *freqs, int npos, float sign)
{
    if (n < 0 || nheads <= 0 || hs <= 0 || hs % 2 != 0 || ld < nheads * hs || npos <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: %s: bad shape n=%d ld=%d nheads=%d hs=%d npos=%d (hs must "
                                      "be even, ld >= nheads*hs)", op, n, ld, nheads, hs, npos);
    if (n == 0)
        return 0;
    rope_kernel<<<cuda_grid((size_t)n * nheads * (hs / 2)), CUDA_THREADS, 0, cuda_ctx.stream>>>(x, n, ld, nheads,
                                                                                                hs, pos, freqs, sign);
    return cuda_check_launch(op);
}

int cuda_rope_forward(float *x, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs, int npos)
{
    return rope_apply("rope_forward", x, n, ld, nheads, hs, pos, freqs, npos, 1.0f);
}

int cuda_rope_backward(float *dx, int n, int ld, int nheads, int hs, const int32_t *pos, const float *freqs,
                       int npos)
{
    return rope_apply("rope_backward", dx, n, ld, nheads, hs, pos, freqs, npos, -1.0f);
}
