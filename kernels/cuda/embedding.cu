/* Token + position embeddings (the position table is optional: Llama's positions enter through rope).
 * Backward is parallel over tokens and deterministic: the (token, row) pairs
 * are sorted by token with CUB's radix sort, which is stable, so the rows of a token stay in row order;
 * one block per distinct token then adds that token's rows into its dwte row in that order (threads over
 * channels, coalesced), and no two blocks write the same row. The result is the same bits on every run and
 * the same order of additions as the CPU backend's loop over the rows. dwpe: one thread per (position,
 * channel) adds the position's rows in batch order. An id outside [0, vocab) is skipped by every kernel here and
 * reported by the deferred range check (cuda_check_ids). */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_common.h"

__global__ void embedding_forward_kernel(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                         int rows, int t, int c, int vocab)
{
    size_t total = (size_t)rows * c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(i / c), j = (int)(i % c), tok = tokens[r];
        float e = tok >= 0 && tok < vocab ? wte[(size_t)tok * c + j] : 0.0f;
        out[i] = wpe ? e + wpe[(size_t)(r % t) * c + j] : e;
    }
}

/* keys = tokens (a bad one becomes vocab: sorted last, skipped), values = row numbers. Unsigned keys: the
 * radix sort then looks at their low bits only, with no sign bit to mind. */
__global__ void embedding_pairs_kernel(uint32_t *keys, int32_t *rows_of, const int32_t *tokens, int rows, int vocab)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
        int tok = tokens[i];
        keys[i] = (uint32_t)(tok >= 0 && tok < vocab ? tok : vocab);
        rows_of[i] = i;
    }
}

/* Block b handles the run of equal keys that starts at sorted position b (other blocks return at once). */
__global__ void embedding_dwte_kernel(float *dwte, const float *dout, const uint32_t *keys, const int32_t *rows_of,
                                      int rows, int c, int vocab)
{
    int b = blockIdx.x;
    uint32_t tok = keys[b];
    if (tok >= (uint32_t)vocab || (b > 0 && keys[b - 1] == tok))
        return;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        float acc = dwte[(size_t)tok * c + j];
        for (int k = b; k < rows && keys[k] == tok; k++)
            acc += dout[(size_t)rows_of[k] * c + j];
        dwte[(size_t)tok * c + j] = acc;
    }
}

/* One thread per (position, channel): positions are distinct, so the batch sum needs no coordination. */
__global__ void embedding_dwpe_kernel(float *dwpe, const float *dout, int b, int t, int c)
{
    size_t total = (size_t)t * c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(i / c), j = (int)(i % c);
        float acc = dwpe[i];
        for (int bi = 0; bi < b; bi++)
            acc += dout[((size_t)bi * t + p) * c + j];
        dwpe[i] = acc;
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
    embedding_forward_kernel<<<cuda_grid((size_t)rows * c), CUDA_THREADS, 0, cuda_ctx.stream>>>(
        out, tokens, wte, wpe, rows, t, c, vocab);
    return cuda_check_launch("embedding_forward");
}

/* Scratch layout: keys, sorted keys, rows, sorted rows (rows int32 each, 256-byte aligned), CUB's space. */
static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

static int dwte_sorted(float *dwte, const float *dout, const int32_t *tokens, int rows, int c, int vocab)
{
    int end_bit = 1;
    while (end_bit < 31 && (1 << end_bit) <= vocab) /* keys are in [0, vocab] */
        end_bit++;
    size_t cub_bytes = 0;
    FSDP_TRY(cuda_check("embedding_backward",
                        cub::DeviceRadixSort::SortPairs(NULL, cub_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                                        (const int32_t *)NULL, (int32_t *)NULL, rows, 0, end_bit,
                                                        cuda_ctx.stream)));
    size_t arr = align256((size_t)rows * sizeof(int32_t));
    void *scratch;
    FSDP_TRY(cuda_scratch("embedding_backward", &scratch, 4 * arr + cub_bytes));
    char *base = (char *)scratch;
    uint32_t *keys = (uint32_t *)base, *keys_sorted = (uint32_t *)(base + arr);
    int32_t *rows_of = (int32_t *)(base + 2 * arr), *rows_sorted = (int32_t *)(base + 3 * arr);
    embedding_pairs_kernel<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, cuda_ctx.stream>>>(keys, rows_of, tokens, rows,
                                                                                          vocab);
    FSDP_TRY(cuda_check_launch("embedding_backward"));
    FSDP_TRY(cuda_check("embedding_backward",
                        cub::DeviceRadixSort::SortPairs(base + 4 * arr, cub_bytes, keys, keys_sorted, rows_of,
                                                        rows_sorted, rows, 0, end_bit, cuda_ctx.stream)));
    int threads = c >= 256 ? 256 : (c + 31) / 32 * 32;
    embedding_dwte_kernel<<<rows, threads, 0, cuda_ctx.stream>>>(dwte, dout, keys_sorted, rows_sorted, rows, c,
                                                                 vocab);
    return cuda_check_launch("embedding_backward");
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
    if (rows == 0)
        return 0;
    if (dwte)
        FSDP_TRY(dwte_sorted(dwte, dout, tokens, rows, c, vocab));
    if (dwpe) {
        embedding_dwpe_kernel<<<cuda_grid((size_t)t * c), CUDA_THREADS, 0, cuda_ctx.stream>>>(dwpe, dout, b, t, c);
        FSDP_TRY(cuda_check_launch("embedding_backward"));
    }
    return 0;
}
