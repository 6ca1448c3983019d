/* Token + position embeddings. Backward is deterministic without sorting or atomics: a thread owns one
 * channel j of every row of dwte (and of dwpe) and walks the tokens in order, so repeated tokens add in
 * a fixed order and no two threads ever write the same element; consecutive threads take consecutive
 * channels, so every read of dout and every update of a dwte row is coalesced. */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                         int rows, int t, int c)
{
    size_t total = (size_t)rows * c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / c), j = (int)(i % c);
        out[i] = wte[(size_t)tokens[r] * c + j] + wpe[(size_t)(r % t) * c + j];
    }
}

/* grid.x covers channels; grid.y = 0 for dwte, 1 for dwpe (independent outputs, run side by side). */
__global__ void embedding_backward_kernel(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                          int rows, int t, int c)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c)
        return;
    if (blockIdx.y == 0) {
        if (!dwte)
            return;
        for (int r = 0; r < rows; r++)
            dwte[(size_t)tokens[r] * c + j] += dout[(size_t)r * c + j];
    } else {
        if (!dwpe)
            return;
        /* Positions are distinct across p: a thread can sum a position over the batch in registers. */
        int b = rows / t;
        for (int p = 0; p < t; p++) {
            float s = 0.0f;
            for (int bi = 0; bi < b; bi++)
                s += dout[((size_t)bi * t + p) * c + j];
            dwpe[(size_t)p * c + j] += s;
        }
    }
}

int cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int b, int t,
                           int c, int vocab)
{
    if (b < 0 || t < 0 || c <= 0 || vocab <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: embedding_forward: bad shape b=%d t=%d c=%d vocab=%d", b, t,
                         c, vocab);
    int rows = b * t;
    FSDP_TRY(cuda_check_ids("embedding_forward", "token", tokens, rows, 0, vocab));
    if (rows == 0)
        return 0;
    embedding_forward_kernel<<<cuda_grid((size_t)rows * c), CUDA_THREADS, 0, cuda_ctx.stream>>>(out, tokens, wte,
                                                                                               wpe, rows, t, c);
    return cuda_check_launch("embedding_forward");
}

int cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int b, int t,
                            int c, int vocab)
{
    if (b < 0 || t < 0 || c <= 0 || vocab <= 0)
        return error_set(FSDP_EINVAL, "kernels cuda: embedding_backward: bad shape b=%d t=%d c=%d vocab=%d", b,
                         t, c, vocab);
    int rows = b * t;
    if (dwte)
        FSDP_TRY(cuda_check_ids("embedding_backward", "token", tokens, rows, 0, vocab));
    if (rows == 0 || (!dwte && !dwpe))
        return 0;
    dim3 grid((c + 127) / 128, 2);
    embedding_backward_kernel<<<grid, 128, 0, cuda_ctx.stream>>>(dwte, dwpe, dout, tokens, rows, t, c);
    return cuda_check_launch("embedding_backward");
}
